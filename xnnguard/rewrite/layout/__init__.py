"""Layout: fewer copies between the ops the other rewrites leave, with the same values."""

from __future__ import annotations

from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.rewrite.layout.cat_sinking import SinkCatThroughMovesPass
from xnnguard.rewrite.layout.elementwise_sinking import SinkElementwiseThroughMovesPass
from xnnguard.rewrite.layout.movement_chains import CollapseMovementChainsPass
from xnnguard.rewrite.layout.shared_moves import ShareMovesPass
from xnnguard.rewrite.layout.transposes import TransposesAsPermutesPass

__all__ = [
    "CollapseMovementChainsPass",
    "ShareMovesPass",
    "SinkCatThroughMovesPass",
    "SinkElementwiseThroughMovesPass",
    "TransposesAsPermutesPass",
    "passes",
]


def passes() -> list[PassBase]:
    """The layout passes, in the order they run: last of all rewrites, over what the others left.

    Transposes become permutes first (the others follow chains of permutes and reshapes); elementwise
    ops and cats move next, so that the chains they leave meet the next op's and collapse;
    identical moves of one tensor are shared before and after the chains collapse (collapsing makes
    chains of different lengths into the same one move).
    """
    return [
        TransposesAsPermutesPass(),
        ShareMovesPass(),
        SinkElementwiseThroughMovesPass(),
        SinkCatThroughMovesPass(),
        CollapseMovementChainsPass(),
        ShareMovesPass(),
    ]
