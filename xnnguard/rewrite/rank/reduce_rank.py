"""``ReduceRankPass``: every rank-reduction rewrite in order, then the view folding, then the report.

Invariant established: a node with a tensor above ``XNN_MAX_TENSOR_DIMS`` dims is left only where it
cannot be helped, and each such node is reported with the reason (the graph's own input or output has
that rank, an intermediate high-rank tensor is also a graph output, an op no pass reduces, a dynamic
shape). Everything else is ops within the limit that XNNPACK delegates, with the same results. What
is left is tagged ``DO_NOT_DELEGATE`` (``xnnguard.tagging.tag``: it survives re-export).

The op passes each rewrite one op in place, ending in reshapes back to its high-rank shape;
``FuseHighRankViewsPass`` runs last and folds those reshapes into their neighbours. The order of the op
passes matters once: the linear runs first, so that its activation stays next to it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.boundary.edge_ops import is_edge_op
from xnnguard.pass_result import PostconditionError, ReportedPassResult
from xnnguard.rewrite.rank.base import LEFT_ABOVE_LIMIT, VIEW_OPS, high_rank, left_high_rank, user_kept_out
from xnnguard.rewrite.rank.cat import ReduceRankCatPass
from xnnguard.rewrite.rank.elementwise import ReduceRankElementwisePass
from xnnguard.rewrite.rank.fuse_views import FuseHighRankViewsPass
from xnnguard.rewrite.rank.layer_norm import ReduceRankLayerNormPass
from xnnguard.rewrite.rank.linear import FlattenHighRankLinearPass
from xnnguard.rewrite.rank.permute import ReduceRankPermutePass
from xnnguard.rewrite.rank.reduction import ReduceRankReductionPass
from xnnguard.rewrite.rank.slice import ReduceRankSlicePass
from xnnguard.rewrite.runner import run_passes
from xnnguard.rules.rank_limit import exceeds_rank_limit, rank_violation
from xnnguard.rules.tagged import tag, tag_of

__all__ = ["ReduceRankPass", "rank_reduction_passes"]

logger = logging.getLogger("xnnguard.rewrite")


def rank_reduction_passes() -> list[PassBase]:
    """The op rewrites, then the view folding that removes the high-rank reshapes between them.

    The linear comes first: it takes along the ReLU or Hardtanh behind it, which the elementwise pass
    would otherwise rewrite apart from it.
    """
    return [
        FlattenHighRankLinearPass(),
        ReduceRankPermutePass(),
        ReduceRankElementwisePass(),
        ReduceRankReductionPass(),
        ReduceRankLayerNormPass(),
        ReduceRankCatPass(),
        ReduceRankSlicePass(),
        FuseHighRankViewsPass(),
    ]


class ReduceRankPass(PassBase):
    """Runs ``passes`` (default: ``rank_reduction_passes()``), then reports and tags every high-rank node left.

    ``strict`` (for tests) makes a pass that breaks its postcondition raise instead of being reported.
    Postcondition: every node with a tensor above the limit carries a do-not-delegate tag.
    """

    def __init__(self, passes: Sequence[PassBase] | None = None, *, strict: bool = False) -> None:
        super().__init__()
        self.passes = list(passes) if passes is not None else rank_reduction_passes()
        self.strict = strict

    def call(self, graph_module: torch.fx.GraphModule) -> ReportedPassResult:
        result = run_passes(self.passes, graph_module, strict=self.strict)
        graph_module = result.graph_module
        nodes = {node.name: node for node in graph_module.graph.nodes}
        report = [record for record in result.report if record.node in nodes]
        reported = {record.node for record in report}
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and node.name not in reported and high_rank(node):
                report.append(left_high_rank(node, _why_left(node)))
                logger.info("%s", report[-1])
        for record in report:  # the tag survives the re-export of ``rewrite_for_xnnpack``
            tag(nodes[record.node], record.reason, record.rule)
        return ReportedPassResult(graph_module, result.modified, report)

    def ensures(self, graph_module: torch.fx.GraphModule) -> None:
        nodes = graph_module.graph.nodes
        untagged = [n.name for n in nodes if n.op == "call_function" and high_rank(n) and not tag_of(n)]
        if untagged:
            raise PostconditionError(type(self).__name__, "to tag every node it leaves above the rank limit", untagged)


def _why_left(node: torch.fx.Node) -> str:
    """Why ``node`` still has a high-rank tensor after every rank-reduction pass ran."""
    violation = rank_violation(node) or "a high-rank tensor"
    if user_kept_out(node):
        reason = str(tag_of(node))
        if reason.startswith(LEFT_ABOVE_LIMIT):  # left by an earlier run of this pass: the same reason again
            return reason[len(LEFT_ABOVE_LIMIT) :]
        return f"{violation}: tagged do-not-delegate ({reason}), so left as it is"
    high_inputs = [arg for arg in node.all_input_nodes if _high_rank_output(arg)]
    if any(arg.op == "placeholder" for arg in high_inputs):
        return f"{violation}: the graph's own input has that rank"
    if _high_rank_output(node) and any(user.op == "output" for user in node.users):
        return f"{violation}: the tensor is a graph output"
    if is_edge_op(node.target):
        return f"{violation}: an edge-dialect op; run ReduceRankPass on the ATen program (rewrite_for_xnnpack)"
    if node.target not in VIEW_OPS:
        return f"{violation}: no rank-reduction rewrite for this op (or its dims do not merge far enough)"
    others = sorted({str(user.target) for user in node.users if user.op == "call_function"})
    return f"{violation}: its tensor is also read by {', '.join(others) or 'a node'} that keeps the rank"


def _high_rank_output(node: torch.fx.Node) -> bool:
    """True when ``node``'s own tensor (not an input) is above the limit."""
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and exceeds_rank_limit(value.dim())
