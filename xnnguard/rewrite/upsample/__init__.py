"""Upsampling XNNPACK has no kernel for, in forms it runs: nearest (``nearest``), linear and trilinear
(``linear``; XNNPACK has a bilinear resize of its own).

``passes()`` is the family as ``default_rewrites`` runs it: before the 3-D rewrites and the rank
reduction (its pieces are at most 6-D; a decoder's upsampling sits between 3-D convolutions the Conv3d
rewrite then sees as they are).
"""

from __future__ import annotations

from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.rewrite.upsample.linear import LinearUpsamplePass
from xnnguard.rewrite.upsample.nearest import NearestUpsamplePass

__all__ = ["LinearUpsamplePass", "NearestUpsamplePass", "passes"]


def passes() -> list[PassBase]:
    """The upsampling passes, in order."""
    return [NearestUpsamplePass(), LinearUpsamplePass()]
