"""``keep_out_reason``: the one function that decides whether a node may go to XNNPACK.

It asks the node- and partition-level rules of ``xnnguard.rules.registry``, in its order (the first that
fires is the reason), so the tag passes, the partitioner, the rewrites and the reports all decide the
same way. The rules are re-evaluated rather than read from a tag alone, so a partitioner that runs before
the tag passes (as ``ops_to_not_decompose`` does) decides the same way too.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from xnnguard.report import KeptOut
from xnnguard.rules.registry import first_record
from xnnguard.rules.rule import Context, Scope

if TYPE_CHECKING:
    import torch

__all__ = ["keep_out_reason"]


def keep_out_reason(node: torch.fx.Node, partition: Collection[torch.fx.Node] | None = None) -> KeptOut | None:
    """Why ``node`` must not be delegated to XNNPACK, or None when nothing forbids it.

    Given the ``partition`` that would take ``node``, the rules about a partition as a whole are asked too.
    """
    if node.op != "call_function":
        return None
    scopes = (Scope.NODE,) if partition is None else (Scope.NODE, Scope.PARTITION)
    return first_record(node, *scopes, context=Context(partition=partition))
