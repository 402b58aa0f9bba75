"""What the rank-reduction passes share: which nodes are high-rank, and the reshape -> op -> reshape skeleton.

The passes insert plain ATen ops (``aten.reshape`` and the op being reduced) so that they work on any
ATen graph from ``torch.export``: the lifted ``ExportedProgram.graph_module`` and the unlifted
``ExportedProgram.module()``. Most of them run one op on merged dims: ``MergedDimsPass`` is that
skeleton, and a subclass only says how its op's arguments look on merged dims (``merged``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.utils._pytree as pytree

from xnnguard.graph.ops import target_name
from xnnguard.graph.shapes import tensor_value
from xnnguard.report import KeptOut, Rule
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.sizes import operand_shapes, reshape_sizes, shape_of
from xnnguard.rules.rank_limit import XNN_MAX_TENSOR_DIMS, exceeds_rank_limit
from xnnguard.rules.tagged import tag_of

__all__ = [
    "LEFT_ABOVE_LIMIT",
    "NEEDS_STATIC_SIZES",
    "VIEW_OPS",
    "HighRankRewritePass",
    "MergedCall",
    "MergedDimsPass",
    "Reshaped",
    "first_operand",
    "high_rank",
    "insert_reshape",
    "left_high_rank",
    "sized",
    "tensor_operands",
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

# Why a rank reduction leaves a node whose shape it cannot compute with (``sizes.operand_shapes`` says
# why in more detail where it can).
NEEDS_STATIC_SIZES = "dynamic shape: merging dims needs known sizes"

LEFT_ABOVE_LIMIT = f"left above {XNN_MAX_TENSOR_DIMS} dims: "  # how every reason of a left node starts


def tensor_operands(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The inputs of ``node`` that are tensors (not the ``sym_size`` of a dynamic dim)."""
    return [arg for arg in node.all_input_nodes if tensor_value(arg) is not None]


def sized(node: torch.fx.Node) -> str | None:
    """Why the sizes of ``node`` and its tensor operands cannot be computed with together, or None."""
    shapes = operand_shapes([node, *tensor_operands(node)])
    return shapes if isinstance(shapes, str) else None


def first_operand(node: torch.fx.Node) -> tuple[torch.fx.Node, tuple[int, ...], tuple[int, ...]] | str:
    """``node``'s tensor operand (its first argument), that operand's shape and ``node``'s own (a
    dynamic size as ``sizes.DYNAMIC``), or why a rank reduction cannot have them."""
    x = node.args[0]
    if not isinstance(x, torch.fx.Node):
        return NEEDS_STATIC_SIZES
    why = sized(node)
    if why is not None:
        return why
    shape, output_shape = shape_of(x), shape_of(node)
    if shape is None or output_shape is None:
        return NEEDS_STATIC_SIZES
    return x, shape, output_shape


def high_rank(node: torch.fx.Node) -> bool:
    """True when ``node``'s output, or any tensor input, is above XNNPACK's rank limit."""
    values = [node.meta.get("val")] + [arg.meta.get("val") for arg in node.all_input_nodes]
    return any(isinstance(v, torch.Tensor) and exceeds_rank_limit(v.dim()) for v in pytree.tree_leaves(values))


def user_kept_out(node: torch.fx.Node) -> bool:
    """True when someone tagged ``node`` ``DO_NOT_DELEGATE``: a rewrite leaves it as it is, since the
    nodes that would replace it carry no tag and XNNPACK would take them."""
    return bool(tag_of(node))


def insert_reshape(
    graph: torch.fx.Graph, x: torch.fx.Node, shape: Sequence[int], like: torch.fx.Node | None = None
) -> torch.fx.Node:
    """Insert ``aten.reshape(x, shape)``, or return ``x`` if it already has ``shape``.

    ``shape`` is in the sizes of ``sizes.operand_shapes``: its dynamic size, if any, becomes -1.
    ``reshape``, not ``view``: its input may be a permuted (non-contiguous) tensor when the graph runs
    eagerly, as it does under pt2e calibration.
    """
    if shape_of(x) == tuple(shape):
        return x
    return call_like(graph, like, _aten.reshape.default, (x, reshape_sizes(shape)))


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


@dataclass(frozen=True)
class Reshaped:
    """An operand of a merged op: ``node`` reshaped to ``shape`` first."""

    node: torch.fx.Node
    shape: tuple[int, ...]


@dataclass(frozen=True)
class MergedCall:
    """A high-rank op as it runs on merged dims: ``target(*args, **kwargs)``, each ``Reshaped`` operand
    reshaped first (anywhere in the arguments, a list of a cat's inputs too)."""

    target: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


class MergedDimsPass(HighRankRewritePass):
    """A rank reduction of one op as ``reshape`` of its operands -> the op on merged dims -> ``reshape`` back.

    A subclass names its ops (``targets``) and says how one of them runs on merged dims (``merged``);
    the reshape back to the op's own output shape is folded into neighbouring views later by
    ``FuseHighRankViewsPass``.
    """

    targets: ClassVar[frozenset[Any]] = frozenset()

    def picks(self, node: torch.fx.Node) -> bool:
        targeted = node.op == "call_function" and node.target in self.targets
        return targeted and high_rank(node) and not user_kept_out(node)

    def merged(self, node: torch.fx.Node) -> MergedCall | str:
        """``node`` on merged dims, or why its dims cannot merge within the limit.

        Called once ``sized(node)`` holds: the shapes of ``sizes.shape_of`` are consistent.
        """
        raise NotImplementedError

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        why = sized(node)
        output_shape = shape_of(node)
        if why is not None or output_shape is None:
            return why or NEEDS_STATIC_SIZES
        call = self.merged(node)
        if isinstance(call, str):
            return call
        graph = graph_module.graph

        def reshaped(operand: Reshaped) -> torch.fx.Node:
            return insert_reshape(graph, operand.node, operand.shape, like=node)

        with graph.inserting_before(node):
            args, kwargs = pytree.tree_map_only(Reshaped, reshaped, (call.args, call.kwargs))
            merged = call_like(graph, node, call.target, args, kwargs)
            y = insert_reshape(graph, merged, output_shape, like=node)
        node.replace_all_uses_with(y)
        logger.debug("%s: %s on merged dims %s", node.name, target_name(node), tuple(merged.meta["val"].shape))
        return None
