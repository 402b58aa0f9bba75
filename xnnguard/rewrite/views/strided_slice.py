"""Slices with a step above 1 as a reshape and a unit-step slice (``x[..., ::2, :]``).

Invariant established: no ``slice`` with a constant step above 1 along a dim of static size is left.
ExecuTorch 1.5.1's XNNPACK partitioner takes slices of step 1 only; Swin's ``PatchMerging``
(``x[..., 0::2, 0::2, :]`` and its three siblings) left 8 strided slices per merge on the portable kernels.

The form (``xnnguard.rewrite.conv3d.strided_select.select_every``, which the 3-D rewrites use too): the
tensor as (before, n, after); ``step`` consecutive slices viewed as one row and the first of each kept
(a reshape and a unit-step slice); a last element that would read past the end taken on its own and
concatenated; then a reshape to the slice's own shape. The same elements in the same order: exact.

int8: ``slice``, ``reshape`` and ``cat`` are share ops of the XNNPACK quantizer, as the original strided
slice is: every piece takes its input's quantization, which rounds nothing new. (Kept float, the pieces
would hand the consumer a subset of the values, which it would observe at a scale of its own: a
rounding the original does not have.)
"""

from __future__ import annotations

import math

import torch

from xnnguard.graph.args import int_arg
from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.conv3d.strided_select import select_every
from xnnguard.rewrite.views.base import AliasAwarePass, replace_by, view_sizes

__all__ = ["StridedSliceAsReshapePass", "strided_slice"]

_aten = torch.ops.aten
_END = 2**63 - 1


def strided_slice(x: torch.Tensor, dim: int, start: int, count: int, step: int) -> torch.Tensor:
    """``x`` sliced along ``dim`` at ``start, start + step, ...`` (``count`` of them), from views and unit slices."""
    shape = list(x.shape)
    after = math.prod(shape[dim + 1 :])
    rows = x.reshape(-1, shape[dim], after)
    picked = select_every(rows, start, step, count)
    return picked.reshape(view_sizes([*shape[:dim], count, *shape[dim + 1 :]]))


class StridedSliceAsReshapePass(AliasAwarePass):
    """Rewrites each slice with a step above 1 into reshapes and unit-step slices."""

    rule = Rule.NOT_REWRITTEN  # reported; the portable kernels run what is left
    tags_what_it_leaves = False  # untagged: XNNPACK still takes what it can of the op as it is
    subject = "strided slice"

    def chooses(self, node: torch.fx.Node) -> bool:
        if node.target is not _aten.slice.Tensor or self.aliasing.written_after(node):
            return False
        step = node.args[4] if len(node.args) > 4 else node.kwargs.get("step", 1)
        return isinstance(step, int) and step > 1

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        x = node.args[0]
        value = tensor_value(x)
        if value is None or not isinstance(x, torch.fx.Node):
            return "its input is not a tensor"
        args = list(node.args) + [None] * (5 - len(node.args))
        dim = int_arg(args[1] if args[1] is not None else 0) % value.dim()
        size = value.shape[dim]
        start, end, step = args[2], args[3], int_arg(args[4])
        if not isinstance(size, int) or not all(isinstance(v, (int, type(None))) for v in (start, end)):
            return "a dynamic size or bounds"
        if any(not isinstance(s, int) for s in value.shape[dim + 1 :]):
            return "a dynamic size after the sliced dim"
        first, stop, _ = slice(start, _END if end is None else end, step).indices(size)
        count = len(range(first, stop, step))
        if count == 0:
            return "it is empty"
        replace_by(graph_module, node, lambda v: strided_slice(v, dim, first, count, step), [x])
        return None
