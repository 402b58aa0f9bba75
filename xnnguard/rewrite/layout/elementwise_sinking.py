"""An elementwise op whose operands all come through the same reshapes and permutes runs before them.

Invariant established: no statically shaped elementwise op (a ReLU, an add of a residual, ...) reads
only chains of reshapes and permutes (``movement_chains.movement_chain``) that are alike, with sources of
one shape: it reads the sources, and one copy of the chain follows it. A chain others read too stays for
them.
``f(move(a), move(b)) == move(f(a, b))`` for a move that only places elements, so the values are the
same, bit for bit.

Why: the 3-D rewrites unfold their frames back to (N, C, D, H, W) after each op, and a residual add and
its ReLU sat there, between two such chains: XNNPACK transposed both operands back to run them and the
sum forth again for the next conv. Run on the sources, they leave one chain, which then collapses with
the next op's own (``CollapseMovementChainsPass``, next): R(2+1)D's blocks then stay in the layout of
their convs from one block to the next.
An in-place op is written out of place; it runs on the sources only when nothing else reads the
operand it writes, nor the views it comes through, nor their base (they share its memory).
"""

from __future__ import annotations

import torch

from xnnguard.graph.shapes import static_shape
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.layout.base import LayoutPass
from xnnguard.rewrite.layout.movement_chains import is_movement, movement_chain

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
    _aten.add.Tensor: _aten.add.Tensor,
    _aten.add_.Tensor: _aten.add.Tensor,
    _aten.sub.Tensor: _aten.sub.Tensor,
    _aten.mul.Tensor: _aten.mul.Tensor,
}

_IN_PLACE = frozenset(op for op, out_of_place in _ELEMENTWISE.items() if op is not out_of_place)


def _written_alone(chain: list[torch.fx.Node]) -> bool:
    """True when nothing but the chain itself reads its nodes and its source (the base of its views)."""
    source = chain[0].args[0]
    return isinstance(source, torch.fx.Node) and all(len(node.users) == 1 for node in (source, *chain))


def _signature(chain: list[torch.fx.Node]) -> tuple[object, ...]:
    return tuple((node.target, repr(node.args[1:]), repr(node.kwargs)) for node in chain)


def _sinkable(node: torch.fx.Node) -> list[list[torch.fx.Node]] | None:
    """The chains ``node``'s tensor operands come through, when it can run on their sources; else None."""
    if node.op != "call_function" or node.target not in _ELEMENTWISE or static_shape(node) is None:
        return None
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
    if len({static_shape(source) for source in sources}) != 1 or len({_signature(c) for c in chains}) != 1:
        return None
    return chains


class SinkElementwiseThroughMovesPass(LayoutPass[list[list[torch.fx.Node]]]):
    """Runs each elementwise op whose operands come through alike reshape/permute chains on their sources."""

    promise = "to run every such elementwise op on its sources"

    def site(self, node: torch.fx.Node) -> list[list[torch.fx.Node]] | None:
        return _sinkable(node)

    def rewrite(self, graph: torch.fx.Graph, node: torch.fx.Node, site: list[list[torch.fx.Node]]) -> None:
        source_of = {chain[-1]: chain[0].args[0] for chain in site}
        args = tuple(source_of.get(arg, arg) if isinstance(arg, torch.fx.Node) else arg for arg in node.args)
        with graph.inserting_before(node):
            moved = call_like(graph, node, _ELEMENTWISE[node.target], args, dict(node.kwargs))  # type: ignore[index]
            for step in site[0]:
                # The moves now give ``node``'s value: they stand in for it, not for the chain's pieces (a
                # rewritten mean whose last reshape moved past an add would have two results to quantize).
                moved = call_like(graph, node, step.target, (moved, *step.args[1:]), dict(step.kwargs))
        node.replace_all_uses_with(moved)
        graph.erase_node(node)  # an in-place op is no dead code to DCE
