"""``PassResult`` plus the report of what the pass did: passes stay pure functions of the graph."""

from __future__ import annotations

from collections.abc import Iterable

from torch.fx.passes.infra.pass_base import PassResult

from xnnguard.report import KeptOut

__all__ = ["ReportedPassResult"]


class ReportedPassResult(PassResult):
    """A torch.fx ``PassResult`` (so ``PassManager`` and ``transform_passes`` accept it) with a report."""

    report: tuple[KeptOut, ...]

    def __new__(cls, graph_module, modified: bool, report: Iterable[KeptOut] = ()) -> ReportedPassResult:  # type: ignore[no-untyped-def]
        result = super().__new__(cls, graph_module, modified)
        result.report = tuple(report)
        return result
