"""Merge an inference batch norm that reads another one into a single batch norm.

Invariant established: no inference batch norm reads the output of another inference batch norm whose
statistics and parameters are constants. ExecuTorch 1.5.1's ``DecomposeBatchNorm`` (run when the XNNPACK
delegate is built) replaces each batch norm of a partition by a depthwise convolution and computes the
new nodes' shapes only once it is done; the second of two batch norms in a row then reads a node without
a shape, and the lowering fails (``KeyError: 'val'``, stock too). Two per-channel affine maps in a row
are one: the merged batch norm has weight ``s2 * s1``, bias ``s2 * t1 + t2``, mean 0, variance 1 and
eps 0, so it computes ``x * s + t`` (one rounding where there were two). int8: the XNNPACK quantizer
leaves a batch norm of its own float, so the merged one stays float too.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from xnnguard.rewrite.batch_norm.base import channel_affine, inference_batch_norm, output_node
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass

__all__ = ["MergeBatchNormsPass"]

logger = logging.getLogger("xnnguard.rewrite")


def _source_batch_norm(node: torch.fx.Node) -> torch.fx.Node | None:
    """The inference batch norm whose output ``node`` (a batch norm) normalizes, if it reads one."""
    x = node.args[0]
    if not isinstance(x, torch.fx.Node):
        return None
    for source in (x, x.args[0] if x.args else None):  # batch_norm itself, or getitem(native batch norm, 0)
        if isinstance(source, torch.fx.Node) and inference_batch_norm(source) and output_node(source) is x:
            return source
    return None


class MergeBatchNormsPass(NodeRewritePass):
    """Replaces ``batch_norm(batch_norm(x))`` (both eval) by one ``batch_norm(x)``."""

    pieces_stay_float = True  # the XNNPACK quantizer leaves a batch norm of its own float

    def picks(self, node: torch.fx.Node) -> bool:
        return inference_batch_norm(node) and _source_batch_norm(node) is not None

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        # Optional (no rule): batch norms whose statistics are computed are not decomposed by 1.5.1 either.
        source = _source_batch_norm(node)
        assert source is not None
        first, second = channel_affine(graph_module, source), channel_affine(graph_module, node)
        if first is None or second is None:
            return "their statistics or parameters are not constants"
        merged = first.then(second)
        x = source.args[0]
        assert isinstance(x, torch.fx.Node)
        dtype = x.meta["val"].dtype
        weight, bias = merged.scale.to(dtype), merged.shift.to(dtype)
        mean, var = torch.zeros_like(weight), torch.ones_like(weight)

        def replacement(
            x_: torch.Tensor, weight_: torch.Tensor, bias_: torch.Tensor, mean_: torch.Tensor, var_: torch.Tensor
        ) -> torch.Tensor:
            return F.batch_norm(x_, mean_, var_, weight_, bias_, False, 0.0, 0.0)

        output = splice_before(graph_module, node, replacement, [x, weight, bias, mean, var])
        out = output_node(node)
        assert out is not None
        out.replace_all_uses_with(output)
        logger.debug("%s merged with %s", node.name, source.name)
        return None
