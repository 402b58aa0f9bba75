"""Every rule of xnnguard's, in the one order they are asked: the list the partitioner, the tag passes and
the reports read.

To add a rule: a module in ``xnnguard/rules/`` holding the check and exporting ``RULE`` (a
``RuleCheck``: its ``Rule`` member, scope, sentence and effect), an entry here in the place it must be
asked, and a test that makes it fire (``tests/test_rule_registry.py`` fails until there is one).

The first rule that fires on a node is its reason. A tag comes after the structural rules, so a node a
tag pass tagged reports the same rule either way, and the partition-level rule last, since it needs the
partition.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from xnnguard.report import KeptOut, Rule
from xnnguard.rules import (
    bfloat16,
    conv3d,
    dynamic_conv_source,
    dynamic_linear_layout,
    max_reduction,
    no_equivalent,
    passthrough_output,
    prelu_rank,
    quantization_match,
    quantized_pad,
    rank_limit,
    tagged,
    tanh_gelu,
)
from xnnguard.rules.rule import NO_CONTEXT, Context, Effect, RuleCheck, Scope

if TYPE_CHECKING:
    import torch

__all__ = ["OTHER_RECORDS", "RULES", "first_record", "rules"]

RULES: tuple[RuleCheck, ...] = (
    rank_limit.RULE,
    conv3d.RULE,
    max_reduction.RULE,
    prelu_rank.RULE,
    tanh_gelu.RULE,
    bfloat16.RULE,
    tagged.RULE,
    passthrough_output.RULE,
    quantized_pad.RULE,
    dynamic_conv_source.RULE,
    dynamic_linear_layout.RULE,
    quantization_match.RULE,
    no_equivalent.RULE,
)

# The records no rule module decides: where each comes from.
OTHER_RECORDS: dict[Rule, str] = {
    Rule.NEEDS_KEPT_OUT_NODE: "xnnguard.partition: a match or partition member that needs a node a rule kept out",
    Rule.NOT_REWRITTEN: "xnnguard.rewrite: an op XNNPACK has no kernel for that a rewrite left as it was",
    Rule.EXTRA_ROUNDING: "xnnguard.quantizer: a rewritten form that, quantized, rounds where the original does not",
    Rule.INT4_WEIGHT_BLOCKS: "xnnguard.recipes.int4_linears: a linear XNNPACK takes no int4 weights for gets int8 ones",
    Rule.DYNAMIC_CONV_KIND: "xnnguard.quantizer: a conv XNNPACK runs no dynamically quantized stays float",
    Rule.NO_XNNPACK_CONFIG: "xnnguard.partition.outside: ExecuTorch has no XNNPACK config for the operator",
    Rule.XNNPACK_CONFIG: "xnnguard.partition.outside: ExecuTorch's XNNPACK config refused the node",
}


def rules(*scopes: Scope, effect: Effect | None = None) -> Iterator[RuleCheck]:
    """The registered rules asked at ``scopes`` (with ``effect``, if given), in order."""
    return (r for r in RULES if r.scope in scopes and (effect is None or r.effect is effect))


def first_record(node: torch.fx.Node, *scopes: Scope, context: Context = NO_CONTEXT,
                 effect: Effect | None = None) -> KeptOut | None:
    """The record of the first rule at ``scopes`` that fires on ``node``, or None."""
    for rule in rules(*scopes, effect=effect):
        record = rule.record(node, context)
        if record is not None:
            return record
    return None
