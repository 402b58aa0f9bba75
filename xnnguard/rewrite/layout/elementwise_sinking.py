"""An elementwise op whose operands all come through reshapes and permutes runs before them.

Invariant established: no statically shaped elementwise op (a ReLU, an add of a residual, ...) reads
only chains of reshapes and permutes (``movement_chains.movement_chain``) where

* the chains are alike, with sources of one shape: it then reads the sources, and one copy of the chain
  follows it; or
* the chains differ, but each other operand's source reaches the first operand's source layout in one
  reshape or permute (its chain undone by the first one's), its chain is two moves or more that nothing
  else reads, and holds no fewer permutes than that one move: it then reads the first source and the
  moved ones, and the first chain follows it.

A chain others read too stays for them.
``f(move(a), move(b)) == move(f(a, b))`` for a move that only places elements, so the values are the
same, bit for bit.

Why: the 3-D rewrites unfold their frames back to (N, C, D, H, W) after each op, and a residual add and
its ReLU sat there, between two such chains: XNNPACK transposed both operands back to run them and the
sum forth again for the next conv. Run on the sources, they leave one chain, which then collapses with
the next op's own (``CollapseMovementChainsPass``, next): R(2+1)D's blocks then stay in the layout of
their convs from one block to the next. The chains differ where a stage begins: the skip's strided 1x1x1
conv has the frames in its batch, the temporal conv the rows (R(2+1)D's float delegate, bench size:
95 transposes, 61 reshapes and 6 standalone ReLUs before the second case, 52, 15 and none after).
A norm's result comes through a ``clone`` to a contiguous tensor (``xnnguard.rewrite.norm.base.contiguous``),
and a UNet's LeakyReLU follows it: both run before the chain of a norm computed in its frames
(``xnnguard.rewrite.norm.frames_layout``), the clone only where no ``view`` downstream needs its strides.
An in-place op is written out of place; it runs on the sources only when nothing else reads the
operand it writes, nor the views it comes through, nor their base (they share its memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xnnguard.graph.shapes import static_shape
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.layout.base import LayoutPass
from xnnguard.rewrite.layout.movement_chains import (
    element_indices,
    freed_suffix,
    is_movement,
    keeps_channels,
    movement_chain,
    one_move,
    run_moves,
    undo_moves,
)

__all__ = ["SinkElementwiseThroughMovesPass"]

_aten = torch.ops.aten
# elementwise op -> its out-of-place form
_ELEMENTWISE = {
    _aten.relu.default: _aten.relu.default,
    _aten.relu_.default: _aten.relu.default,
    _aten.hardtanh.default: _aten.hardtanh.default,
    _aten.hardtanh_.default: _aten.hardtanh.default,
    _aten.sigmoid.default: _aten.sigmoid.default,
    _aten.silu.default: _aten.silu.default,
    _aten.silu_.default: _aten.silu.default,
    _aten.gelu.default: _aten.gelu.default,
    _aten.leaky_relu.default: _aten.leaky_relu.default,
    _aten.leaky_relu_.default: _aten.leaky_relu.default,
    _aten.clone.default: _aten.clone.default,  # a norm's contiguous result (moved only where no view needs it)
    _aten.prelu.default: _aten.prelu.default,  # per channel: moved only where the moves keep the channels
    _aten.add.Tensor: _aten.add.Tensor,
    _aten.add_.Tensor: _aten.add.Tensor,
    _aten.sub.Tensor: _aten.sub.Tensor,
    _aten.mul.Tensor: _aten.mul.Tensor,
}

_VIEWS = frozenset({_aten.view.default, _aten._unsafe_view.default})
_IN_PLACE = frozenset(op for op, out_of_place in _ELEMENTWISE.items() if op is not out_of_place)


def _written_alone(chain: list[torch.fx.Node]) -> bool:
    """True when nothing but the chain itself reads its nodes and its source (the base of its views)."""
    source = chain[0].args[0]
    return isinstance(source, torch.fx.Node) and all(len(node.users) == 1 for node in (source, *chain))


def _signature(chain: list[torch.fx.Node]) -> tuple[object, ...]:
    return tuple((node.target, repr(node.args[1:]), repr(node.kwargs)) for node in chain)


@dataclass(frozen=True)
class _Site:
    """Where an elementwise op runs instead: on the source of its ``lead`` operand's chain, each other
    operand brought there by one move of its own source (``None``: its chain is alike, it reads its source)."""

    lead: list[torch.fx.Node]
    connectors: dict[torch.fx.Node, tuple[object, list[int]] | None]


def _permutes(nodes: list[torch.fx.Node]) -> int:
    return sum(node.target is _aten.permute.default for node in nodes)


def _connector(lead: list[torch.fx.Node], chain: list[torch.fx.Node]) -> tuple[object, list[int]] | None:
    """The one reshape or permute taking ``chain``'s source to where ``lead``'s source sits, when it
    frees more than it adds: ``chain`` then leaves two moves or more, and no fewer permutes than it adds."""
    source = static_shape(chain[0].args[0])
    indices = element_indices(source) if source is not None else None
    if indices is None:
        return None
    move = one_move(indices, undo_moves(lead, run_moves(chain, indices)))
    freed = freed_suffix(chain)
    if move is None or len(freed) != len(chain) or len(chain) < 2:
        return None
    return move if _permutes(freed) >= (move[0] is _aten.permute.default) else None


def _feeds_a_view(node: torch.fx.Node) -> bool:
    """True when ``node``'s value reaches a ``view`` through elementwise ops and moves: a view needs the
    strides it was traced with, and a clone moved before the chain leaves the chain's strides instead."""
    seen, todo = set(), list(node.users)
    while todo:
        user = todo.pop()
        if user in seen:
            continue
        seen.add(user)
        if user.target in _VIEWS:
            return True
        if user.target in _ELEMENTWISE or is_movement(user):
            todo.extend(user.users)
    return False


