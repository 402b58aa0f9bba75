"""Run each concatenation above XNNPACK's rank limit on (before, joined, after) merged dims.

Invariant established: no ``cat`` with static shapes has a tensor above ``XNN_MAX_TENSOR_DIMS`` dims;
it becomes ``reshape(before, size_i, after)`` of each input -> ``cat`` along dim 1 -> ``reshape`` to the
original output shape (folded into neighbouring views by ``FuseHighRankViewsPass``).

Why it is exact: every input of a cat agrees on all dims but the joined one, so the dims before it
and after it index the same rows in every input and can each be one dim.
"""

from __future__ import annotations

import logging
import math

import torch

from xnnguard.graph.args import int_arg
from xnnguard.rewrite.rank.base import (
    NEEDS_STATIC_SIZES,
    HighRankRewritePass,
    high_rank,
    insert_op,
    insert_reshape,
    static_shape,
    user_kept_out,
)

__all__ = ["ReduceRankCatPass"]

logger = logging.getLogger("xnnguard.rewrite")

_aten = torch.ops.aten
_CATS = {_aten.cat.default, _aten.concat.default}


class ReduceRankCatPass(HighRankRewritePass):
    """Runs each high-rank cat on three merged dims; reports the ones it cannot."""

    def picks(self, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and node.target in _CATS and high_rank(node) and not user_kept_out(node)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        graph = graph_module.graph
        inputs = node.args[0]
        assert isinstance(inputs, (list, tuple))  # cat's Tensor[] operand
        output_shape = static_shape(node)
        shapes = [static_shape(x) for x in inputs]
        sized = [(x, shape) for x, shape in zip(inputs, shapes) if isinstance(x, torch.fx.Node) and shape is not None]
        if output_shape is None or len(sized) != len(inputs):  # static_shape is None for a non-node
            return NEEDS_STATIC_SIZES
        rank = len(output_shape)
        dim = int_arg(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % rank
        joined = [(x, shape) for x, shape in sized if len(shape) == rank]
        before, after = math.prod(output_shape[:dim]), math.prod(output_shape[dim + 1 :])
        with graph.inserting_before(node):
            parts = [insert_reshape(graph, x, (before, shape[dim], after), like=node) for x, shape in joined]
            merged = insert_op(graph, node.target, (parts, 1), like=node)
            y = insert_reshape(graph, merged, output_shape, like=node)
        node.replace_all_uses_with(y)
        logger.debug("%s: %d-D cat of %d inputs on 3 merged dims", node.name, rank, len(joined))
        return None
