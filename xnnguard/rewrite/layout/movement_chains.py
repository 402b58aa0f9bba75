"""A chain of reshapes and permutes is one reshape when it moves no element, one permute when it is one,
and at most one permute between two reshapes otherwise.

Invariant established: no chain of two or more statically shaped reshapes and permutes takes a tensor
to a tensor that is its reshape or its permute where replacing it frees a permute (or two reshapes for
one); such a chain is replaced by that one op (none when it moves nothing and the shapes are equal). A
chain with two permutes or more that amounts to a reshape, one permute of at most 6 dims and a reshape
(``reshape_permute_reshape``), and frees as many ops as that adds, is replaced by those: every chain
of moves is a permute of the blocks of elements that move together (MViT's pooled attention went from
tokens to frames in the batch through two transposes, and back through two). The part of a chain
other nodes read too stays for them. Checked by running the chain on the tensor of element indices, so
the result is exactly the one the chain computed.

Why: each rewrite of a 3-D op works on frames folded into the batch, (N*D, C, H, W), or on a
clip-wide layout, and returns to (N, C, D, H, W) for the next op, which folds the frames again. Between
two such ops XNNPACK ran a transpose back and a transpose forth, and ExecuTorch's NHWC pass a layout
conversion around each (a 3x3x3 conv after another, a conv then a pooling). One reshape costs one
conversion out of NHWC, or nothing when the shapes are equal; one 4-D permute between two convs stays
in NHWC (ExecuTorch remaps its dims) and costs one transpose.
A chain with a dynamic size or an arg computed in the graph is left as it is (nothing is delegated
differently, only copies more run).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from xnnguard.graph.shapes import static_shape
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.layout.base import LayoutPass

__all__ = [
    "CollapseMovementChainsPass", "element_indices", "freed_suffix", "is_movement", "keeps_channels", "movement_chain",
    "one_move",
    "reshape_permute_reshape", "run_moves", "undo_moves",
]

Move = tuple[object, list[int]]  # (aten.reshape, shape) or (aten.permute, dims)
_MAX_PERMUTE_RANK = 6  # XNNPACK's transpose

_aten = torch.ops.aten
_MOVEMENT = frozenset({_aten.reshape.default, _aten.view.default, _aten._unsafe_view.default, _aten.permute.default})


def is_movement(node: object) -> bool:
    """A reshape or permute with static sizes written as plain ints (none read from the graph)."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.target not in _MOVEMENT:
        return False
    leaves = torch.utils._pytree.tree_leaves((node.args[1:], node.kwargs))
    return static_shape(node) is not None and not any(isinstance(leaf, torch.fx.Node) for leaf in leaves)


def movement_chain(end: torch.fx.Node) -> list[torch.fx.Node]:
    """The reshapes and permutes ending at ``end`` (a movement node), first first; others may read them too."""
    chain = [end]
    while is_movement(source := chain[-1].args[0]):
        chain.append(source)  # type: ignore[arg-type]
    return chain[::-1]


