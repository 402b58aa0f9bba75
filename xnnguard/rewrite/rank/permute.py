"""Rewrite each permute above XNNPACK's rank limit as reshapes and the fewest transposes within it.

Invariant established: no ``permute``/``transpose`` node with static shapes or one dynamic size has a
tensor above ``XNN_MAX_TENSOR_DIMS`` dims; in its place, ``reshape -> permute (-> reshape -> permute
...) -> reshape`` where every permute is within the limit. The first and last reshapes still touch the
original high-rank shapes; ``FuseHighRankViewsPass`` then folds them into the views around them (the
patchify's ``reshape(8-D) -> permute -> reshape(3-D)`` becomes 5-D -> 6-D permute -> 4-D permute ->
3-D).

Why: ExecuTorch 1.5.1 partitions an 8-D permute to XNNPACK, which cannot define the tensor; with
xnnguard's partitioner it runs on the portable kernel instead, which is slow. Dims that a permute keeps
together merge (``dim_groups.merge_permutation``); what still exceeds the limit is split into
transposes (``dim_groups.permute_steps``).
"""

from __future__ import annotations

import logging

import torch

from xnnguard.graph.args import int_arg, int_list
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.rank.base import (
    HighRankRewritePass,
    first_operand,
    insert_reshape,
    user_kept_out,
)
from xnnguard.rewrite.rank.dim_groups import permute_steps
from xnnguard.rules.rank_limit import XNN_MAX_TENSOR_DIMS, exceeds_rank_limit

__all__ = ["ReduceRankPermutePass", "permutation_of"]

logger = logging.getLogger("xnnguard.rewrite")

_aten = torch.ops.aten
_PERMUTES = {_aten.permute.default, _aten.permute_copy.default}
_TRANSPOSES = {_aten.transpose.int, _aten.transpose_copy.int}


def permutation_of(node: torch.fx.Node) -> tuple[int, ...] | None:
    """The permutation a permute/transpose node applies (dims normalized), or None for other nodes."""
    if node.op != "call_function" or not isinstance(node.args[0], torch.fx.Node):
        return None
    value = node.args[0].meta.get("val")
    if not isinstance(value, torch.Tensor):
        return None
    rank = value.dim()
    if node.target in _PERMUTES:
        return tuple(d % rank for d in int_list(node.args[1]))
    if node.target in _TRANSPOSES:
        a, b = (int_arg(d) % rank for d in node.args[1:3])
        perm = list(range(rank))
        perm[a], perm[b] = perm[b], perm[a]
        return tuple(perm)
    return None


class ReduceRankPermutePass(HighRankRewritePass):
    """Replaces each permute above the rank limit by transposes within it; reports the ones it cannot."""

    def picks(self, node: torch.fx.Node) -> bool:
        perm = permutation_of(node)
        return perm is not None and exceeds_rank_limit(len(perm)) and not user_kept_out(node)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        graph = graph_module.graph
        operand = first_operand(node)
        if isinstance(operand, str):
            return operand
        x, shape, output_shape = operand
        perm = permutation_of(node)
        assert perm is not None
        steps = permute_steps(shape, perm, XNN_MAX_TENSOR_DIMS)
        with graph.inserting_before(node):
            y = x
            for step in steps:
                y = insert_reshape(graph, y, step.input_shape, like=node)
                y = call_like(graph, node, _aten.permute.default, (y, list(step.perm)))
            y = insert_reshape(graph, y, output_shape, like=node)
        node.replace_all_uses_with(y)
        shapes = [step.input_shape for step in steps]
        logger.debug("%s: %d-D permute as %d transposes %s", node.name, len(perm), len(steps), shapes)
        return None
