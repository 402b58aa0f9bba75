"""The do-not-delegate tag, and the one function that decides whether a node may go to XNNPACK.

``node.meta[DO_NOT_DELEGATE]`` holds a string saying why the node must stay out of XNNPACK. The tag
passes write it; a user may write it on any node (in a transform pass, or on the edge program before
``to_backend``) to keep that node out for a reason of their own. ``xnnguard.XnnpackPartitioner``
never delegates a tagged node.

xnnguard's own passes also mirror the tag into ``node.meta["custom"]``: ``torch.export`` and
``to_edge`` carry that dict over to the nodes they retrace, while they drop other meta keys and
renumber node names, so a tag set before ``rewrite_for_xnnpack`` re-exports survives to the partitioner.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from xnnguard.conv3d import conv3d_kind
from xnnguard.max_reduction import max_reduction_violation
from xnnguard.passthrough_output import passthrough_output_violation
from xnnguard.prelu_rank import prelu_rank_violation
from xnnguard.rank_limit import rank_violation
from xnnguard.report import KeptOut, Rule

__all__ = ["DO_NOT_DELEGATE", "keep_out_reason", "op_name", "tag", "tag_of"]

DO_NOT_DELEGATE = "xnnguard_do_not_delegate"
_CUSTOM = "custom"  # the meta dict torch.export and to_edge carry over when they retrace a node


def tag(node: torch.fx.Node, reason: str) -> None:
    """Tag ``node`` do-not-delegate with ``reason``, unless it already has a tag (a user's is kept)."""
    reason = tag_of(node) or reason
    node.meta[DO_NOT_DELEGATE] = reason
    node.meta.setdefault(_CUSTOM, {})[DO_NOT_DELEGATE] = reason


def tag_of(node: torch.fx.Node) -> str | None:
    """The do-not-delegate reason of ``node`` (set directly, or carried over a re-export), or None."""
    return node.meta.get(DO_NOT_DELEGATE) or (node.meta.get(_CUSTOM) or {}).get(DO_NOT_DELEGATE) or None


def op_name(node: torch.fx.Node) -> str:
    """A readable operator name (``aten.permute_copy.default``) for reports."""
    target = node.target
    name = getattr(target, "__name__", None) or str(target)
    return name if node.op == "call_function" else f"{node.op}:{name}"


def keep_out_reason(node: torch.fx.Node, partition: Collection[torch.fx.Node] | None = None) -> KeptOut | None:
    """Why ``node`` must not be delegated to XNNPACK, or None when nothing forbids it.

    The rules are re-evaluated rather than read from the tag alone, so a partitioner that runs
    before the tag passes (as ``ops_to_not_decompose`` does) decides the same way. Given the
    ``partition`` that would take ``node``, the rules about a partition as a whole are asked too.
    """
    if node.op != "call_function":
        return None
    violation = rank_violation(node)
    if violation is not None:
        return KeptOut(node.name, op_name(node), Rule.HIGH_RANK, violation)
    kind = conv3d_kind(node)
    if kind is not None:
        return KeptOut(node.name, op_name(node), Rule.CONV3D, f"{kind.description}: XNNPACK has no 3-D convolution")
    violation = max_reduction_violation(node)
    if violation is not None:
        return KeptOut(node.name, op_name(node), Rule.MAX_REDUCTION, violation)
    violation = prelu_rank_violation(node)
    if violation is not None:
        return KeptOut(node.name, op_name(node), Rule.PRELU_RANK, violation)
    reason = tag_of(node)
    if reason:
        return KeptOut(node.name, op_name(node), Rule.USER_TAG, f"tagged by user: {reason}")
    if partition is not None:
        violation = passthrough_output_violation(node, partition)
        if violation is not None:
            return KeptOut(node.name, op_name(node), Rule.PASSTHROUGH_OUTPUT, violation)
    return None


def tag_nodes(graph_module: torch.fx.GraphModule, rule: Rule) -> tuple[bool, list[KeptOut]]:
    """Tag every node that ``rule`` keeps out; return (whether any tag changed, what the rule found).

    A node that already carries a tag keeps it: a user's reason is never overwritten, and running a
    tag pass twice changes nothing the second time.
    """
    modified = False
    found: list[KeptOut] = []
    for node in graph_module.graph.nodes:
        record = keep_out_reason(node)
        if record is None or record.rule is not rule:
            continue
        found.append(record)
        if not tag_of(node):
            tag(node, record.reason)
            modified = True
    return modified, found
