"""A transpose of two dims is the permute that swaps them.

Invariant established: no ``aten.transpose.int`` of a tensor of known rank is left; each is the
``aten.permute`` that swaps its two dims (the values are the same, bit for bit: ``to_edge`` makes both
one ``permute_copy``).

Why: the other layout passes follow chains of reshapes and permutes. A transpose in the middle of one
broke it: MViT's pooled attention goes from tokens ``(heads, T*H*W, C)`` to frames in the batch through
a ``transpose(2, 3)``, a reshape, a permute and a reshape, which is one permute between two reshapes.
"""

from __future__ import annotations

import torch

from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.layout.base import LayoutPass

__all__ = ["TransposesAsPermutesPass"]

_aten = torch.ops.aten


def _as_permute(node: torch.fx.Node) -> list[int] | None:
    """The dims of the permute ``node`` (a transpose) is, or None."""
    if node.op != "call_function" or node.target is not _aten.transpose.int:
        return None
    value = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return None
    rank = value.dim()
    a, b = (int(d) % rank for d in node.args[1:3])  # type: ignore[arg-type]
    dims = list(range(rank))
    dims[a], dims[b] = dims[b], dims[a]
    return dims


class TransposesAsPermutesPass(LayoutPass[list[int]]):
    """Replaces each transpose by the permute that swaps the same two dims."""

    promise = "to leave no transpose of a tensor of known rank"

    def site(self, node: torch.fx.Node) -> list[int] | None:
        return _as_permute(node)

    def rewrite(self, graph: torch.fx.Graph, node: torch.fx.Node, site: list[int]) -> None:
        with graph.inserting_before(node):
            node.replace_all_uses_with(call_like(graph, node, _aten.permute.default, (node.args[0], site)))
