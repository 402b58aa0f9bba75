"""Graph helpers shared by the rank-reduction passes: read static shapes, insert ATen ops with their meta.

The passes insert plain ATen ops (``aten.reshape``, ``aten.permute`` and the op being reduced) so that
they work on any ATen graph from ``torch.export``: the lifted ``ExportedProgram.graph_module`` and the
unlifted ``ExportedProgram.module()``. Each inserted node gets ``meta["val"]`` computed by running the
op on its inputs' fake values, so later passes, quantizers and the rank checks read real shapes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch
import torch.utils._pytree as pytree

from xnnguard.graph.ops import target_name
from xnnguard.report import KeptOut, Rule
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rules.rank_limit import XNN_MAX_TENSOR_DIMS, exceeds_rank_limit
from xnnguard.rules.tagged import tag_of

__all__ = [
    "LEFT_ABOVE_LIMIT",
    "NEEDS_STATIC_SIZES",
    "VIEW_OPS",
    "HighRankRewritePass",
    "high_rank",
    "insert_op",
    "insert_reshape",
    "left_high_rank",
    "static_input",
    "static_shape",
    "user_kept_out",
]

logger = logging.getLogger("xnnguard.rewrite")

_aten = torch.ops.aten

# Ops that only reinterpret a row-major tensor's shape: the same elements in the same order.
VIEW_OPS = {
    _aten.view.default,
    _aten.reshape.default,
    _aten._unsafe_view.default,
    _aten.view_copy.default,
    _aten.flatten.using_ints,
    _aten.unflatten.int,
    _aten.squeeze.default,
    _aten.squeeze.dim,
    _aten.squeeze.dims,
    _aten.unsqueeze.default,
    _aten.squeeze_copy.default,
    _aten.squeeze_copy.dim,
    _aten.squeeze_copy.dims,
    _aten.unsqueeze_copy.default,
}


def static_shape(value: object) -> tuple[int, ...] | None:
    """The static shape of a node's (single tensor) value, or None if unknown or dynamic."""
    meta = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
    if not isinstance(meta, torch.Tensor):
        return None
    if not all(isinstance(size, int) for size in meta.shape):
        return None
    return tuple(int(size) for size in meta.shape)


# Why a rank reduction leaves a node with a dynamic size: which dims merge depends on the sizes.
NEEDS_STATIC_SIZES = "dynamic shape: merging dims needs static sizes"


def static_input(node: torch.fx.Node) -> tuple[torch.fx.Node, tuple[int, ...], tuple[int, ...]] | str:
    """``node``'s tensor operand (its first argument), that operand's static shape and ``node``'s own,
    or why a rank reduction cannot have them."""
    x = node.args[0]
    shape, output_shape = static_shape(x), static_shape(node)
    if not isinstance(x, torch.fx.Node) or shape is None or output_shape is None:
        return NEEDS_STATIC_SIZES
    return x, shape, output_shape


def high_rank(node: torch.fx.Node) -> bool:
    """True when ``node``'s output, or any tensor input, is above XNNPACK's rank limit."""
    values = [node.meta.get("val")] + [arg.meta.get("val") for arg in node.all_input_nodes]
    return any(
        isinstance(v, torch.Tensor) and exceeds_rank_limit(v.dim()) for v in pytree.tree_leaves(values)
    )


def user_kept_out(node: torch.fx.Node) -> bool:
    """True when someone tagged ``node`` ``DO_NOT_DELEGATE``: a rewrite leaves it as it is, since the
    nodes that would replace it carry no tag and XNNPACK would take them."""
    return bool(tag_of(node))


def insert_op(
    graph: torch.fx.Graph,
    target: object,
    args: Sequence[object],
    kwargs: Mapping[str, object] | None = None,
    like: torch.fx.Node | None = None,
) -> torch.fx.Node:
    """Insert ``target(*args, **kwargs)`` at the graph's insertion point, with its fake ``meta["val"]``
    and ``like``'s provenance (``xnnguard.rewrite.insert``)."""
    return call_like(graph, like, target, args, kwargs)


def insert_reshape(
    graph: torch.fx.Graph, x: torch.fx.Node, shape: Sequence[int], like: torch.fx.Node | None = None
) -> torch.fx.Node:
    """Insert ``aten.reshape(x, shape)``, or return ``x`` if it already has ``shape``.

    ``reshape``, not ``view``: its input may be a permuted (non-contiguous) tensor when the graph runs
    eagerly, as it does under pt2e calibration.
    """
    if static_shape(x) == tuple(shape):
        return x
    return insert_op(graph, _aten.reshape.default, (x, list(shape)), like=like)


LEFT_ABOVE_LIMIT = f"left above {XNN_MAX_TENSOR_DIMS} dims: "  # how every reason of a left node starts


def left_high_rank(node: torch.fx.Node, reason: str) -> KeptOut:
    """The report record of a node left above the rank limit."""
    return KeptOut(node.name, target_name(node), Rule.HIGH_RANK, LEFT_ABOVE_LIMIT + reason)


class HighRankRewritePass(NodeRewritePass):
    """A rank-reduction rewrite: what it leaves is reported as left above the limit, and not tagged here,
    because ``ReduceRankPass`` decides about every node still above the limit once all of them ran."""

    rule = Rule.HIGH_RANK
    tags_what_it_leaves = False

    def record(self, node: torch.fx.Node, reason: str) -> KeptOut:
        return left_high_rank(node, reason)
