"""A gather by constant indices along one dim as the slices, repeats and ``cat`` it amounts to.

Invariant established: no ``index.Tensor`` with one constant 1-D integer index (the other dims taken
whole) and no ``index_select`` by a constant 1-D index is left on a floating-point tensor with a static
size along that dim. XNNPACK has no gather: ExecuTorch 1.5.1 ran each on the portable kernel, between
delegates. They come from code that computes its source indices: a 3-D UNet's upsampling to a skip
connection's size (``arange`` -> ``mul`` -> ``floor`` -> ``clamp`` -> ``index``, constants once
``FoldConstantsPass`` ran), a crop written as ``x[:, idx]``, a channel shuffle, a flip.

The form: the indices, read left to right, fall into runs of consecutive sources each repeated the same
number of times (``index_runs``): ``[0, 0, 1, 1, 2]`` is sources 0-1 twice each, then source 2 once. A run
is a ``slice`` of the source, repeated in place (``repeat_interleave``: a size-1 dim after the dim,
multiplied by ``ones`` there, as ``xnnguard.rewrite.views.expand`` does), and the runs are concatenated.
Nearest upsampling by an integer factor is one run; a crop one slice; a flip one slice per element.

Why it is exact: every output element is the source element its index names, moved by slices, reshapes
and ``x * 1.0`` (which is ``x``, NaN and infinities included). int8: the stock quantizer leaves gathers
float; so are the pieces (``pieces_stay_float``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from xnnguard.graph.args import int_arg
from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.constants import constant_value
from xnnguard.rewrite.views.base import AliasAwarePass, replace_by, view_sizes
from xnnguard.rewrite.views.expand import broadcast_form

__all__ = ["MAX_RUNS", "ConstantGatherPass", "Run", "gather_by_runs", "gather_constants", "index_runs"]

_aten = torch.ops.aten
_INDEX = _aten.index.Tensor
_INDEX_SELECT = _aten.index_select.default
MAX_RUNS = 64  # a gather of more runs (a random permutation) is left: so many slices cost more than it saves

Run = tuple[int, int, int]  # (first source, sources, times each is repeated)


def index_runs(indices: Sequence[int]) -> list[Run]:
    """``indices`` as runs of consecutive sources, each source repeated the same number of times in a run."""
    runs: list[Run] = []
    position = 0
    while position < len(indices):
        start = indices[position]
        repeat = 1
        while position + repeat < len(indices) and indices[position + repeat] == start:
            repeat += 1
        count = 1
        while True:
            block = indices[position + count * repeat:position + (count + 1) * repeat]
            if len(block) != repeat or any(i != start + count for i in block):
                break
            count += 1
        runs.append((start, count, repeat))
        position += count * repeat
    return runs


def _repeated_in_place(x: torch.Tensor, dim: int, repeat: int, ones: torch.Tensor | None = None) -> torch.Tensor:
    """``x.repeat_interleave(repeat, dim)`` as a broadcasting multiply: each element's copies adjacent.

    ``ones``: the constant it multiplies by (``gather_constants``); made here (a ``full`` op once traced,
    which a later ``FoldConstantsPass`` folds) when not given.
    """
    shape = list(x.shape)
    repeats = [repeat if d == dim else 1 for d in range(x.dim())]
    view, ones_shape = broadcast_form(shape, repeats, interleave=True)
    shape[dim] = shape[dim] * repeat
    factor = ones if ones is not None else torch.ones(ones_shape, dtype=x.dtype)
    return (x.reshape(view_sizes(view)) * factor).reshape(view_sizes(shape))


def gather_constants(shape: Sequence[int], dim: int, runs: Sequence[Run], dtype: torch.dtype) -> list[torch.Tensor]:
    """The ``ones`` of each repeated run of ``gather_by_runs`` along ``dim`` of a tensor of ``shape``."""
    constants = []
    for _, count, repeat in runs:
        if repeat != 1:
            piece = [count if d == dim else size for d, size in enumerate(shape)]
            _, ones_shape = broadcast_form(piece, [repeat if d == dim else 1 for d in range(len(shape))],
                                           interleave=True)
            constants.append(torch.ones(ones_shape, dtype=dtype))
    return constants


def gather_by_runs(
    x: torch.Tensor, dim: int, runs: Sequence[Run], ones: Iterator[torch.Tensor] | None = None
) -> torch.Tensor:
    """``x`` gathered along ``dim`` by the indices ``runs`` describe.

    ``ones``: the constants ``gather_constants`` made, one taken per repeated run (so that several
    gathers in turn can read them from one iterator); None makes them here.
    """
    pieces = []
    for start, count, repeat in runs:
        piece = x if (start, count) == (0, x.shape[dim]) else x.narrow(dim, start, count)
        if repeat != 1:
            piece = _repeated_in_place(piece, dim, repeat, next(ones) if ones is not None else None)
        pieces.append(piece)
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim)


def _gathered_dim(node: torch.fx.Node) -> tuple[int, object] | None:
    """``(dim, index node)`` of a gather along one dim, or None when ``node`` gathers along several."""
    if node.target is _INDEX_SELECT:
        return int_arg(node.args[1]), node.args[2]
    indices = node.args[1]
    if not isinstance(indices, (list, tuple)):
        return None
    given = [(dim, index) for dim, index in enumerate(indices) if index is not None]
    return given[0] if len(given) == 1 else None


class ConstantGatherPass(AliasAwarePass):
    """Rewrites each gather by constant indices along one dim into slices, in-place repeats and a cat."""

    rule = Rule.NOT_REWRITTEN  # reported; the portable kernels run what is left
    tags_what_it_leaves = False  # untagged: a later pass or the partitioner decides about what is left
    subject = "gather by constant indices"
    pieces_stay_float = True

    def chooses(self, node: torch.fx.Node) -> bool:
        return node.target in (_INDEX, _INDEX_SELECT) and isinstance(node.args[0], torch.fx.Node)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        x = node.args[0]
        assert isinstance(x, torch.fx.Node)
        source = tensor_value(x)
        if source is None or not source.dtype.is_floating_point:
            return "its source is not a floating-point tensor (XNNPACK multiplies floating-point ones)"
        found = _gathered_dim(node)
        if found is None:
            return "it gathers along several dims at once"
        dim, index_node = found
        dim %= source.dim()
        size = source.shape[dim]
        if not isinstance(size, int):
            return "the gathered dim has a dynamic size"
        index = constant_value(graph_module, index_node)
        if index is None:
            return "its indices are computed at run time"
        if index.dtype not in (torch.int64, torch.int32) or index.dim() != 1 or index.numel() == 0:
            return "its index is not a non-empty 1-D integer tensor"
        if bool(((index < -size) | (index >= size)).any()):
            return "an index is out of range"
        runs = index_runs((index % size).tolist())
        if len(runs) > MAX_RUNS:
            return f"its indices fall into {len(runs)} runs (more than {MAX_RUNS} slices)"
        if len(runs) == 1 and runs[0][2] == 1 and self.aliasing.is_written(node):
            return "an in-place op writes its result, which as a slice would be a view of the source"
        replace_by(graph_module, node, lambda v: gather_by_runs(v, dim, runs), [x])
        return None
