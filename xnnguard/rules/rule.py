"""What a rule is: a check asked at one scope, with one effect when it fires.

A rule module in ``xnnguard.rules`` holds one decision and exports it as ``RULE``; ``xnnguard.rules.registry``
lists them all, in the order they are asked. Checks return the sentence that says why (``"output has 8 dims
> 6"``) or None, and import torch only inside, so the verifier can read the rules without it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from xnnguard.graph.ops import target_name
from xnnguard.report import KeptOut, Rule

if TYPE_CHECKING:
    import torch

__all__ = ["NO_CONTEXT", "Context", "Effect", "RuleCheck", "Scope"]


class Scope(str, Enum):
    """Where a rule is asked."""

    NODE = "node"  # of a node alone: tag passes, what may stay whole at decomposition, the matching loop
    PARTITION = "partition"  # of a node within the partition that would take it (the partition is known)
    MATCH = "match"  # of the nodes of a quantized config match, given the q/dq the match marks implicit
    EXPLANATION = "explanation"  # of a node no config took: why nothing XNNPACK runs could compute it


class Effect(str, Enum):
    """What happens when a rule fires."""

    KEEP_OUT = "keep_out"  # the node runs outside XNNPACK; a match that needs it is not taken
    TAKE_AS_FLOAT = "take_as_float"  # the match is taken without its q/dq: XNNPACK runs the float op
    EXPLAIN = "explain"  # nothing is decided: the record says why no XNNPACK node computes the node


@dataclass(frozen=True)
class Context:
    """What a check may look at besides the node: the partition, or the match and its implicit q/dq."""

    partition: Collection[torch.fx.Node] | None = None
    implicit: Collection[torch.fx.Node] = ()


NO_CONTEXT = Context()  # a node asked about alone


@dataclass(frozen=True)
class RuleCheck:
    """One rule: ``check(node, context)`` says why it fires on ``node``, or returns None.

    ``rule_of`` names the rule of a record when the rule that fired is not this one's own (a tag set
    by another rule's tag pass carries that rule).
    """

    rule: Rule
    scope: Scope
    decides: str  # the rule as one sentence, for the registry's reader
    check: Callable[[torch.fx.Node, Context], str | None]
    effect: Effect = Effect.KEEP_OUT
    rule_of: Callable[[torch.fx.Node], Rule] | None = None

    def record(self, node: torch.fx.Node, context: Context = NO_CONTEXT) -> KeptOut | None:
        """The record of ``node`` when this rule fires on it, else None."""
        reason = self.check(node, context)
        if reason is None:
            return None
        rule = self.rule_of(node) if self.rule_of is not None else self.rule
        return KeptOut(node.name, target_name(node), rule, reason)
