"""XNNPACK's GELU is the erf GELU: a tanh GELU is not taken.

This module is the one place that rule lives. ExecuTorch 1.5.1's ``GeluConfig`` takes a float32 ``gelu``
whatever its ``approximate``, and its ``GeluVisitor`` serializes XNNPACK's GELU node without it, so a
``gelu(x, approximate="tanh")`` ran as the erf GELU, up to 4.7e-4 off (fuzz seed 100, stock too).
``xnnguard.rewrite.tanh_gelu`` writes a float32 one in ops XNNPACK computes right; one left as it is
(a program not rewritten) runs on the portable kernel, which computes the tanh GELU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xnnguard.graph.ops import is_op
from xnnguard.report import Rule
from xnnguard.rules.rule import RuleCheck, Scope

if TYPE_CHECKING:
    import torch

__all__ = ["RULE", "is_tanh_gelu", "tanh_gelu_violation"]


def is_tanh_gelu(node: torch.fx.Node) -> bool:
    """True for ``gelu(x, approximate="tanh")`` in any dialect."""
    if not is_op(node, "gelu", "default"):
        return False
    approximate = node.args[1] if len(node.args) > 1 else node.kwargs.get("approximate", "none")
    return approximate == "tanh"


def tanh_gelu_violation(node: torch.fx.Node) -> str | None:
    """Why XNNPACK would compute ``node`` wrong, or None (it is no tanh GELU)."""
    if not is_tanh_gelu(node):
        return None
    return 'GELU with approximate="tanh": ExecuTorch 1.5.1 serializes XNNPACK\'s GELU without it (the erf GELU)'


RULE = RuleCheck(
    Rule.TANH_GELU,
    Scope.NODE,
    'a GELU is taken only as the erf GELU (approximate="none"), the one XNNPACK computes',
    lambda node, _context: tanh_gelu_violation(node),
)
