"""Tag every 3-D convolution and 3-D transposed convolution (weight of rank 5)."""

from __future__ import annotations

import torch
from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.passes.do_not_delegate import tag_nodes
from xnnguard.passes.pass_result import ReportedPassResult
from xnnguard.report import Rule

__all__ = ["TagConv3dPass"]


class TagConv3dPass(PassBase):
    """Marks ``DO_NOT_DELEGATE`` on 3-D convolutions: XNNPACK has none, so their q/dq must stay real ops.

    Postcondition: every convolution whose weight has rank 5 carries the tag. Idempotent.
    """

    def call(self, graph_module: torch.fx.GraphModule) -> ReportedPassResult:
        modified, found = tag_nodes(graph_module, Rule.CONV3D)
        return ReportedPassResult(graph_module, modified, found)