def _prelu_site(node: torch.fx.Node) -> _Site | None:
    """A PReLU runs on its input's source when its one weight, or the source's channels, are the moved
    tensor's: its weight is no chain, but a per-channel operand."""
    x, weight = node.args[0], node.args[1]
    weights = weight.meta.get("val") if isinstance(weight, torch.fx.Node) else None
    if not is_movement(x) or not isinstance(weights, torch.Tensor):
        return None
    chain = movement_chain(x)  # type: ignore[arg-type]
    shape = static_shape(chain[0].args[0])
    if shape is None or (weights.numel() != 1 and not keeps_channels(chain, shape)):
        return None
    return _Site(chain, {chain[-1]: None})


def _sinkable(node: torch.fx.Node) -> _Site | None:
    """Where ``node`` can run on its operands' sources, when it can; else None."""
    if node.op != "call_function" or node.target not in _ELEMENTWISE or static_shape(node) is None:
        return None
    if node.target is _aten.clone.default and _feeds_a_view(node):
        return None
    if node.target is _aten.prelu.default:
        return _prelu_site(node)
    if any(isinstance(leaf, torch.fx.Node) for leaf in torch.utils._pytree.tree_leaves(node.kwargs)):
        return None
    operands = [arg for arg in node.args if isinstance(arg, torch.fx.Node)]
    others = [arg for arg in node.args if not isinstance(arg, torch.fx.Node)]
    if not operands or not all(isinstance(arg, int | float | bool) for arg in others):
        return None
    if len(set(operands)) != len(operands):
        return None  # x + x: one chain read twice (kept simple)
    chains = []
    for index, operand in enumerate(operands):
        if not is_movement(operand) or static_shape(operand) != static_shape(node):
            return None
        chain = movement_chain(operand)
        if index == 0 and node.target in _IN_PLACE and not _written_alone(chain):
            return None  # others read what it writes: the chain's views and their base share its memory
        chains.append(chain)
    sources = [chain[0].args[0] for chain in chains]
    if not all(isinstance(source, torch.fx.Node) and static_shape(source) is not None for source in sources):
        return None
    for lead in chains:  # the first operand whose layout every other one reaches in one move
        connectors: dict[torch.fx.Node, tuple[object, list[int]] | None] = {}
        for chain in chains:
            alike = (static_shape(chain[0].args[0]) == static_shape(lead[0].args[0])
                     and _signature(chain) == _signature(lead))
            connectors[chain[-1]] = None if alike else _connector(lead, chain)
            if not alike and connectors[chain[-1]] is None:
                break
        else:
            return _Site(lead, connectors)
    return None


class SinkElementwiseThroughMovesPass(LayoutPass[_Site]):
    """Runs each elementwise op whose operands come through reshape/permute chains on their sources."""

    promise = "to run every such elementwise op on its sources"

    def site(self, node: torch.fx.Node) -> _Site | None:
        return _sinkable(node)

    def rewrite(self, graph: torch.fx.Graph, node: torch.fx.Node, site: _Site) -> None:
        with graph.inserting_before(node):
            moved_in: dict[torch.fx.Node, torch.fx.Node] = {}
            for end, connector in site.connectors.items():
                source = movement_chain(end)[0].args[0]
                assert isinstance(source, torch.fx.Node)
                if connector is None:
                    moved_in[end] = source
                elif connector[0] is _aten.reshape.default and list(static_shape(source) or ()) == connector[1]:
                    moved_in[end] = source  # the moves cancel out
                else:
                    moved_in[end] = call_like(graph, end, connector[0], (source, connector[1]))
            args = tuple(moved_in.get(arg, arg) if isinstance(arg, torch.fx.Node) else arg for arg in node.args)
            moved = call_like(graph, node, _ELEMENTWISE[node.target], args, dict(node.kwargs))  # type: ignore[index]
            for step in site.lead:
                # The moves now give ``node``'s value: they stand in for it, not for the chain's pieces (a
                # rewritten mean whose last reshape moved past an add would have two results to quantize).
                moved = call_like(graph, node, step.target, (moved, *step.args[1:]), dict(step.kwargs))
        node.replace_all_uses_with(moved)
        graph.erase_node(node)  # an in-place op is no dead code to DCE
