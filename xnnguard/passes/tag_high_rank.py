"""Tag every node with an input or output tensor above ``XNN_MAX_TENSOR_DIMS`` dims."""

from __future__ import annotations

import torch
from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.passes.do_not_delegate import tag_nodes
from xnnguard.passes.pass_result import ReportedPassResult
from xnnguard.report import Rule

__all__ = ["TagHighRankPass"]


class TagHighRankPass(PassBase):
    """Marks ``DO_NOT_DELEGATE`` on nodes XNNPACK would refuse at load ("Failed to define tensor").

    Postcondition: every call_function node with a tensor above 6 dims carries the tag. Idempotent.
    """

    def call(self, graph_module: torch.fx.GraphModule) -> ReportedPassResult:
        modified, found = tag_nodes(graph_module, Rule.HIGH_RANK)
        return ReportedPassResult(graph_module, modified, found)
