"""A ``cat`` whose inputs all come through alike reshapes and permutes concatenates their sources.

Invariant established: no statically shaped ``cat`` reads only chains of reshapes and permutes
(``movement_chains.movement_chain``) that end in the same moves of tensors of one rank, differing at most
in the size of one dim: it concatenates those tensors (the sources, or where the longest alike ends of
the chains begin), along the dim that matches, and one chain with the summed size follows it. The match
is checked on the tensors of element indices, so the values are the same, bit for bit.

Why: an inception block (S3D) concatenates four branches on channels, each of which ends with a conv
unfolding its output back to (N, C, D, H, W); the cat then ran there, and the next block's convs folded
it again. Concatenated in the convs' own layout, one chain is left, which collapses with the next op's
(``CollapseMovementChainsPass``). The ends: a UNet's decoder concatenates its upsampled frames, which
come from a transposed conv's taps through one more reshape, with the skip from the encoder.
"""

from __future__ import annotations

import itertools

import torch

from xnnguard.graph.shapes import static_shape
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.layout.base import LayoutPass
from xnnguard.rewrite.layout.movement_chains import is_movement, movement_chain

__all__ = ["SinkCatThroughMovesPass"]

_aten = torch.ops.aten

# (the dim to concatenate the sources along, each step of the chain after it as (target, args), how many
# moves of each operand's chain it replaces)
CatSite = tuple[int, list[tuple[object, object]], int]


def _steps_after(chains: list[list[torch.fx.Node]]) -> list[list[tuple[object, object]]]:
    """The chains that may follow the concatenated sources: the same moves, each reshape with the one size
    that differs summed (where every operand's reshape is alike, any of its sizes: ``_matching_dim`` tries
    them on element indices)."""
    options: list[list[tuple[object, object]]] = []
    for nodes in zip(*chains, strict=True):
        if len({node.target for node in nodes}) != 1:
            return []
        # a reshape's sizes as it makes them (a -1 written for one of them resolved)
        args = [list(node.args[1] if node.target is _aten.permute.default else static_shape(node) or ())
                for node in nodes]
        if nodes[0].target is _aten.permute.default:
            if any(a != args[0] for a in args):
                return []
            options.append([(_aten.permute.default, args[0])])
            continue
        if len({len(a) for a in args}) != 1:
            return []
        differing = [i for i in range(len(args[0])) if len({a[i] for a in args}) != 1]
        if len(differing) > 1:
            return []
        summed: list[tuple[object, object]] = []
        for i in differing or range(len(args[0])):
            sizes = list(args[0])
            sizes[i] = sum(a[i] for a in args)
            summed.append((_aten.reshape.default, sizes))
        options.append(summed)
    return [list(steps) for steps in itertools.product(*options)]


def _sinkable(node: torch.fx.Node) -> CatSite | None:
    if node.op != "call_function" or node.target is not _aten.cat.default or static_shape(node) is None:
        return None
    operands, dim = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if not isinstance(operands, list | tuple) or len(operands) < 2 or not isinstance(dim, int):
        return None
    if not all(is_movement(operand) for operand in operands) or len(set(operands)) != len(operands):
        return None
    chains = [movement_chain(operand) for operand in operands]  # type: ignore[arg-type]
    for length in range(min(len(chain) for chain in chains), 0, -1):  # the longest alike ends first
        ends = [chain[-length:] for chain in chains]
        shapes = [static_shape(end[0].args[0]) for end in ends]
        if any(shape is None for shape in shapes) or len({len(shape) for shape in shapes}) != 1:  # type: ignore[arg-type]
            continue
        for steps in _steps_after(ends):
            site = _matching_dim(ends, shapes, dim, steps)  # type: ignore[arg-type]
            if site is not None:
                return site
    return None


def _matching_dim(
    chains: list[list[torch.fx.Node]], shapes: list[tuple[int, ...]], dim: int, steps: list[tuple[object, object]]
) -> CatSite | None:
    """The dim of the sources whose cat, moved by ``steps``, is the cat of the moved sources along ``dim``."""
    if sum(torch.Size(shape).numel() for shape in shapes) >= 2**31:
        return None
    start, indices = 0, []
    for shape in shapes:
        count = torch.Size(shape).numel()
        indices.append(torch.arange(start, start + count, dtype=torch.int32).reshape(shape))
        start += count
    moved = []
    for chain, index in zip(chains, indices, strict=True):
        for node in chain:
            index = node.target(index, *node.args[1:], **node.kwargs)  # type: ignore[operator]
        moved.append(index)
    expected = torch.cat(moved, dim)
    for source_dim in range(len(shapes[0])):
        try:
            candidate = torch.cat(indices, source_dim)
            for target, args in steps:
                candidate = target(candidate, args)  # type: ignore[operator]
        except RuntimeError:  # the sources differ in another dim, or the sizes do not fit
            continue
        if candidate.shape == expected.shape and torch.equal(candidate, expected):
            return source_dim, steps, len(chains[0])
    return None


class SinkCatThroughMovesPass(LayoutPass[CatSite]):
    """Concatenates the sources of alike reshape/permute chains and moves the result once."""

    promise = "to concatenate the sources of every such cat"

    def site(self, node: torch.fx.Node) -> CatSite | None:
        return _sinkable(node)

    def rewrite(self, graph: torch.fx.Graph, node: torch.fx.Node, site: CatSite) -> None:
        source_dim, steps, length = site
        operands: list[torch.fx.Node] = list(node.args[0])  # type: ignore[arg-type]
        sources = [movement_chain(operand)[-length].args[0] for operand in operands]
        with graph.inserting_before(node):
            moved = call_like(graph, node, _aten.cat.default, (sources, source_dim))
            for target, args in steps:
                moved = call_like(graph, node, target, (moved, args))
        node.replace_all_uses_with(moved)
