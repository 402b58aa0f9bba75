"""Two reshapes (or permutes) of one tensor with the same arguments are one.

Invariant established: no two statically shaped reshape or permute nodes read the same tensor with the
same arguments; the later one's readers read the earlier one. A move only places elements, so the values
are the same, bit for bit.

Why: each rewritten 3-D op folds its input on its own. S3D's inception branches each begin with a 1x1x1
conv of the block's input, and each conv folded that input into its rows layout again: three identical
chains, each a transpose out of NHWC and one back into it in XNNPACK.
"""

from __future__ import annotations

import torch

from xnnguard.rewrite.layout.base import LayoutPass
from xnnguard.rewrite.layout.movement_chains import is_movement

__all__ = ["ShareMovesPass"]


def _key(node: torch.fx.Node) -> tuple[object, ...]:
    return node.target, node.args[0], repr(node.args[1:]), repr(node.kwargs)


def _earlier_twin(node: torch.fx.Node) -> torch.fx.Node | None:
    """The first node before ``node`` that moves the same tensor the same way, if there is one."""
    if not is_movement(node) or not isinstance(node.args[0], torch.fx.Node):
        return None
    key = _key(node)
    twins = [user for user in node.args[0].users if user is not node and is_movement(user) and _key(user) == key]
    earlier = [twin for twin in twins if twin < node]
    return min(earlier) if earlier else None


class ShareMovesPass(LayoutPass[torch.fx.Node]):
    """Replaces each reshape or permute by an earlier identical one of the same tensor."""

    promise = "to leave no two identical moves of one tensor"

    def site(self, node: torch.fx.Node) -> torch.fx.Node | None:
        return _earlier_twin(node)

    def rewrite(self, graph: torch.fx.Graph, node: torch.fx.Node, site: torch.fx.Node) -> None:
        node.replace_all_uses_with(site)
