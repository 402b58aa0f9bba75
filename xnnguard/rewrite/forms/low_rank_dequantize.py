"""A dequantize above 6 dims whose readers are views to at most 6 dims dequantizes after the views.

A model whose input has 7 or 8 dims reaches its first linear through a reshape to fewer dims; quantized,
that is ``q -> dq -> view -> linear``, with the dq at the input's rank. XNNPACK takes no tensor above 6 dims,
so the dq stays outside, and the linear, whose match needs its dq, went with it: the program's only
compute ran on portable kernels (fuzz seeds 106, 111 and 170 in static int8).

A per-tensor dequantize is elementwise, so it commutes with a view: ``view(dq(q))`` is ``dq(view(q))``
exactly, the view moving int8 values instead of floats. Each view then reads the quantized tensor (outside,
as the high-rank view was) and a dq of its own at the lower rank joins the linear's partition.

Postcondition: no per-tensor dequantize above 6 dims is read only by views to at most 6 dims.
"""

from __future__ import annotations

import torch

from xnnguard.graph.ops import is_op
from xnnguard.graph.shapes import tensor_value
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rules.rank_limit import exceeds_rank_limit
from xnnguard.rules.tagged import untagged_meta

__all__ = ["LowRankDequantizePass"]

_VIEWS = frozenset({"view", "reshape", "_unsafe_view", "view_copy"})


def _rank(node: object) -> int | None:
    value = tensor_value(node)
    return value.dim() if value is not None else None


def _lowering_views(dequantize: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The readers of ``dequantize``, when each is a view of it to at most 6 dims; else None."""
    users = list(dequantize.users)
    for user in users:
        rank = _rank(user)
        if not is_op(user, _VIEWS) or user.args[0] is not dequantize or rank is None or exceeds_rank_limit(rank):
            return None
    return users or None


class LowRankDequantizePass(NodeRewritePass):
    """Moves the views to at most 6 dims of a high-rank per-tensor dequantize in front of it."""

    subject = "dequantize above 6 dims"

    def picks(self, node: torch.fx.Node) -> bool:
        rank = _rank(node)
        return (
            is_op(node, "dequantize_per_tensor", "default")
            and rank is not None
            and exceeds_rank_limit(rank)
            and isinstance(node.args[0], torch.fx.Node)
            and _lowering_views(node) is not None
        )

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        views = _lowering_views(node)
        assert views is not None
        graph = graph_module.graph
        quantized = node.args[0]
        assert isinstance(quantized, torch.fx.Node)
        for view in views:
            with graph.inserting_before(view):
                moved = graph.create_node("call_function", view.target, (quantized, *view.args[1:]), dict(view.kwargs))
                own = graph.create_node("call_function", node.target, (moved, *node.args[1:]), dict(node.kwargs))
            value = tensor_value(view)
            assert value is not None
            moved.meta = dict(view.meta)
            moved.meta["val"] = value.to(tensor_value(quantized).dtype)  # type: ignore[union-attr]
            own.meta = untagged_meta(view.meta)  # the view's reason (its input's rank) is not the dq's
            view.replace_all_uses_with(own)
            graph.erase_node(view)
        graph.erase_node(node)
        return None
