"""Constant folding: what depends only on shapes, literals and parameters is computed once, at rewrite time.

``passes()`` is the family as ``default_rewrites`` runs it. It runs first: the rewrites after it see
constants where the graph computed them (a folded weight is a plain parameter to the Conv3d rewrite),
and the views rewrite must not turn a constant's in-place mask building into run-time slices and cats.
"""

from __future__ import annotations

from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.rewrite.fold.fold_constants import FoldConstantsPass

__all__ = ["FoldConstantsPass", "passes"]


def passes() -> list[PassBase]:
    """The constant-folding passes, in order."""
    return [FoldConstantsPass()]