def freed_suffix(chain: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """The nodes of ``chain`` nothing else reads: the ones replacing the chain frees (a suffix)."""
    freed: list[torch.fx.Node] = [chain[-1]]
    for node in reversed(chain[:-1]):
        if len(node.users) != 1:
            break
        freed.append(node)
    return freed


def one_move(indices: torch.Tensor, moved: torch.Tensor) -> tuple[object, list[int]] | None:
    """``(aten.reshape, shape)`` or ``(aten.permute, dims)`` that takes ``indices`` (a contiguous tensor of
    element indices) to ``moved`` (the same elements placed by some moves), else None."""
    if torch.equal(moved.reshape(-1), indices.reshape(-1)):
        return _aten.reshape.default, list(moved.shape)
    if moved.dim() != indices.dim():
        return None
    # the dim of the source each output dim walks along: the one with the same stride and size
    free = list(range(indices.dim()))
    dims = []
    for out_dim, size in enumerate(moved.shape):
        unit = [0] * moved.dim()
        if size > 1:
            unit[out_dim] = 1
            step = int(moved[tuple(unit)]) - int(moved[(0,) * moved.dim()])
            match = [d for d in free if indices.stride(d) == step and indices.shape[d] == size]
        else:
            match = [d for d in free if indices.shape[d] == 1]
        if not match:
            return None
        dims.append(match[0])
        free.remove(match[0])
    return (_aten.permute.default, dims) if torch.equal(indices.permute(dims), moved) else None


def element_indices(shape: Sequence[int]) -> torch.Tensor | None:
    """A contiguous tensor of ``shape`` holding each element's index, to follow moves on; None if too big."""
    if torch.Size(shape).numel() >= 2**31:
        return None
    return torch.arange(torch.Size(shape).numel(), dtype=torch.int32).reshape(tuple(shape))  # half of int64's memory


def keeps_channels(chain: Sequence[torch.fx.Node], shape: Sequence[int]) -> bool:
    """True when ``chain`` takes a tensor of ``shape`` to one whose channel ``c`` (dim 1) holds exactly the
    elements of channel ``c`` of the tensor it moved: a per-channel op may then run before the moves."""
    indices = element_indices(shape) if len(shape) >= 2 else None
    if indices is None:
        return False
    moved = run_moves(chain, indices)
    channels = int(shape[1])
    if moved.dim() < 2 or int(moved.shape[1]) != channels:
        return False
    channel_of = (moved // math.prod(shape[2:])) % channels
    return bool((channel_of == torch.arange(channels, dtype=moved.dtype).reshape(
        [1, channels] + [1] * (moved.dim() - 2))).all())


def run_moves(chain: Sequence[torch.fx.Node], x: torch.Tensor) -> torch.Tensor:
    """What ``chain`` computes on ``x``."""
    for node in chain:
        x = node.target(x, *node.args[1:], **node.kwargs)  # type: ignore[operator]
    return x


def undo_moves(chain: Sequence[torch.fx.Node], x: torch.Tensor) -> torch.Tensor:
    """The tensor ``chain`` takes to ``x``: each move undone, last first (moves only place elements)."""
    for node in reversed(chain):
        if node.target is _aten.permute.default:
            x = x.permute([int(d) for d in torch.argsort(torch.tensor(node.args[1]))])
        else:
            shape = static_shape(node.args[0])
            assert shape is not None
            x = x.reshape(shape)
    return x


def reshape_permute_reshape(shape: Sequence[int], chain: Sequence[torch.fx.Node]) -> list[Move] | None:
    """Moves equal to ``chain`` on a tensor of ``shape``: a reshape into the blocks of elements that move
    together, one permute of those blocks, a reshape to the chain's shape (each left out when it does
    nothing); None when the chain splits a block unevenly (a reshape across a permuted boundary).

    The blocks (atoms) start as the source's dims; a reshape that ends a dim inside one splits it into an
    outer and an inner atom everywhere. Atoms that end next to each other, in order, are merged.
    """
    size: dict[int, int] = {}
    order: list[int] = []  # the atoms in the source's order
    dims: list[list[int]] = []  # the current tensor's dims, each its atoms, outer first
    for extent in shape:
        if extent > 1:
            size[len(size)] = extent
            order.append(len(size) - 1)
        dims.append([len(size) - 1] if extent > 1 else [])
    for node in chain:
        if node.target is _aten.permute.default:
            dims = [dims[int(d) % len(dims)] for d in node.args[1]]  # type: ignore[union-attr, arg-type]
            continue
        target = static_shape(node)
        if target is None:
            return None
        atoms = [atom for dim in dims for atom in dim]
        dims, at = [], 0
        for extent in target:
            dim, need = [], extent
            while need > 1:
                if at == len(atoms):
                    return None
                atom = atoms[at]
                if size[atom] > need:  # the dim ends inside this atom: split it
                    if size[atom] % need:
                        return None
                    outer, inner = len(size), len(size) + 1
                    size[outer], size[inner] = need, size[atom] // need
                    order[order.index(atom):order.index(atom) + 1] = [outer, inner]
                    atoms[at:at + 1] = [outer, inner]
                    atom = outer
                if need % size[atom]:
                    return None
                need //= size[atom]
                dim.append(atom)
                at += 1
            dims.append(dim)
        if at != len(atoms):
            return None
    final = [atom for dim in dims for atom in dim]
    blocks: list[list[int]] = []  # the final atoms, merged where they stay next to each other in order
    for atom in final:
        if blocks and order.index(atom) == order.index(blocks[-1][-1]) + 1:
            blocks[-1].append(atom)
        else:
            blocks.append([atom])
    by_source = sorted(range(len(blocks)), key=lambda b: order.index(blocks[b][0]))
    perm = [by_source.index(b) for b in range(len(blocks))]
    block_shape = [math.prod(size[atom] for atom in blocks[b]) for b in by_source]
    out_shape = static_shape(chain[-1])
    if out_shape is None or len(block_shape) > _MAX_PERMUTE_RANK:
        return None
    moves: list[Move] = []
    if list(block_shape) != list(shape):
        moves.append((_aten.reshape.default, block_shape))
    if perm != sorted(perm):
        moves.append((_aten.permute.default, perm))
    if [block_shape[p] for p in perm] != list(out_shape) or not moves:
        moves.append((_aten.reshape.default, list(out_shape)))
    return moves


def _as_moves(chain: list[torch.fx.Node]) -> list[Move] | None:
    """The one reshape or permute that computes what ``chain`` does, else a reshape, permute and reshape
    (``reshape_permute_reshape``), checked on the element indices; None when neither is."""
    shape = static_shape(chain[0].args[0])
    indices = element_indices(shape) if shape is not None else None
    if shape is None or indices is None:
        return None
    moved = run_moves(chain, indices)
    one = one_move(indices, moved)
    if one is not None:
        return [one]
    moves = reshape_permute_reshape(shape, chain)
    if moves is None:
        return None
    got = indices
    for target, args in moves:
        got = target(got, args)  # type: ignore[operator]
    return moves if torch.equal(got, moved) else None


def _permutes(nodes: Sequence[torch.fx.Node]) -> int:
    return sum(1 for node in nodes if node.target is _aten.permute.default)


def _collapsible(end: torch.fx.Node) -> tuple[list[torch.fx.Node], list[Move]] | None:
    """The maximal chain ending at ``end`` and the moves that replace it, when they are fewer, else None."""
    if not is_movement(end):
        return None
    if len(end.users) == 1 and is_movement(next(iter(end.users))):
        return None  # not the end: the chain goes on
    chain = movement_chain(end)
    if len(chain) < 2:
        return None
    moves = _as_moves(chain)
    if moves is None:
        return None
    freed = freed_suffix(chain)
    if len(moves) == 1:
        # worth it when it frees a permute, or when it frees more than it adds (a reshape for reshapes)
        if _permutes(freed):
            return chain, moves
        return (chain, moves) if moves[0][0] is _aten.reshape.default and len(freed) > 1 else None
    # a permute in place of two or more, adding no more ops than it frees
    fewer = _permutes(freed) > sum(1 for target, _ in moves if target is _aten.permute.default)
    return (chain, moves) if fewer and len(moves) <= len(freed) else None


class CollapseMovementChainsPass(LayoutPass[tuple[list[torch.fx.Node], list[Move]]]):
    """Replaces each chain of reshapes and permutes by the one reshape or permute it amounts to, or by
    one permute between two reshapes where it had more permutes."""

    promise = "to collapse every chain that is one reshape or permute, or fewer permutes"

    def site(self, node: torch.fx.Node) -> tuple[list[torch.fx.Node], list[Move]] | None:
        return _collapsible(node)

    def rewrite(self, graph: torch.fx.Graph, node: torch.fx.Node, site: tuple[list[torch.fx.Node], list[Move]]) -> None:
        chain, moves = site
        source = chain[0].args[0]
        assert isinstance(source, torch.fx.Node)
        if len(moves) == 1 and moves[0][0] is _aten.reshape.default and static_shape(source) == tuple(moves[0][1]):
            node.replace_all_uses_with(source)
            return
        value = source
        with graph.inserting_before(node):
            for target, args in moves[:-1]:
                value = call_like(graph, node, target, (value, args))
            node.replace_all_uses_with(call_like(graph, node, moves[-1][0], (value, moves[-1][1])))
