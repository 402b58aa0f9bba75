"""Reductions written with the ops XNNPACK 1.5.1 runs: plain PyTorch, traced in by ``splice_before``.

``trailing_sum`` sums trailing dims as a chain of linears against constant vectors (the stages of
``plan.chain_stages``, ``sum_weights``; in float16 each stage scaled by a power of two, see
``xnnguard.rewrite.dtypes``); ``second_moment`` is the mean of squares a float16 form may take without
overflow; ``extremum`` takes a max or min over dims as, for each dim, a
tree of ``maximum``/``minimum`` of two slices along it, halving it each level (the two halves overlap
by one when the length is odd: max and min do not mind seeing an element twice). ``reshape_to`` writes
a dynamic size as ``-1``, the one form of a dynamic reshape XNNPACK takes. None of them merges dims of
its input by a view (``xnnguard.rewrite.reduce.plan`` says why).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

from xnnguard.rewrite.dtypes import HALF_MAX_STAGE, is_half
from xnnguard.rewrite.reduce.plan import MAX_STAGE, chain_stages

__all__ = [
    "HALF_SCALE_FACTOR",
    "HALF_SCALE_FLOOR",
    "Pick",
    "StageRule",
    "contiguous_view",
    "dynamic_rows_mean",
    "dynamic_rows_weights",
    "extremum",
    "reshape_to",
    "second_moment",
    "stage_rule",
    "sum_weights",
    "trailing_sum",
]

# float16 second moments: the scale ``s`` is eight times the mean absolute value, or of this (a row of equal
# values has none): ``s >= 2^-5``, so ``eps/s/s`` is a normal float16 number for every eps of 1e-7 or more.
HALF_SCALE_FLOOR = 2.0**-8
HALF_SCALE_FACTOR = 8.0  # d / s is then about 1/8 where d is typical: its square is far from either end

Pick = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Sizes = Sequence[int | torch.SymInt]


def reshape_to(x: torch.Tensor, sizes: Sizes) -> torch.Tensor:
    """``x.reshape(sizes)``, with the one dynamic size (if there is exactly one) written ``-1``."""
    dynamic = [i for i, size in enumerate(sizes) if not isinstance(size, int)]
    written: list[int | torch.SymInt] = list(sizes)
    if len(dynamic) == 1:
        written[dynamic[0]] = -1
    return x.reshape(written)


def contiguous_view(x: torch.Tensor, sizes: Sizes) -> torch.Tensor:
    """``x`` viewed at ``sizes`` (dims of size 1 dropped or added), then copied contiguous as a reduction's result is.

    The copy costs nothing on XNNPACK, which fuses a copy of an internal value into the op that makes it
    (``xnnguard.rewrite.norm.base.contiguous`` says why it is needed).
    """
    y = x if list(x.shape) == list(sizes) else reshape_to(x, sizes)
    return torch.clone(y, memory_format=torch.contiguous_format)


class StageRule(NamedTuple):
    """How a sum of a dtype is staged: ``limit`` and ``pad`` of ``plan.stages``."""

    limit: int
    pad: bool


def stage_rule(dtype: torch.dtype) -> StageRule:
    """How a sum of ``dtype`` is staged: float16 in short stages, a dim padded to have them (see
    ``xnnguard.rewrite.dtypes``)."""
    return StageRule(HALF_MAX_STAGE, True) if is_half(dtype) else StageRule(MAX_STAGE, False)


def sum_weights(lengths: Sequence[int], scale: float = 1.0, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """The constant vectors of a chain of linears of ``lengths`` whose result is the sum times ``scale``
    (``1/K``: a mean), in ``dtype``.

    float32: ones, the last vector ``scale``. float16: each vector but the last ``2^-ceil(log2 k)`` (a
    power of two: exact), so every partial result is at most the largest input; the last one carries
    the rest of ``scale``, rounded once.
    """
    last = lengths[-1]
    if not is_half(dtype):
        return [torch.ones(1, k, dtype=dtype) for k in lengths[:-1]] + [torch.full((1, last), scale, dtype=dtype)]
    exponents = [math.ceil(math.log2(k)) for k in lengths[:-1]]
    scaled = [torch.full((1, k), 2.0**-e, dtype=dtype) for k, e in zip(lengths[:-1], exponents)]
    return [*scaled, torch.full((1, last), scale * 2.0 ** sum(exponents), dtype=dtype)]


def _drop_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` without its last dim, of size 1 (a view for any strides); kept 2-D for the linears."""
    return reshape_to(t, list(t.shape[:-1]) if t.dim() > 2 else [1, t.shape[0]])


