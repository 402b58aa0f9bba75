"""``PassResult`` plus the report of what the pass did: passes stay pure functions of the graph."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
from torch.fx.passes.infra.pass_base import PassResult

from xnnguard.report import KeptOut

__all__ = ["ReportedPassResult"]


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
