"""Fold an inference batch norm behind a grouped transposed convolution into that convolution.

Invariant established: no inference batch norm reads a grouped transposed convolution (1-, 2- or 3-D,
``groups > 1``) that it alone reads, when the batch norm's statistics and the convolution's weights are
constants. ExecuTorch 1.5.1's ``FuseBatchNormPass`` (inside the XNNPACK delegate) and torchao's
``prepare_pt2e`` both fold such a pair with ``torch.nn.utils.fusion.fuse_conv_bn_weights``, which reads a
transposed weight ``(in, out / groups, k...)`` as if its dim 1 held all ``out`` channels: the lowering,
or the quantization, fails (``The size of tensor a (3) must match the size of tensor b (6)``), stock too.

The fold done right: output channel ``g * (out / groups) + j`` is column ``j`` of group ``g``'s rows of
the weight, so the scale is applied to the weight seen as ``(groups, in / groups, out / groups, k...)``;
the bias becomes ``(bias - mean) * scale + beta``. Exact up to float rounding (the scale is applied
once, to the weight); in int8 the folded weight is what is quantized, as pt2e does for an ungrouped pair.
"""

from __future__ import annotations

import logging

import torch
from torch.fx.operator_schemas import normalize_function

from xnnguard.rewrite.attributes import attribute_tensor, constant_attribute
from xnnguard.rewrite.batch_norm.base import channel_affine, inference_batch_norm, output_node
from xnnguard.rewrite.node_rewrite import NodeRewritePass

__all__ = ["FoldBatchNormIntoGroupedTransposedConvPass", "fold_into_grouped_transposed"]

logger = logging.getLogger("xnnguard.rewrite")

_aten = torch.ops.aten
_TRANSPOSED = {
    _aten.conv_transpose1d.default,
    _aten.conv_transpose2d.input,
    _aten.conv_transpose3d.input,
    _aten.convolution.default,
}


def _arguments(conv: torch.fx.Node) -> dict[str, object] | None:
    normalized = normalize_function(conv.target, conv.args, conv.kwargs, normalize_to_only_use_kwargs=True)  # type: ignore[arg-type]
    return None if normalized is None else dict(normalized.kwargs)


def _grouped_transposed(node: object) -> bool:
    """True for a transposed convolution with more than one group."""
    if getattr(node, "op", None) != "call_function" or node.target not in _TRANSPOSED:  # type: ignore[attr-defined]
        return False
    arguments = _arguments(node)  # type: ignore[arg-type]
    if arguments is None:
        return False
    if node.target is _aten.convolution.default and not arguments.get("transposed"):  # type: ignore[attr-defined]
        return False
    groups = arguments.get("groups", 1)
    return isinstance(groups, int) and groups > 1


def fold_into_grouped_transposed(
    weight: torch.Tensor, bias: torch.Tensor | None, groups: int, scale: torch.Tensor, shift: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight and bias of ``batch_norm(conv_transpose(x, weight, bias, groups=groups))`` in one conv.

    ``scale`` and ``shift`` are the batch norm's per-channel map (``x * scale + shift``), one per output
    channel; ``weight`` is ``(in, out / groups, k...)``.
    """
    c_in, per_group, *kernel = weight.shape
    grouped = weight.double().reshape(groups, c_in // groups, per_group, *kernel)
    scaled = grouped * scale.reshape(groups, 1, per_group, *([1] * len(kernel)))
    new_bias = (bias.double() if bias is not None else torch.zeros_like(shift)) * scale + shift
    return scaled.reshape(weight.shape).to(weight.dtype), new_bias.to(weight.dtype)


class FoldBatchNormIntoGroupedTransposedConvPass(NodeRewritePass):
    """Folds ``conv_transpose(groups > 1) -> batch_norm (eval)`` into one transposed conv with a new weight and bias."""

    def picks(self, node: torch.fx.Node) -> bool:
        conv = node.args[0] if inference_batch_norm(node) else None
        return isinstance(conv, torch.fx.Node) and _grouped_transposed(conv) and len(conv.users) == 1

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        # Optional (no rule): a pair whose weights are computed is not folded by 1.5.1 either.
        conv = node.args[0]
        assert isinstance(conv, torch.fx.Node)
        arguments = _arguments(conv)
        assert arguments is not None
        affine = channel_affine(graph_module, node)
        weight = attribute_tensor(graph_module, arguments.get("weight"))
        bias_arg = arguments.get("bias")
        bias = attribute_tensor(graph_module, bias_arg)
        if affine is None or weight is None or (bias_arg is not None and bias is None):
            return "its statistics or the convolution's weights are not constants"
        new_weight, new_bias = fold_into_grouped_transposed(
            weight, bias, int(arguments["groups"]), affine.scale, affine.shift  # type: ignore[call-overload]
        )
        with graph_module.graph.inserting_before(conv):
            weight_node = constant_attribute(graph_module, f"{conv.name}_bn_weight", new_weight)
            bias_node = constant_attribute(graph_module, f"{conv.name}_bn_bias", new_bias)
        arguments["weight"], arguments["bias"] = weight_node, bias_node
        conv.args, conv.kwargs = tuple(arguments.values()), {}  # type: ignore[arg-type]  # schema order
        out = output_node(node)
        assert out is not None
        out.replace_all_uses_with(conv)
        logger.debug("%s folded into %s", node.name, conv.name)
        return None
