"""Reductions written with the ops XNNPACK 1.5.1 runs: plain PyTorch, traced in by ``splice_before``.

``trailing_sum`` sums trailing dims as a chain of linears against constant vectors (the stages of
``plan.chain_stages``, ``sum_weights``); ``extremum`` takes a max or min over dims as, for each dim, a
tree of ``maximum``/``minimum`` of two slices along it, halving it each level (the two halves overlap
by one when the length is odd: max and min do not mind seeing an element twice). ``reshape_to`` writes
a dynamic size as ``-1``, the one form of a dynamic reshape XNNPACK takes. None of them merges dims of
its input by a view (``xnnguard.rewrite.reduce.plan`` says why).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from xnnguard.rewrite.reduce.plan import stages

__all__ = ["Pick", "contiguous_view", "extremum", "reshape_to", "sum_weights", "trailing_sum"]

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


def sum_weights(lengths: Sequence[int], scale: float = 1.0) -> list[torch.Tensor]:
    """The constant vectors of a chain of linears of ``lengths``: ones, the last one ``scale`` (``1/K``: a mean)."""
    return [torch.ones(1, k) for k in lengths[:-1]] + [torch.full((1, lengths[-1]), scale)]


def _drop_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` without its last dim, of size 1 (a view for any strides); kept 2-D for the linears."""
    return reshape_to(t, list(t.shape[:-1]) if t.dim() > 2 else [1, t.shape[0]])


def trailing_sum(t: torch.Tensor, sizes: Sequence[int], weights: Sequence[torch.Tensor],
                 out: Sizes | None = None) -> torch.Tensor:
    """The weighted sum of ``t`` over its trailing dims (of ``sizes``), viewed at ``out``.

    ``out`` defaults to ``t``'s shape with those dims 1 (``keepdim``). ``weights`` are the chain's, as
    ``sum_weights(chain_stages(sizes), scale)`` makes them; a dim of size 1 takes none.
    """
    kept = list(t.shape[: t.dim() - len(sizes)])
    total, done = sum(len(stages(size)) for size in sizes), 0
    for size in reversed(sizes):
        if size == 1:
            t = _drop_last(t)
            continue
        for length in stages(size):
            if t.shape[-1] != length:  # a dim too long for one linear: split it (always a view)
                t = reshape_to(t, [*t.shape[:-1], t.shape[-1] // length, length])
            t = F.linear(t, weights[done])
            done += 1
            if done < total:  # drop the 1 of the linear's output, a fresh tensor
                t = _drop_last(t)
    target = list(out) if out is not None else [*kept, *([1] * len(sizes))]
    return t if list(t.shape) == target else reshape_to(t, target)


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
