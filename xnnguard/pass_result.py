"""What a pass returns (``PassResult`` plus the report of what it did), and what it raises when it breaks its word."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

import torch
from torch.fx.passes.infra.pass_base import PassResult

from xnnguard.report import KeptOut

__all__ = ["PostconditionError", "ReportedPassResult"]


class ReportedPassResult(PassResult):
    """A torch.fx ``PassResult`` (so ``PassManager`` and ``transform_passes`` accept it) with a report."""

    report: tuple[KeptOut, ...]

    def __new__(
        cls, graph_module: torch.nn.Module, modified: bool, report: Iterable[KeptOut] = ()
    ) -> ReportedPassResult:
        # torch annotates PassResult.__new__ as returning a PassResult, where it returns an instance of cls
        result = cast(ReportedPassResult, super().__new__(cls, graph_module, modified))
        result.report = tuple(report)
        return result


class PostconditionError(AssertionError):
    """A pass left the graph in a state its ``ensures`` rules out: ``nodes`` are the nodes that show it."""

    def __init__(self, pass_name: str, promise: str, nodes: Sequence[str]) -> None:
        self.pass_name, self.promise, self.nodes = pass_name, promise, tuple(nodes)
        shown = ", ".join(self.nodes[:8]) + (f" and {len(self.nodes) - 8} more" if len(self.nodes) > 8 else "")
        super().__init__(f"{pass_name} promises {promise}, but not for {shown}")
