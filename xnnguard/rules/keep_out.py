"""``keep_out_reason``: the one function that decides whether a node may go to XNNPACK.

It asks every rule in ``xnnguard.rules``, in a fixed order (the first that fires is the reason), so the
tag passes, the partitioner, the rewrites and the reports all decide the same way. The rules are
re-evaluated rather than read from a tag alone, so a partitioner that runs before the tag passes (as
``ops_to_not_decompose`` does) decides the same way too.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from xnnguard.graph.ops import target_name
from xnnguard.report import KeptOut, Rule
from xnnguard.rules.conv3d import conv3d_kind
from xnnguard.rules.max_reduction import max_reduction_violation
from xnnguard.rules.passthrough_output import passthrough_output_violation
from xnnguard.rules.prelu_rank import prelu_rank_violation
from xnnguard.rules.rank_limit import rank_violation
from xnnguard.rules.tagged import tag_of, tagged_rule

if TYPE_CHECKING:
    import torch

__all__ = ["keep_out_reason"]


def _tag_record(node: torch.fx.Node) -> KeptOut | None:
    reason, rule = tag_of(node), tagged_rule(node)
    if not reason or rule is None:
        return None
    said = reason if rule is not Rule.USER_TAG else f"tagged by user: {reason}"
    return KeptOut(node.name, target_name(node), rule, said)


def keep_out_reason(node: torch.fx.Node, partition: Collection[torch.fx.Node] | None = None) -> KeptOut | None:
    """Why ``node`` must not be delegated to XNNPACK, or None when nothing forbids it.

    Given the ``partition`` that would take ``node``, the rules about a partition as a whole are asked too.
    """
    if node.op != "call_function":
        return None
    violation = rank_violation(node)
    if violation is not None:
        return KeptOut(node.name, target_name(node), Rule.HIGH_RANK, violation)
    kind = conv3d_kind(node)
    if kind is not None:
        return KeptOut(node.name, target_name(node), Rule.CONV3D, f"{kind.description}: XNNPACK has no 3-D convolution")
    violation = max_reduction_violation(node)
    if violation is not None:
        return KeptOut(node.name, target_name(node), Rule.MAX_REDUCTION, violation)
    violation = prelu_rank_violation(node)
    if violation is not None:
        return KeptOut(node.name, target_name(node), Rule.PRELU_RANK, violation)
    record = _tag_record(node)
    if record is not None:
        return record
    if partition is not None:
        violation = passthrough_output_violation(node, partition)
        if violation is not None:
            return KeptOut(node.name, target_name(node), Rule.PASSTHROUGH_OUTPUT, violation)
    return None
