"""Run ordered passes on one graph module: keep every report, name a failing pass, check postconditions.

One loop for every composition in xnnguard (``rewrite_for_xnnpack``, ``ReduceRankPass``, the
partitioner's pre-decomposition rewrites), in the way of ``torch.fx.passes.infra.PassManager``, with
what that one drops: each pass's ``ReportedPassResult.report``. ``PassBase.__call__`` runs a pass's
``requires`` and ``ensures`` around its ``call``; a pass states a postcondition by raising
``PostconditionError`` from ``ensures``. The runner then

* by default (a user's export pipeline), records the broken postcondition as a report record, logs it
  at WARNING and goes on with the graph as the pass left it: the program is still a valid one, with
  something left undone that the report names;
* with ``strict=True`` (the test suite), raises ``RewriteError`` naming the pass, what ran before it
  and the nodes that break the postcondition.

Any other exception of a pass becomes a ``RewriteError`` naming the pass and the passes before it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.pass_result import PostconditionError, ReportedPassResult
from xnnguard.report import KeptOut, Rule

__all__ = ["PostconditionError", "RewriteError", "run_passes"]

logger = logging.getLogger("xnnguard.rewrite")


class RewriteError(RuntimeError):
    """A rewrite failed: the message names the pass, the passes that ran before it and the cause."""


def run_passes(
    passes: Sequence[PassBase], graph_module: torch.fx.GraphModule, *, strict: bool = False
) -> ReportedPassResult:
    """Run ``passes`` in order on ``graph_module``; the result holds every pass's report, in order."""
    modified = False
    report: list[KeptOut] = []
    done: list[str] = []
    for rewrite in passes:
        name = type(rewrite).__name__
        after = f" (after {', '.join(done)})" if done else ""
        try:
            result = rewrite(graph_module)
        except PostconditionError as broken:
            if strict:
                raise RewriteError(f"{name} broke its postcondition{after}: {broken}") from broken
            record = KeptOut(broken.nodes[0] if broken.nodes else "", name, Rule.NOT_REWRITTEN, str(broken))
            logger.warning("xnnguard: %s", record.reason)
            report.append(record)
            modified = True  # the pass ran to its end: the graph is what it left
            done.append(name)
            continue
        except Exception as error:  # name the pass and what ran before it, keep the cause
            raise RewriteError(f"{name} failed{after}: {error}") from error
        done.append(name)
        if result is None:
            continue
        graph_module = result.graph_module
        modified |= result.modified
        report.extend(getattr(result, "report", ()))
    return ReportedPassResult(graph_module, modified, report)
