"""What xnnguard kept away from XNNPACK, and why: plain data, printed by whoever wants to print it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

__all__ = ["STOCK_RULES", "KeptOut", "Rule", "summarize"]


class Rule(str, Enum):
    """Why a node was kept out (or taken differently). Each is decided in exactly one module (named here).

    The rules of ``xnnguard.rules`` are listed, in the order they are asked, in ``xnnguard.rules.registry``;
    the others name records that follow from a rule or come from elsewhere (``registry.OTHER_RECORDS``).
    """

    HIGH_RANK = "high_rank"  # xnnguard.rules.rank_limit
    CONV3D = "conv3d"  # xnnguard.rules.conv3d
    USER_TAG = "user_tag"  # xnnguard.rules.tagged
    MAX_REDUCTION = "max_reduction"  # xnnguard.rules.max_reduction
    PRELU_RANK = "prelu_rank"  # xnnguard.rules.prelu_rank
    TANH_GELU = "tanh_gelu"  # xnnguard.rules.tanh_gelu
    BFLOAT16 = "bfloat16"  # xnnguard.rules.bfloat16
    PASSTHROUGH_OUTPUT = "passthrough_output"  # xnnguard.rules.passthrough_output
    NEEDS_KEPT_OUT_NODE = "needs_kept_out_node"  # an op whose partition needs a node kept out
    NOT_REWRITTEN = "not_rewritten"  # an op XNNPACK has no kernel for that a rewrite could not replace
    QUANTIZED_PAD = "quantized_pad"  # xnnguard.rules.quantized_pad
    DYNAMIC_CONV_SOURCE = "dynamic_conv_source"  # xnnguard.rules.dynamic_conv_source
    DYNAMIC_LINEAR_LAYOUT = "dynamic_linear_layout"  # xnnguard.rules.dynamic_linear_layout
    QUANTIZATION_MATCH = "quantization_match"  # xnnguard.rules.quantization_match: taken float, delegated
    EXTRA_ROUNDING = "extra_rounding"  # a rewritten form that, quantized, rounds where the original does not
    INT4_WEIGHT_BLOCKS = "int4_weight_blocks"  # xnnguard.recipes.int4_linears: int8 weights, not int4
    DYNAMIC_CONV_KIND = "dynamic_conv_kind"  # xnnguard.rules.dynamic_conv_kind: left float by a dynamic config
    NO_XNNPACK_EQUIVALENT = "no_xnnpack_equivalent"  # xnnguard.rules.no_equivalent: no XNNPACK node computes it
    NO_XNNPACK_CONFIG = "no_xnnpack_config"  # xnnguard.partition.outside: ExecuTorch has no XNNPACK config for the op
    XNNPACK_CONFIG = "xnnpack_config"  # xnnguard.partition.outside: ExecuTorch's XNNPACK config refused it


# The records of nodes no rule of xnnguard's kept out: ExecuTorch's own reason, or that nothing XNNPACK
# runs computes them.
STOCK_RULES = frozenset({Rule.NO_XNNPACK_EQUIVALENT, Rule.NO_XNNPACK_CONFIG, Rule.XNNPACK_CONFIG})


@dataclass(frozen=True)
class KeptOut:
    """One node that runs outside XNNPACK, and why.

    ``node`` is the FX node's name, ``op`` the operator (``aten.permute_copy.default``), ``rule`` which
    rule fired (one of xnnguard's, or ExecuTorch's XNNPACK configs for a node no rule of xnnguard's kept
    out) and ``reason`` one sentence for a person ("output has 8 dims > 6").
    """

    node: str
    op: str
    rule: Rule
    reason: str

    def __str__(self) -> str:
        return f"{self.node} ({self.op}): {self.reason}"


def summarize(records: Iterable[KeptOut]) -> str:
    """One line: how many nodes were kept out, by rule (``"3 nodes kept out of XNNPACK: 2 high_rank, 1 conv3d"``)."""
    counts = Counter(record.rule.value for record in records)
    total = sum(counts.values())
    if not total:
        return "no node kept out of XNNPACK"
    by_rule = ", ".join(f"{n} {rule}" for rule, n in sorted(counts.items()))
    noun = "node" if total == 1 else "nodes"
    return f"{total} {noun} kept out of XNNPACK: {by_rule}"
