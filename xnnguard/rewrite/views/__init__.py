"""Views and data movement XNNPACK has no config for, as the slices, reshapes, cats, broadcasts and bmm it runs.

``passes()`` is the family as ``default_rewrites`` runs it, after constant folding (which takes the
constant in-place mask building out first) and before the 3-D and rank rewrites. Its order:

1. in-place slice updates become slices and ``cat`` first, so the later passes see functional views;
2. the single-view rewrites (``select``/``squeeze``/``unbind``/``split``..., strided slices, ``roll``,
   gathers by constant indices, selections by a constant mask, ``expand``/``repeat``, batched
   ``matmul``/``einsum``), which do not depend on one another;
3. constant folding again: the rewrites expose constants of their own (the permuted constant operand
   of an einsum, the ``ones`` of a broadcast read by another constant).
"""

from __future__ import annotations

from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.rewrite.fold.fold_constants import FoldConstantsPass
from xnnguard.rewrite.views.constant_gather import ConstantGatherPass
from xnnguard.rewrite.views.constant_where import ConstantWherePass
from xnnguard.rewrite.views.expand import BroadcastViewsPass
from xnnguard.rewrite.views.gather_in_index_shape import GatherInIndexShapePass
from xnnguard.rewrite.views.inplace_updates import InPlaceSliceUpdatesPass
from xnnguard.rewrite.views.matmul import MatmulAsBmmPass
from xnnguard.rewrite.views.roll import RollAsSlicesPass
from xnnguard.rewrite.views.slices import ViewsAsSlicesPass
from xnnguard.rewrite.views.strided_slice import StridedSliceAsReshapePass

__all__ = [
    "BroadcastViewsPass",
    "ConstantGatherPass",
    "ConstantWherePass",
    "GatherInIndexShapePass",
    "InPlaceSliceUpdatesPass",
    "MatmulAsBmmPass",
    "RollAsSlicesPass",
    "StridedSliceAsReshapePass",
    "ViewsAsSlicesPass",
    "passes",
]


def passes() -> list[PassBase]:
    """The views passes, in order."""
    return [
        InPlaceSliceUpdatesPass(),
        ViewsAsSlicesPass(),
        StridedSliceAsReshapePass(),
        RollAsSlicesPass(),
        GatherInIndexShapePass(),
        ConstantGatherPass(),
        ConstantWherePass(),
        BroadcastViewsPass(),
        MatmulAsBmmPass(),
        FoldConstantsPass(),
    ]