def trailing_sum(t: torch.Tensor, sizes: Sequence[int], weights: Sequence[torch.Tensor],
                 out: Sizes | None = None) -> torch.Tensor:
    """The weighted sum of ``t`` over its trailing dims (of ``sizes``), viewed at ``out``.

    ``out`` defaults to ``t``'s shape with those dims 1 (``keepdim``). ``weights`` are the chain's, as
    ``sum_weights(chain_stages(sizes, *stage_rule(dtype)), scale, dtype)`` makes them (their lengths are the
    stages); a dim of size 1 takes none, a dim its stages overrun is padded with zeros to their length.
    """
    kept = list(t.shape[: t.dim() - len(sizes)])
    lengths = _stage_lengths(sizes, [int(w.shape[-1]) for w in weights])
    total, done = sum(len(stage) for stage in lengths), 0
    for size, stage in zip(reversed(sizes), lengths):
        if size == 1:
            t = _drop_last(t)
            continue
        if math.prod(stage) > size:  # a dim no stages divide: zeros add nothing to the sum
            t = F.pad(t, (0, math.prod(stage) - size))
        for length in stage:
            if t.shape[-1] != length:  # a dim too long for one linear: split it (always a view)
                t = reshape_to(t, [*t.shape[:-1], t.shape[-1] // length, length])
            t = F.linear(t, weights[done])
            done += 1
            if done < total:  # drop the 1 of the linear's output, a fresh tensor
                t = _drop_last(t)
    target = list(out) if out is not None else [*kept, *([1] * len(sizes))]
    return t if list(t.shape) == target else reshape_to(t, target)


def dynamic_rows_weights(inner: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """The constants ``dynamic_rows_mean`` reads: a mean's chain of linears over ``inner`` (none for 1)."""
    return sum_weights(chain_stages((inner,), *stage_rule(dtype)), 1.0 / inner, dtype) if inner > 1 else []


def dynamic_rows_mean(t: torch.Tensor, inner: int, weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """The mean of each ``(R, I)`` plane of a 4-D ``t`` (``R`` dynamic, ``I = inner`` static), kept at ``(.., 1, 1)``.

    No constant vector sums a dynamic length; XNNPACK's global average pooling (a kept mean over dims 2 and
    3 of a 4-D tensor) averages a plane of any size at run time. A linear against ``1/I``
    (``dynamic_rows_weights``) averages the rows first: the bulk of the sum, with no layout change, so the
    pooling's NHWC permute is ``I`` times smaller than ``t``.
    """
    rows = trailing_sum(t, (inner,), weights) if weights else t
    return torch.mean(rows, [2, 3], True)


def _stage_lengths(sizes: Sequence[int], lengths: Sequence[int]) -> list[list[int]]:
    """The stage lengths that sum each of ``sizes`` (the last first), taken in order from ``lengths``."""
    found: list[list[int]] = []
    taken = 0
    for size in reversed(sizes):
        stage: list[int] = []
        while math.prod(stage) < size:
            stage.append(lengths[taken])
            taken += 1
        found.append(stage)
    return found


def shifted_deviations(t: torch.Tensor, count: int,
                       mean: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t - mean(t), mean(t))`` over the last ``count`` dims of ``t``, in float16 without losing the spread.

    The mean is taken of ``t - t0``, ``t0`` the first element of each reduced block: a float16 mean is
    one rounding of ``|mean|`` off (1/K has no exact float16 value, nor the sum), which ``rsqrt`` of a small
    variance magnifies up to ``1/sqrt(eps)`` times, but the mean of ``t - t0`` is off by a rounding of
    the spread only, and a block of equal values has deviations of exactly 0 (PyTorch's float16 norms,
    computed in float32, give such a block exactly its bias).
    """
    origin = t
    for dim in range(t.dim() - count, t.dim()):
        origin = origin.narrow(dim, 0, 1)
    shifted = t - origin
    offset = mean(shifted)
    return shifted - offset, origin + offset


def second_moment(d: torch.Tensor, mean: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, s)`` with ``mean(d * d)`` equal to ``q * s * s``, taken in float16 without overflow.

    ``s = 8 * max(mean(|d|), 2^-8)`` and ``q = mean((d / s)^2)``: ``d / s`` is about 1/8 where ``d`` is
    typical, so its square is a normal float16 number far from overflow (at most ``(K/16)^2``, when one
    element holds all of a row of ``K``), where ``d * d`` overflows from ``|d| = 256``; the floor keeps a
    row of equal values from dividing by zero. ``mean`` is the reduction (``trailing_sum`` with a mean's
    weights).
    """
    scale = torch.clamp(mean(torch.abs(d)), min=HALF_SCALE_FLOOR) * HALF_SCALE_FACTOR
    u = d / scale
    return mean(u * u), scale


def extremum(x: torch.Tensor, dims: Sequence[int], pick: Pick) -> torch.Tensor:
    """``pick`` (``torch.maximum`` or ``torch.minimum``) over ``dims`` of ``x``; each of them becomes 1."""
    for dim in dims:
        length = x.shape[dim]
        before = (slice(None),) * dim
        while length > 1:
            half = (length + 1) // 2
            x = pick(x[(*before, slice(0, half))], x[(*before, slice(length - half, length))])
            length = half
    return x
