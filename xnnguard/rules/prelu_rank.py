"""XNNPACK's PReLU runs on 4-D tensors only.

This module is the one place that rule lives. ExecuTorch 1.5.1 keeps ``aten.prelu`` whole for XNNPACK
whatever its rank, and lowers it channels-last: ``ChannelsLastTaggedReshapePass`` converts its input to
NHWC, which only a 4-D tensor can be ("Attempting to convert non-NHWC compatible node to NHWC"). A
PReLU on any other rank must decompose (``to_backend`` programs already have it decomposed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xnnguard.graph.ops import is_op
from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rules.rule import RuleCheck, Scope

if TYPE_CHECKING:
    import torch

__all__ = ["RULE", "is_prelu", "prelu_rank_violation"]

PRELU_RANK = 4


def is_prelu(node: torch.fx.Node) -> bool:
    """True for ``aten.prelu.default`` in any dialect."""
    return is_op(node, "prelu", "default")


def prelu_rank_violation(node: torch.fx.Node) -> str | None:
    """Why XNNPACK cannot lower the PReLU ``node``, or None when it can (or it is no PReLU)."""
    value = tensor_value(node.args[0]) if is_prelu(node) else None
    if value is None or value.dim() == PRELU_RANK:
        return None
    return f"PReLU on a {value.dim()}-D input: XNNPACK runs PReLU channels-last, on 4-D tensors only"


RULE = RuleCheck(
    Rule.PRELU_RANK,
    Scope.NODE,
    f"PReLU is taken on {PRELU_RANK}-D tensors only",
    lambda node, _context: prelu_rank_violation(node),
)
