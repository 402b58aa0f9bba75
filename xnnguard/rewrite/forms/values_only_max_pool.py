"""A 2-D max pooling whose indices nobody reads is written ``max_pool2d``, the form XNNPACK lowers.

``F.max_pool2d(x, ..., return_indices=True)[0]`` exports as ``max_pool2d_with_indices`` (with an unread
``getitem(node, 1)``), and ExecuTorch 1.5.1's ``MaxPool2dConfig`` takes ``max_pool2d.default`` only: the
pooling stayed on portable kernels and cut the program in two (fuzz seeds 138 and 156, stock too).
``max_pool2d`` is the same op without the indices, so the values are the same.

Postcondition: no ``max_pool2d_with_indices`` whose indices nobody reads is left; one whose indices are
read stays, for the partitioner to keep out of XNNPACK.
"""

from __future__ import annotations

import torch

from xnnguard.graph.ops import values_only_users
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.node_rewrite import NodeRewritePass

__all__ = ["ValuesOnlyMaxPoolPass"]

_aten = torch.ops.aten


class ValuesOnlyMaxPoolPass(NodeRewritePass):
    """Rewrites ``max_pool2d_with_indices(x, ...)[0]``, its indices unread, into ``max_pool2d(x, ...)``."""

    subject = "2-D max pooling with indices"

    def picks(self, node: torch.fx.Node) -> bool:
        return (
            node.op == "call_function"
            and node.target is _aten.max_pool2d_with_indices.default
            and values_only_users(node) is not None
        )

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        graph = graph_module.graph
        with graph.inserting_before(node):
            values = call_like(graph, node, _aten.max_pool2d.default, node.args, node.kwargs)
        for getitem in list(node.users):
            getitem.replace_all_uses_with(values)
            graph.erase_node(getitem)
        graph.erase_node(node)
        return None
