"""Dim-grouping arithmetic for rank reduction: which dims of a >6-D op can merge, and how to split a permute.

Pure functions of shapes and permutations (no graphs), shared by the ``reduce_rank_*`` passes.

Why merging is exact: a tensor in row-major order is the same bytes under any reshape, so dims that stay
next to each other, in the same order, through an op (a permute moving ``(3, 4)`` together, an add where
both operands are full along ``(3, 4)``) can be one dim of their product for that op. Dims of size 1
carry no data and merge with anything.

Why a permute may need several steps: after merging, a permute of ``r`` dims is one transpose of rank
``r``. When ``r`` exceeds the limit, it is done as a chain of transposes, each moving at most ``limit``
blocks of the current layout; ``permute_steps`` finds a shortest chain (exact up to two steps, greedy
beyond).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

__all__ = [
    "PermuteStep",
    "broadcast_groups",
    "grouped_shape",
    "merge_permutation",
    "permute_steps",
    "split_layouts",
]

Shape = tuple[int, ...]
Layout = tuple[int, ...]  # the order, outermost first, in which a tensor's (merged) dims lie in memory


@dataclass(frozen=True)
class PermuteStep:
    """One transpose of a chain: ``x.reshape(input_shape).permute(perm)``, at most the limit in rank."""

    input_shape: Shape
    perm: tuple[int, ...]


def merge_permutation(shape: Sequence[int], perm: Sequence[int]) -> tuple[Shape, tuple[int, ...]]:
    """``permute(x, perm)`` on ``shape`` as a permute of fewer dims: ``(merged_shape, merged_perm)``.

    Drops dims of size 1, then merges each run of input dims that the permute keeps adjacent and in
    order. ``x.reshape(merged_shape).permute(merged_perm)`` holds the same elements in the same order
    as ``x.permute(perm)``. A permute that moves nothing merges to rank 1 (or 0 for a single element).
    """
    data_dims = [d for d in range(len(shape)) if shape[d] != 1]
    index = {d: i for i, d in enumerate(data_dims)}  # dims of size 1 gone, so their neighbours are adjacent
    runs: list[list[int]] = []
    for d in (index[d] for d in perm if shape[d] != 1):
        if runs and d == runs[-1][-1] + 1:
            runs[-1].append(d)
        else:
            runs.append([d])
    by_input = sorted(range(len(runs)), key=lambda i: runs[i][0])
    merged_shape = tuple(math.prod(shape[data_dims[d]] for d in runs[i]) for i in by_input)
    rank_of_run = {run: rank for rank, run in enumerate(by_input)}
    merged_perm = tuple(rank_of_run[i] for i in range(len(runs)))
    return merged_shape, merged_perm


def _block_count(source: Layout, target: Layout) -> int:
    """Blocks of ``target`` that lie contiguous and in order in ``source``: the rank of one transpose."""
    if not target:
        return 0
    position = {d: i for i, d in enumerate(source)}
    return 1 + sum(1 for a, b in pairwise(target) if position[b] != position[a] + 1)


def _step(source: Layout, target: Layout, sizes: Sequence[int]) -> PermuteStep:
    """The transpose taking a tensor laid out as ``source`` to ``target`` (dims of ``sizes``)."""
    position = {d: i for i, d in enumerate(source)}
    blocks: list[list[int]] = []
    for d in target:
        if blocks and position[d] == position[blocks[-1][-1]] + 1:
            blocks[-1].append(d)
        else:
            blocks.append([d])
    by_source = sorted(range(len(blocks)), key=lambda i: position[blocks[i][0]])
    input_shape = tuple(math.prod(sizes[d] for d in blocks[i]) for i in by_source)
    rank_of_block = {block: rank for rank, block in enumerate(by_source)}
    return PermuteStep(input_shape, tuple(rank_of_block[i] for i in range(len(blocks))))


def _best_intermediate(source: Layout, target: Layout, limit: int, budget: int = 200_000) -> Layout | None:
    """A layout one ``limit``-block transpose away from ``source`` that keeps most of ``target``'s adjacencies.

    Depth-first over layouts built left to right: at most ``limit - 1`` joins that break ``source``'s
    order (the step's block count), maximizing the joins that are ``target``'s adjacencies (each one
    saves a block in the next step). Bounded by ``budget`` visited prefixes; None if nothing beats
    ``source`` itself.
    """
    n = len(source)
    source_next = {a: b for a, b in pairwise(source)}
    target_next = {a: b for a, b in pairwise(target)}
    best: list[object] = [None, sum(1 for a, b in pairwise(source) if target_next.get(a) == b)]
    visited = [0]
    used = [False] * (max(source) + 1 if source else 0)
    prefix: list[int] = []

    def search(breaks: int, kept: int) -> None:
        visited[0] += 1
        if visited[0] > budget:
            return
        if len(prefix) == n:
            if kept > best[1]:  # type: ignore[operator]
                best[0], best[1] = tuple(prefix), kept
            return
        if kept + (n - len(prefix)) <= best[1]:  # type: ignore[operator]
            return
        last = prefix[-1] if prefix else None
        followers = () if last is None else (target_next.get(last), source_next.get(last))
        candidates = [d for d in followers if d is not None]
        candidates += [d for d in source if d not in candidates]
        for d in candidates:
            if used[d]:
                continue
            in_order = last is None or source_next.get(last) == d
            if not in_order and breaks + 1 > limit - 1:
                continue
            used[d] = True
            prefix.append(d)
            joins_target = last is not None and target_next.get(last) == d
            search(breaks + (0 if in_order else 1), kept + (1 if joins_target else 0))
            prefix.pop()
            used[d] = False

    search(0, 0)
    return best[0]  # type: ignore[return-value]


def split_layouts(rank: int, target: Sequence[int], limit: int) -> list[Layout]:
    """Layouts ``L1 .. Ld = target`` such that each ``L(i-1) -> Li`` (``L0`` = identity) is a transpose of
    at most ``limit`` blocks, with ``d`` as small as the search finds (exact for d <= 2).

    Falls back to moving one element at a time (3-block transposes) if the search finds nothing better.
    """
    target = tuple(target)
    current: Layout = tuple(range(rank))
    layouts: list[Layout] = []
    while _block_count(current, target) > limit:
        middle = _best_intermediate(current, target, limit)
        if middle is None or middle == current:
            middle = _move_one(current, target)
        layouts.append(middle)
        current = middle
    if current != target or not layouts:
        layouts.append(target)
    return layouts


def _move_one(current: Layout, target: Layout) -> Layout:
    """``current`` with the first element out of ``target``'s place moved there (a 3-block transpose)."""
    for i, (have, want) in enumerate(zip(current, target)):
        if have != want:
            rest = [d for d in current if d != want]
            return tuple([*rest[:i], want, *rest[i:]])
    return current


def permute_steps(shape: Sequence[int], perm: Sequence[int], limit: int) -> list[PermuteStep]:
    """``x.permute(perm)`` for ``x`` of ``shape`` as transposes of rank <= ``limit`` (fewest found).

    Apply as ``for s in steps: x = x.reshape(s.input_shape).permute(s.perm)`` then reshape to the
    permuted shape. Empty when the permute moves no data (only size-1 dims, or none, change place).
    """
    merged_shape, merged_perm = merge_permutation(shape, perm)
    if merged_perm == tuple(range(len(merged_perm))):
        return []
    previous: Layout = tuple(range(len(merged_perm)))
    steps = []
    for layout in split_layouts(len(merged_perm), merged_perm, limit):
        steps.append(_step(previous, layout, merged_shape))
        previous = layout
    return steps


def broadcast_groups(output_shape: Sequence[int], operand_shapes: Sequence[Sequence[int]]) -> list[list[int]]:
    """Output dims of a broadcasting elementwise op grouped so that each group can be one dim.

    Dims of size 1 are dropped (they hold no data). Adjacent dims merge when every operand agrees on
    them: full along both, or broadcast (size 1 or missing) along both. An operand then reshapes to the
    product of a group where it is full, and to 1 where it is broadcast.
    """
    rank = len(output_shape)

    def pattern(dim: int) -> tuple[bool, ...]:
        flags = []
        for shape in operand_shapes:
            offset = dim - (rank - len(shape))
            flags.append(offset >= 0 and shape[offset] != 1)
        return tuple(flags)

    groups: list[list[int]] = []
    last: tuple[bool, ...] | None = None
    for dim in range(rank):
        if output_shape[dim] == 1:
            continue
        flags = pattern(dim)
        if groups and flags == last:
            groups[-1].append(dim)
        else:
            groups.append([dim])
        last = flags
    return groups


def grouped_shape(shape: Sequence[int], output_rank: int, groups: Sequence[Sequence[int]]) -> Shape:
    """``shape`` (an operand, right-aligned to ``output_rank``) on ``groups``: products, or 1 where broadcast."""
    offset = output_rank - len(shape)
    return tuple(math.prod(shape[d - offset] if d >= offset else 1 for d in group) for group in groups)
