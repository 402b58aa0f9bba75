"""The do-not-delegate tag and the tag passes that set it.

``node.meta[DO_NOT_DELEGATE]`` holds why a node must stay out of XNNPACK (``xnnguard.rules.tagged``);
``xnnguard.XnnpackPartitioner`` never delegates a tagged node. The tag passes write it for the nodes a
rule keeps out, as plain torch.fx passes: usable as ``transform_passes`` or on any graph module.
"""

from __future__ import annotations

import torch
from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.pass_result import PostconditionError, ReportedPassResult
from xnnguard.report import KeptOut, Rule
from xnnguard.rules.keep_out import keep_out_reason
from xnnguard.rules.tagged import DO_NOT_DELEGATE, tag, tag_of, tagged_rule

__all__ = ["DO_NOT_DELEGATE", "TagConv3dPass", "TagHighRankPass", "tag", "tag_nodes", "tag_of", "tagged_rule"]


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
            tag(node, record.reason, rule)
            modified = True
    return modified, found


class _TagPass(PassBase):
    """Tags every node ``rule`` keeps out. Postcondition: each of them carries the tag. Idempotent."""

    rule: Rule

    def call(self, graph_module: torch.fx.GraphModule) -> ReportedPassResult:
        modified, found = tag_nodes(graph_module, self.rule)
        return ReportedPassResult(graph_module, modified, found)

    def ensures(self, graph_module: torch.fx.GraphModule) -> None:
        untagged = [node.name for node in graph_module.graph.nodes if _kept_out_untagged(node, self.rule)]
        if untagged:
            promise = f"to tag every node the {self.rule.value} rule keeps out"
            raise PostconditionError(type(self).__name__, promise, untagged)


def _kept_out_untagged(node: torch.fx.Node, rule: Rule) -> bool:
    record = keep_out_reason(node)
    return record is not None and record.rule is rule and not tag_of(node)


class TagHighRankPass(_TagPass):
    """Marks ``DO_NOT_DELEGATE`` on nodes XNNPACK would refuse at load ("Failed to define tensor"):
    every call_function node with a tensor above 6 dims."""

    rule = Rule.HIGH_RANK


class TagConv3dPass(_TagPass):
    """Marks ``DO_NOT_DELEGATE`` on 3-D convolutions (weight of rank 5): XNNPACK has none, so their q/dq
    must stay real ops."""

    rule = Rule.CONV3D
