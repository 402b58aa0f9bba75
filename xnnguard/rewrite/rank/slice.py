"""Run each slice above XNNPACK's rank limit on (before, sliced, after) merged dims.

Invariant established: no ``slice`` (or ``narrow``) with static shapes or one dynamic size has a tensor
above ``XNN_MAX_TENSOR_DIMS`` dims; it becomes ``reshape(before, size, after)`` -> ``slice`` along dim 1
-> ``reshape`` to the original output shape (folded into neighbouring views by
``FuseHighRankViewsPass``).

Why it is exact: a slice keeps every index of the other dims, so the dims before and after the sliced
one are only rows and columns of it and can each be one dim.
"""

from __future__ import annotations

import math

import torch
from torch.fx.node import Argument

from xnnguard.graph.args import int_arg
from xnnguard.rewrite.rank.base import MergedCall, MergedDimsPass, Reshaped, first_operand
from xnnguard.rewrite.rank.sizes import is_dynamic

__all__ = ["ReduceRankSlicePass"]

_aten = torch.ops.aten
_SLICES = {_aten.slice.Tensor, _aten.slice_copy.Tensor}
_NARROWS = {_aten.narrow.default, _aten.narrow_copy.default}


class ReduceRankSlicePass(MergedDimsPass):
    """Runs each high-rank slice on three merged dims; reports the ones it cannot."""

    targets = frozenset(_SLICES | _NARROWS)

    def merged(self, node: torch.fx.Node) -> MergedCall | str:
        operand = first_operand(node)
        if isinstance(operand, str):
            return operand
        x, shape, _ = operand
        args = list(node.args) + [None] * (5 - len(node.args))
        dim = node.kwargs.get("dim", args[1] if args[1] is not None else 0)
        if not all(isinstance(v, (int, type(None))) for v in (dim, *args[2:])):
            return "its bounds are not constants"
        dim = int_arg(dim) % len(shape)
        if is_dynamic(shape[dim]):
            return "it slices the dynamic dim"
        before, after = math.prod(shape[:dim]), math.prod(shape[dim + 1 :])
        start: Argument
        end: Argument
        step: Argument
        if node.target in _NARROWS:  # narrow(dim, start, length) is slice(dim, start, start + length)
            start = int_arg(args[2]) % shape[dim]
            end, step = start + int_arg(args[3]), 1
        else:
            start = node.kwargs.get("start", args[2])
            end = node.kwargs.get("end", args[3])
            step = node.kwargs.get("step", args[4] if args[4] is not None else 1)
        merged_input = Reshaped(x, (before, shape[dim], after))
        return MergedCall(torch.ops.aten.slice.Tensor, (merged_input, 1, start, end, step))
