"""Fold every inference BatchNorm3d that follows a 3-D convolution into that convolution.

Invariant established: no inference batch norm whose input is a 3-D convolution it alone reads is left;
its scale and shift are in the convolution's weight and bias. Once the convolution is rewritten as 2-D
ops a batch norm behind it would sit on a 5-D tensor, which XNNPACK neither fuses nor decomposes, and
pt2e would no longer fold it either: folding first keeps the whole block one delegated conv2d.
"""

from __future__ import annotations

import logging

import torch
from torch.fx.node import Argument

from xnnguard.rewrite.attributes import attribute_tensor
from xnnguard.rewrite.batch_norm.base import output_node
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rules.conv3d import ConvKind, conv3d_kind

__all__ = ["FoldBatchNorm3dPass"]

logger = logging.getLogger("xnnguard.rewrite")

_aten = torch.ops.aten
# (op, index of eps, index of the "training" flag or None when the op is inference-only)
_BATCH_NORMS = {
    _aten.batch_norm.default: (7, 5),
    _aten._native_batch_norm_legit_no_training.default: (6, None),
}


def _statistic(graph_module: torch.fx.GraphModule, arg: Argument) -> torch.Tensor | None:
    """A ``Tensor?`` operand of a batch norm as a tensor: None when absent or not a constant of the module."""
    if isinstance(arg, torch.fx.Node):
        return attribute_tensor(graph_module, arg)
    return arg if isinstance(arg, torch.Tensor) else None


class FoldBatchNorm3dPass(NodeRewritePass):
    """Folds ``conv3d -> batch_norm (eval)`` into one 3-D convolution with a new weight and bias."""

    def picks(self, node: torch.fx.Node) -> bool:
        spec = _BATCH_NORMS.get(node.target) if node.op == "call_function" else None  # type: ignore[call-overload]
        if spec is None:
            return False
        _, training_index = spec
        if training_index is not None and node.args[training_index]:
            return False
        conv = node.args[0]
        return (
            isinstance(conv, torch.fx.Node)
            and conv3d_kind(conv) is ConvKind.CONV3D
            and len(conv.users) == 1
            and output_node(node) is not None
        )

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        # Optional: a batch norm left unfolded is run on a 4-D view by RewriteBatchNorm3dPass instead.
        return None if self._fold(graph_module, node) else "its statistics or the conv's weights are not constants"

    @staticmethod
    def _fold(graph_module: torch.fx.GraphModule, batch_norm: torch.fx.Node) -> bool:
        conv = batch_norm.args[0]
        assert isinstance(conv, torch.fx.Node)
        eps_index, _ = _BATCH_NORMS[batch_norm.target]  # type: ignore[index]
        gamma, beta, mean, var = (_statistic(graph_module, a) for a in batch_norm.args[1:5])
        weight = attribute_tensor(graph_module, conv.args[1])
        bias_node = conv.args[2] if len(conv.args) > 2 else conv.kwargs.get("bias")
        bias = attribute_tensor(graph_module, bias_node) if isinstance(bias_node, torch.fx.Node) else None
        if weight is None or mean is None or var is None or (bias_node is not None and bias is None):
            return False
        eps = float(batch_norm.args[eps_index])  # type: ignore[arg-type]
        with torch.no_grad():
            scale = torch.rsqrt(var + eps)
            if gamma is not None:
                scale = scale * gamma
            new_weight = weight * scale.reshape(-1, 1, 1, 1, 1)
            new_bias = ((bias if bias is not None else torch.zeros_like(mean)) - mean) * scale
            if beta is not None:
                new_bias = new_bias + beta
        base = f"_xnnguard_{conv.name}_bn"
        graph_module.register_parameter(f"{base}_weight", torch.nn.Parameter(new_weight, requires_grad=False))
        graph_module.register_parameter(f"{base}_bias", torch.nn.Parameter(new_bias, requires_grad=False))
        with graph_module.graph.inserting_before(conv):
            new_weight_node = graph_module.graph.get_attr(f"{base}_weight")
            new_bias_node = graph_module.graph.get_attr(f"{base}_bias")
        new_weight_node.meta["val"] = new_weight
        new_bias_node.meta["val"] = new_bias
        args = list(conv.args)
        args[1] = new_weight_node
        if len(args) > 2:
            args[2] = new_bias_node
        else:
            args.append(new_bias_node)
        conv.args = tuple(args)
        conv.kwargs = {k: v for k, v in conv.kwargs.items() if k != "bias"}
        output = output_node(batch_norm)
        assert output is not None
        output.replace_all_uses_with(conv)
        logger.debug("%s folded into %s", batch_norm.name, conv.name)
        return True
