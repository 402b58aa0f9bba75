"""Run each layer norm above XNNPACK's rank limit on (rows, *normalized_shape).

Invariant established: no ``layer_norm`` with static shapes or one dynamic size has a tensor above
``XNN_MAX_TENSOR_DIMS`` dims when its normalized dims fit; it becomes ``reshape(rows,
*normalized_shape)`` -> ``layer_norm`` -> ``reshape`` to the original shape (folded into neighbouring
views by ``FuseHighRankViewsPass``).

Why it is exact: a layer norm normalizes each row of its trailing ``normalized_shape`` dims on its
own; the leading dims only index rows, so they can be one dim. (Swin3D normalizes its 8-D windows.)
"""

from __future__ import annotations

import math

import torch

from xnnguard.graph.args import int_list
from xnnguard.rewrite.rank.base import MergedCall, MergedDimsPass, Reshaped, first_operand
from xnnguard.rules.rank_limit import XNN_MAX_TENSOR_DIMS, exceeds_rank_limit

__all__ = ["ReduceRankLayerNormPass"]


class ReduceRankLayerNormPass(MergedDimsPass):
    """Runs each high-rank layer norm on merged rows; reports the ones it cannot."""

    targets = frozenset({torch.ops.aten.layer_norm.default})

    def merged(self, node: torch.fx.Node) -> MergedCall | str:
        operand = first_operand(node)
        if isinstance(operand, str):
            return operand
        x, shape, _ = operand
        normalized = int_list(node.args[1])
        if exceeds_rank_limit(len(normalized) + 1):
            return f"it normalizes over {len(normalized)} dims: with the rows that is above {XNN_MAX_TENSOR_DIMS}"
        rows = math.prod(shape[: len(shape) - len(normalized)])
        return MergedCall(node.target, (Reshaped(x, (rows, *normalized)), *node.args[1:]), dict(node.kwargs))
