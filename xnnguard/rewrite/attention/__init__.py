"""Attention ops XNNPACK has no config for, as the products and softmax it runs (``sdpa``).

``passes()`` is the family as ``default_rewrites`` runs it. It depends on no other family.
"""

from __future__ import annotations

from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.rewrite.attention.sdpa import AttentionAsBmmPass

__all__ = ["AttentionAsBmmPass", "passes"]


def passes() -> list[PassBase]:
    """The attention passes, in order."""
    return [AttentionAsBmmPass()]
