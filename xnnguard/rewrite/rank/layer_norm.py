"""Run each layer norm above XNNPACK's rank limit on (rows, *normalized_shape).

Invariant established: no ``layer_norm`` with static shapes has a tensor above ``XNN_MAX_TENSOR_DIMS``
dims when its normalized dims fit; it becomes ``reshape(rows, *normalized_shape)`` -> ``layer_norm`` ->
``reshape`` to the original shape (folded into neighbouring views by ``FuseHighRankViewsPass``).

Why it is exact: a layer norm normalizes each row of its trailing ``normalized_shape`` dims on its
own; the leading dims only index rows, so they can be one dim. (Swin3D normalizes its 8-D windows.)
"""

from __future__ import annotations

import logging
import math

import torch

from xnnguard.graph.args import int_list
from xnnguard.rewrite.rank.base import (
    HighRankRewritePass,
    high_rank,
    insert_op,
    insert_reshape,
    static_input,
    user_kept_out,
)
from xnnguard.rules.rank_limit import XNN_MAX_TENSOR_DIMS, exceeds_rank_limit

__all__ = ["ReduceRankLayerNormPass"]

logger = logging.getLogger("xnnguard.rewrite")

_aten = torch.ops.aten
_LAYER_NORMS = {_aten.layer_norm.default}


class ReduceRankLayerNormPass(HighRankRewritePass):
    """Runs each high-rank layer norm on merged rows; reports the ones it cannot."""

    def picks(self, node: torch.fx.Node) -> bool:
        layer_norm = node.op == "call_function" and node.target in _LAYER_NORMS
        return layer_norm and high_rank(node) and not user_kept_out(node)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        graph = graph_module.graph
        operand = static_input(node)
        if isinstance(operand, str):
            return operand
        x, shape, output_shape = operand
        normalized = int_list(node.args[1])
        if exceeds_rank_limit(len(normalized) + 1):
            return f"it normalizes over {len(normalized)} dims: with the rows that is above {XNN_MAX_TENSOR_DIMS}"
        rows = math.prod(shape[: len(shape) - len(normalized)])
        with graph.inserting_before(node):
            merged_input = insert_reshape(graph, x, (rows, *normalized), like=node)
            merged = insert_op(graph, node.target, (merged_input, *node.args[1:]), dict(node.kwargs), like=node)
            y = insert_reshape(graph, merged, output_shape, like=node)
        node.replace_all_uses_with(y)
        logger.debug("%s: %d-D layer norm on (%d, %s)", node.name, len(shape), rows, normalized)
        return None
