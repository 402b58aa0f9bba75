"""Run each linear on an input above XNNPACK's rank limit as a 2-D linear.

Invariant established: no ``aten.linear`` with static shapes has an input or output above
``XNN_MAX_TENSOR_DIMS`` dims; it becomes ``reshape(rows, in_features)`` -> ``linear`` ->
``reshape`` back (folded into neighbouring views by ``FuseHighRankViewsPass``).

Why: a linear treats all leading dims as independent rows, so they are one dim. On 2-D the linear is
the ordinary case every quantizer and XNNPACK's fully-connected op take: pt2e static and dynamic
quantization applied after this pass quantize it like any other linear, where a quantized linear on
an 8-D input would stay outside XNNPACK (upstream's "still not covered" case).
"""

from __future__ import annotations

import logging
import math

import torch
from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.passes.high_rank_nodes import high_rank, insert_op, insert_reshape, left_high_rank, static_shape
from xnnguard.passes.pass_result import ReportedPassResult
from xnnguard.report import KeptOut

__all__ = ["FlattenHighRankLinearPass"]

logger = logging.getLogger("xnnguard.rewrite")

_aten = torch.ops.aten


class FlattenHighRankLinearPass(PassBase):
    """Runs each linear on a high-rank input as a 2-D linear; reports the ones it cannot."""

    @staticmethod
    def picks(node: torch.fx.Node) -> bool:
        return node.op == "call_function" and node.target is _aten.linear.default and high_rank(node)

    def call(self, graph_module: torch.fx.GraphModule) -> ReportedPassResult:
        report: list[KeptOut] = []
        modified = False
        for node in list(graph_module.graph.nodes):
            if not self.picks(node):
                continue
            reason = self._rewrite(graph_module.graph, node)
            if reason is None:
                modified = True
            else:
                report.append(left_high_rank(node, reason))
                logger.info("%s", report[-1])
        if modified:
            graph_module.graph.eliminate_dead_code()
            graph_module.graph.lint()
            graph_module.recompile()
        return ReportedPassResult(graph_module, modified, report)

    @staticmethod
    def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node) -> str | None:
        x = node.args[0]
        shape, output_shape = static_shape(x), static_shape(node)
        if shape is None or output_shape is None:
            return "dynamic shape: flattening needs static sizes"
        assert isinstance(x, torch.fx.Node)
        rows = math.prod(shape[:-1])
        with graph.inserting_before(node):
            flat = insert_reshape(graph, x, (rows, shape[-1]), like=node)
            linear = insert_op(graph, node.target, (flat, *node.args[1:]), dict(node.kwargs), like=node)
            y = insert_reshape(graph, linear, output_shape, like=node)
        node.replace_all_uses_with(y)
        logger.debug("%s: linear on a %d-D input flattened to (%d, %d)", node.name, len(shape), rows, shape[-1])
        return None
