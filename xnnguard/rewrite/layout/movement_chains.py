"""A chain of reshapes and permutes is one reshape when it moves no element, one permute when it is one.

Invariant established: no chain of two or more statically shaped reshapes and permutes takes a tensor
to a tensor that is its reshape or its permute where replacing it frees a permute (or two reshapes for
one); such a chain is replaced by that one op (none when it moves nothing and the shapes are equal). The
part of a chain other nodes read too stays for them. Checked by running the chain on the
tensor of element indices, so the result is exactly the one the chain computed.

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

from collections.abc import Sequence

import torch

from xnnguard.graph.shapes import static_shape
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.layout.base import LayoutPass

__all__ = [
    "CollapseMovementChainsPass", "element_indices", "freed_suffix", "is_movement", "movement_chain", "one_move",
    "run_moves", "undo_moves",
]

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


def _as_one_op(chain: list[torch.fx.Node]) -> tuple[object, list[int]] | None:
    """``(aten.reshape, shape)`` or ``(aten.permute, dims)`` that computes what ``chain`` does, else None."""
    shape = static_shape(chain[0].args[0])
    indices = element_indices(shape) if shape is not None else None
    return one_move(indices, run_moves(chain, indices)) if indices is not None else None


def _collapsible(end: torch.fx.Node) -> tuple[list[torch.fx.Node], object, list[int]] | None:
    """The maximal chain ending at ``end`` and the one op that replaces it, when there is one, else None."""
    if not is_movement(end):
        return None
    if len(end.users) == 1 and is_movement(next(iter(end.users))):
        return None  # not the end: the chain goes on
    chain = movement_chain(end)
    if len(chain) < 2:
        return None
    one = _as_one_op(chain)
    if one is None:
        return None
    freed = freed_suffix(chain)
    # worth it when it frees a permute, or when it frees more than it adds (a reshape for reshapes)
    if any(node.target is _aten.permute.default for node in freed):
        return (chain, *one)
    return (chain, *one) if one[0] is _aten.reshape.default and len(freed) > 1 else None


class CollapseMovementChainsPass(LayoutPass[tuple[list[torch.fx.Node], object, list[int]]]):
    """Replaces each chain of reshapes and permutes by the one reshape or permute it amounts to."""

    promise = "to collapse every chain that is one reshape or permute"

    def site(self, node: torch.fx.Node) -> tuple[list[torch.fx.Node], object, list[int]] | None:
        return _collapsible(node)

    def rewrite(
        self, graph: torch.fx.Graph, node: torch.fx.Node, site: tuple[list[torch.fx.Node], object, list[int]]
    ) -> None:
        chain, target, args = site
        source = chain[0].args[0]
        assert isinstance(source, torch.fx.Node)
        if target is _aten.reshape.default and static_shape(source) == tuple(args):
            node.replace_all_uses_with(source)
            return
        with graph.inserting_before(node):
            node.replace_all_uses_with(call_like(graph, node, target, (source, args)))
