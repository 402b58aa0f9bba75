"""Run each concatenation above XNNPACK's rank limit on (before, joined, after) merged dims.

Invariant established: no ``cat`` with static shapes or one dynamic size has a tensor above
``XNN_MAX_TENSOR_DIMS`` dims; it becomes ``reshape(before, size_i, after)`` of each input -> ``cat``
along dim 1 -> ``reshape`` to the original output shape (folded into neighbouring views by
``FuseHighRankViewsPass``).

Why it is exact: every input of a cat agrees on all dims but the joined one, so the dims before it
and after it index the same rows in every input and can each be one dim.
"""

from __future__ import annotations

import math

import torch

from xnnguard.graph.args import int_arg
from xnnguard.rewrite.rank.base import NEEDS_STATIC_SIZES, MergedCall, MergedDimsPass, Reshaped
from xnnguard.rewrite.rank.sizes import shape_of

__all__ = ["ReduceRankCatPass"]


class ReduceRankCatPass(MergedDimsPass):
    """Runs each high-rank cat on three merged dims; reports the ones it cannot."""

    targets = frozenset({torch.ops.aten.cat.default, torch.ops.aten.concat.default})

    def merged(self, node: torch.fx.Node) -> MergedCall | str:
        inputs = node.args[0]
        assert isinstance(inputs, (list, tuple))  # cat's Tensor[] operand
        output_shape = shape_of(node)
        sized = [(x, shape_of(x)) for x in inputs]
        if output_shape is None or any(shape is None for _, shape in sized):  # None for a non-node too
            return NEEDS_STATIC_SIZES
        rank = len(output_shape)
        dim = int_arg(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % rank
        before, after = math.prod(output_shape[:dim]), math.prod(output_shape[dim + 1 :])
        parts = [
            Reshaped(x, (before, shape[dim], after))  # type: ignore[arg-type]
            for x, shape in sized
            if shape is not None and len(shape) == rank  # an empty 1-D input joins nothing
        ]
        return MergedCall(node.target, (parts, 1))
