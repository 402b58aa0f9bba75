"""A ``cat`` whose inputs all come through alike reshapes and permutes concatenates their sources.

Invariant established: no statically shaped ``cat`` reads only chains of reshapes and permutes
(``movement_chains.movement_chain``) that do the same moves to sources of one rank, differing at most in
the size of one dim: it concatenates the sources, along the dim that matches, and one chain with the
summed size follows it. The match is checked on the tensors of element indices, so the values are the
same, bit for bit.

Why: an inception block (S3D) concatenates four branches on channels, each of which ends with a conv
unfolding its output back to (N, C, D, H, W); the cat then ran there, and the next block's convs folded
it again. Concatenated in the convs' own layout, one chain is left, which collapses with the next op's
(``CollapseMovementChainsPass``).
"""

from __future__ import annotations

import torch

from xnnguard.graph.shapes import static_shape
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.layout.base import LayoutPass
from xnnguard.rewrite.layout.movement_chains import is_movement, movement_chain

__all__ = ["SinkCatThroughMovesPass"]

_aten = torch.ops.aten

# (the dim to concatenate the sources along, each step of the chain after it as (target, args))
CatSite = tuple[int, list[tuple[object, object]]]


def _steps_after(chains: list[list[torch.fx.Node]]) -> list[tuple[object, object]] | None:
    """The chain for the concatenated sources: the same moves, reshapes with the one differing size summed."""
    steps: list[tuple[object, object]] = []
    for nodes in zip(*chains, strict=True):
        if len({node.target for node in nodes}) != 1:
            return None
        args = [list(node.args[1]) for node in nodes]
        if nodes[0].target is _aten.permute.default:
            if any(a != args[0] for a in args):
                return None
            steps.append((_aten.permute.default, args[0]))
            continue
        if len({len(a) for a in args}) != 1:
            return None
        differing = [i for i in range(len(args[0])) if len({a[i] for a in args}) != 1]
        if len(differing) > 1 or any(size < 0 for a in args for size in a):
            return None
        sizes = list(args[0])
        for i in differing:
            sizes[i] = sum(a[i] for a in args)
        steps.append((_aten.reshape.default, sizes))
    return steps


def _sinkable(node: torch.fx.Node) -> CatSite | None:
    if node.op != "call_function" or node.target is not _aten.cat.default or static_shape(node) is None:
        return None
    operands, dim = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if not isinstance(operands, list | tuple) or len(operands) < 2 or not isinstance(dim, int):
        return None
    if not all(is_movement(operand) for operand in operands) or len(set(operands)) != len(operands):
        return None
    chains = [movement_chain(operand) for operand in operands]  # type: ignore[arg-type]
    if len({len(chain) for chain in chains}) != 1:
        return None
    sources = [chain[0].args[0] for chain in chains]
    shapes = [static_shape(source) for source in sources]
    if any(shape is None for shape in shapes) or len({len(shape) for shape in shapes}) != 1:  # type: ignore[arg-type]
        return None
    steps = _steps_after(chains)
    if steps is None:
        return None
    return _matching_dim(chains, shapes, dim, steps)  # type: ignore[arg-type]


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
            return source_dim, steps
    return None


class SinkCatThroughMovesPass(LayoutPass[CatSite]):
    """Concatenates the sources of alike reshape/permute chains and moves the result once."""

    promise = "to concatenate the sources of every such cat"

    def site(self, node: torch.fx.Node) -> CatSite | None:
        return _sinkable(node)

    def rewrite(self, graph: torch.fx.Graph, node: torch.fx.Node, site: CatSite) -> None:
        source_dim, steps = site
        operands: list[torch.fx.Node] = list(node.args[0])  # type: ignore[arg-type]
        sources = [movement_chain(operand)[0].args[0] for operand in operands]
        with graph.inserting_before(node):
            moved = call_like(graph, node, _aten.cat.default, (sources, source_dim))
            for target, args in steps:
                moved = call_like(graph, node, target, (moved, args))
        node.replace_all_uses_with(moved)
