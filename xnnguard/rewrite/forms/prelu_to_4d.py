"""A PReLU on a tensor of another rank runs as a 4-D PReLU between two views, so XNNPACK lowers it.

``PReLUTo4dPass`` runs on an ATen program (``XnnpackPartitioner.transform_for_pre_decomposition``).
PReLU scales the negative values of channel ``c`` (dim 1) by ``weight[c]`` (or by its one weight), so
folding every dim after the channels into H and W leaves each value with its channel:
``(N, C, D, H, W)`` runs as ``(N, C, D*H, W)``, ``(N, C, L)`` as ``(N, C, 1, L)``, ``(N, C)`` as
``(N, C, 1, 1)``, and a view brings back the shape (a permuted input is folded by a reshape, a copy).
Views and the 4-D PReLU all go to XNNPACK, which
runs PReLU on 4-D tensors only (``xnnguard.rules.prelu_rank``).

One dynamic dim other than the channels (a batch, a clip's frames) is kept: the views say -1 for it, the
one dim XNNPACK's reshape infers (frames fold into H' or are W').

Postcondition: no PReLU of rank 2, 3 or above 4 whose shape is static but for one dim other than its
channels is left. Other PReLUs (two dynamic dims, dynamic channels, rank 1) are left as they are, for
the partitioner to keep out of XNNPACK.
"""

from __future__ import annotations

import math

import torch

from xnnguard.graph.shapes import shape_with_one_inferred
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rules.prelu_rank import PRELU_RANK, is_prelu, prelu_rank_violation

__all__ = ["PReLUTo4dPass", "folded_shape"]


def folded_shape(shape: list[int]) -> list[int]:
    """The 4-D shape ``(N, C, H', W')`` a PReLU input of ``shape`` (rank >= 2, -1 for one dynamic dim) runs as."""
    batch, channels, *rest = shape
    if not rest:
        return [batch, channels, 1, 1]
    rows = -1 if -1 in rest[:-1] else math.prod(rest[:-1])
    return [batch, channels, rows, rest[-1]]


def _foldable(node: torch.fx.Node) -> bool:
    if not is_prelu(node) or prelu_rank_violation(node) is None:
        return False
    shape = shape_with_one_inferred(node.args[0])
    return shape is not None and len(shape) >= 2 and shape[1] != -1


class PReLUTo4dPass(NodeRewritePass):
    """Rewrites ``prelu(x, w)`` on a non-4-D ``x`` into ``view(prelu(view(x, 4-D), w), x.shape)``."""

    subject = "PReLU"

    def picks(self, node: torch.fx.Node) -> bool:
        return _foldable(node)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        graph = graph_module.graph
        source, weight = node.args[0], node.args[1]
        shape = shape_with_one_inferred(source) or []
        assert len(folded_shape(shape)) == PRELU_RANK
        with graph.inserting_before(node):
            # a view where there is one: a reshape of a dynamic dim computes its size in the graph, outside
            # the delegate; a permuted input has none, and a reshape copies it
            try:
                flat = call_like(graph, node, torch.ops.aten.view.default, (source, folded_shape(shape)))
            except (RuntimeError, ValueError):
                flat = call_like(graph, node, torch.ops.aten.reshape.default, (source, folded_shape(shape)))
            prelu = call_like(graph, node, node.target, (flat, weight))
            result = call_like(graph, node, torch.ops.aten.view.default, (prelu, shape))
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        return None
