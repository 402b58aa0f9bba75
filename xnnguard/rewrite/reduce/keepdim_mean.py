"""A mean over H and W of a 4-D tensor keeps its dims, so XNNPACK runs it as global average pooling.

Invariant established: every float32 or float16 ``mean`` over dims (2, 3) of a 4-D tensor is written
``mean(x, [2, 3], True)`` (``keepdim`` positional, as ``MeanDimConfig`` reads it), followed by a view to
the original result when ``keepdim`` was False: ``x.mean((2, 3))``, ``x.mean((-2, -1))`` and
``torch.mean(x, dim=[2, 3], keepdim=True)`` all lower as XNNPACK's global average pooling. 1.5.1's config
refuses the same mean without ``keepdim`` or with ``keepdim`` given by keyword, and the op ran on
portable kernels. Exact: the same op, and a view.

int8: a mean and a view are both share ops of the stock XNNPACK quantizer, so the pieces are
quantized as the original mean is (its input's scale), with no rounding of their own.
"""

from __future__ import annotations

import torch

from xnnguard.graph.args import schema_arguments
from xnnguard.graph.shapes import tensor_value
from xnnguard.rewrite.dtypes import rewritten_float
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import user_kept_out
from xnnguard.rewrite.reduce.plan import reduced_dims

__all__ = ["MeanKeepdimPass", "is_mean_over_height_and_width"]

_aten = torch.ops.aten


def is_mean_over_height_and_width(node: torch.fx.Node) -> bool:
    """A float32 or float16 mean over dims (2, 3) of a 4-D tensor, however written: XNNPACK's global average
    pooling (in float16 it sums in float32 on every CPU, ``f16_f32acc_rsum``, as PyTorch's own mean does)."""
    if node.op != "call_function" or node.target is not _aten.mean.dim:
        return False
    arguments = schema_arguments(node) or {}
    x, out = tensor_value(arguments.get("input")), tensor_value(node)
    if x is None or out is None or x.dim() != 4 or not rewritten_float(x.dtype) or arguments.get("dtype") is not None:
        return False
    return reduced_dims(arguments.get("dim"), 4) == [2, 3]


class MeanKeepdimPass(NodeRewritePass):
    """Rewrites a 4-D mean over (2, 3) not written as XNNPACK takes it into ``mean(x, [2, 3], True)`` (+ a view)."""

    subject = "mean over H and W"
    # rule None and pieces quantized as the original: every mean it picks it rewrites

    def picks(self, node: torch.fx.Node) -> bool:
        if not is_mean_over_height_and_width(node) or user_kept_out(node):
            return False
        dims = node.args[1] if len(node.args) > 1 else None
        keepdim = len(node.args) > 2 and node.args[2] is True
        return not (keepdim and isinstance(dims, (list, tuple)) and list(dims) == [2, 3])

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        graph = graph_module.graph
        x = node.args[0]
        with graph.inserting_before(node):
            pooled = call_like(graph, node, _aten.mean.dim, (x, [2, 3], True))
            result = pooled
            if tuple(pooled.meta["val"].shape) != tuple(node.meta["val"].shape):
                sizes = [-1 if not isinstance(s, int) else s for s in node.meta["val"].shape]
                result = call_like(graph, node, _aten.reshape.default, (pooled, sizes))
        node.replace_all_uses_with(result)
        return None
