"""Layout: fewer copies between the ops the other rewrites leave, with the same values."""

from __future__ import annotations

from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.rewrite.layout.cat_sinking import SinkCatThroughMovesPass
from xnnguard.rewrite.layout.elementwise_sinking import SinkElementwiseThroughMovesPass
from xnnguard.rewrite.layout.movement_chains import CollapseMovementChainsPass

__all__ = ["CollapseMovementChainsPass", "SinkCatThroughMovesPass", "SinkElementwiseThroughMovesPass", "passes"]


def passes() -> list[PassBase]:
    """The layout passes, in the order they run: last of all rewrites, over what the others left.

    Elementwise ops and cats move first, so that the chains they leave meet the next op's and collapse.
    """
    return [SinkElementwiseThroughMovesPass(), SinkCatThroughMovesPass(), CollapseMovementChainsPass()]
