"""Run each softmax or reduction above XNNPACK's rank limit on (before, reduced, after) merged dims.

Invariant established: no softmax/log-softmax over one dim, and no sum/mean/amax/amin/var over one run
of adjacent dims, with static shapes or one dynamic size, has a tensor above ``XNN_MAX_TENSOR_DIMS``
dims; it becomes ``reshape(before, reduced, after)`` -> the op over the middle dim (``keepdim``) ->
``reshape`` to the original output shape (folded into neighbouring views by ``FuseHighRankViewsPass``).

Why it is exact: such an op treats the dims before and after the reduced ones only as independent
rows, so they can each be one dim; the reduced run becomes one dim of the same elements in the same
order. A softmax over the last dim stays over the last dim, and a mean over the trailing dims becomes
a 4-D mean over dims (2, 3): the forms XNNPACK runs. Reduced dims of size 1 do not count (fuzz seed 88:
an ``amin`` over dims (2, 6) of a 7-D tensor whose dim 2 is 1); reductions over dims that are otherwise
not adjacent are left and reported.
"""

from __future__ import annotations

import math

import torch

from xnnguard.rewrite.rank.base import MergedCall, MergedDimsPass, Reshaped, first_operand

__all__ = ["ReduceRankReductionPass"]

_aten = torch.ops.aten
_SOFTMAXES = {_aten.softmax.int, _aten._softmax.default, _aten.log_softmax.int, _aten._log_softmax.default}
# reduction -> whether ``keepdim`` is its third positional argument (else keyword-only)
_REDUCTIONS = {
    _aten.sum.dim_IntList: True,
    _aten.mean.dim: True,
    _aten.amax.default: True,
    _aten.amin.default: True,
    _aten.var.correction: False,
}


def _reduced_dims(node: torch.fx.Node, rank: int) -> list[int] | None:
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))  # all dims
    if isinstance(dims, int):
        dims = [dims]
    if not isinstance(dims, (list, tuple)):
        return None
    ints = [d for d in dims if isinstance(d, int)]
    if len(ints) != len(dims):
        return None
    return sorted({d % rank for d in ints})


class ReduceRankReductionPass(MergedDimsPass):
    """Runs each high-rank softmax/reduction on three merged dims; reports the ones it cannot."""

    targets = frozenset(_SOFTMAXES | set(_REDUCTIONS))

    def merged(self, node: torch.fx.Node) -> MergedCall | str:
        operand = first_operand(node)
        if isinstance(operand, str):
            return operand
        x, shape, _ = operand
        dims = _reduced_dims(node, len(shape))
        if dims is None:
            return "its dims are not constants"
        if node.target in _SOFTMAXES and len(dims) != 1:
            return "softmax over more than one dim"
        # a dim of size 1 holds one element: reduced or kept, the elements and their order are the same
        dims = [d for d in dims if not (isinstance(shape[d], int) and shape[d] == 1)] or dims[:1]
        if dims != list(range(dims[0], dims[-1] + 1)):
            return f"its reduced dims {dims} are not adjacent"
        before = math.prod(shape[: dims[0]])
        reduced = math.prod(shape[dims[0] : dims[-1] + 1])
        after = math.prod(shape[dims[-1] + 1 :])
        args: list[object] = list(node.args)
        kwargs = dict(node.kwargs)
        new_dim: int | list[int]
        merged_shape: tuple[int, ...]
        if node.target is _aten.mean.dim and after == 1 and kwargs.get("dtype") is None:
            # XNNPACK's global average pooling: a 4-D mean over dims (2, 3), keepdim
            merged_shape, new_dim = (1, before, reduced, 1), [2, 3]
        else:
            merged_shape = (before, reduced) + ((after,) if after != 1 else ())
            new_dim = 1 if node.target in _SOFTMAXES else [1]
        if len(args) > 1:
            args[1] = new_dim
        else:
            kwargs["dim"] = new_dim
        if node.target in _REDUCTIONS:
            if _REDUCTIONS[node.target] and "keepdim" not in kwargs and len(args) > 1:
                args = [*args[:2], True, *args[3:]]
            else:
                kwargs["keepdim"] = True
        args[0] = Reshaped(x, merged_shape)
        return MergedCall(node.target, tuple(args), kwargs)
