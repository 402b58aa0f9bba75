"""A max over H or W of a 4-D tensor keeps its dim, written 2 or 3, so XNNPACK lowers it.

``MaxKeepdimPass`` runs on an ATen program (``XnnpackPartitioner.transform_for_pre_decomposition``).
It rewrites ``torch.max(x, dim)[0]`` whose form XNNPACK 1.5.1 refuses (``keepdim=False``, ``dim=-1``;
see ``xnnguard.rules.max_reduction``) into ``max(x, 2 or 3, keepdim=True)[0]`` followed by a view to the
original result shape: the same values, and a max pooling plus a reshape that XNNPACK both runs.

Postcondition: every values-only ``max.dim`` over H or W of a statically shaped 4-D tensor is in the
form XNNPACK takes. Others (indices used, another dim, dynamic shapes) are left as they are, for the
partitioner to keep out of XNNPACK.
"""

from __future__ import annotations

import operator

import torch

from xnnguard.graph.ops import values_only_users
from xnnguard.graph.shapes import static_shape
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rules.max_reduction import (
    is_max_dim,
    max_dim_arguments,
    max_over_height_or_width,
    max_reduction_violation,
)

__all__ = ["MaxKeepdimPass"]


def _rewritable(node: torch.fx.Node) -> bool:
    if not is_max_dim(node) or max_reduction_violation(node) is None or values_only_users(node) is None:
        return False
    source, dim, _ = max_dim_arguments(node)
    shape = static_shape(source)
    return shape is not None and max_over_height_or_width(len(shape), dim) is not None


class MaxKeepdimPass(NodeRewritePass):
    """Rewrites ``max(x, dim)[0]`` over H or W of a 4-D tensor into ``view(max(x, 2|3, keepdim=True)[0])``."""

    subject = "max over a dim"

    def picks(self, node: torch.fx.Node) -> bool:
        return _rewritable(node)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        graph = graph_module.graph
        source, dim, _ = max_dim_arguments(node)
        assert isinstance(source, torch.fx.Node)
        pooled = max_over_height_or_width(source.meta["val"].dim(), dim)
        values_shape = list(node.meta["val"][0].shape)  # static: _rewritable checked the input
        with graph.inserting_before(node):
            kept = call_like(graph, node, torch.ops.aten.max.dim, (source, pooled, True))
            result = call_like(graph, node, operator.getitem, (kept, 0))
            if list(result.meta["val"].shape) != values_shape:  # keepdim was False
                result = call_like(graph, node, torch.ops.aten.view.default, (result, values_shape))
        for getitem in list(node.users):
            getitem.replace_all_uses_with(result)
            graph.erase_node(getitem)
        graph.erase_node(node)
        return None
