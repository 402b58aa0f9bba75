"""Run each elementwise op above XNNPACK's rank limit on merged dims.

Invariant established: no elementwise op (unary, binary or ``where``, broadcasting included) with static
shapes or one dynamic size has a tensor above ``XNN_MAX_TENSOR_DIMS`` dims when its dims can merge that
far; it becomes ``reshape`` of each operand -> the op on the merged dims -> ``reshape`` back (folded
away by ``FuseHighRankViewsPass`` when neighbours are views too).

Why it is exact: an elementwise op pairs elements by position. Adjacent output dims along which every
operand is either full or broadcast merge into one dim of their product without changing which
elements meet (``dim_groups.broadcast_groups``). When the operands' broadcast patterns alternate over
more groups than the limit, the op is left and reported.
"""

from __future__ import annotations

import torch

from xnnguard.rewrite.rank.base import NEEDS_STATIC_SIZES, MergedCall, MergedDimsPass, Reshaped
from xnnguard.rewrite.rank.dim_groups import broadcast_groups, grouped_shape
from xnnguard.rewrite.rank.sizes import shape_of
from xnnguard.rules.rank_limit import XNN_MAX_TENSOR_DIMS, exceeds_rank_limit

__all__ = ["ELEMENTWISE_OPS", "ReduceRankElementwisePass"]

_aten = torch.ops.aten

ELEMENTWISE_OPS = frozenset({
    _aten.add.Tensor, _aten.add.Scalar, _aten.sub.Tensor, _aten.sub.Scalar, _aten.rsub.Scalar,
    _aten.mul.Tensor, _aten.mul.Scalar, _aten.div.Tensor, _aten.div.Scalar, _aten.div.Tensor_mode,
    _aten.maximum.default, _aten.minimum.default, _aten.pow.Tensor_Scalar, _aten.pow.Tensor_Tensor,
    _aten.where.self, _aten.relu.default, _aten.gelu.default, _aten.sigmoid.default, _aten.tanh.default,
    _aten.neg.default, _aten.abs.default, _aten.exp.default, _aten.log.default, _aten.sqrt.default,
    _aten.rsqrt.default, _aten.square.default, _aten.floor.default, _aten.ceil.default, _aten.round.default,
    _aten.clamp.default, _aten.hardtanh.default, _aten.hardswish.default, _aten.hardsigmoid.default,
    _aten.silu.default, _aten.leaky_relu.default, _aten.elu.default, _aten.clone.default,
    _aten.reciprocal.default, _aten.erf.default, _aten._to_copy.default, _aten.to.dtype,
    _aten.eq.Tensor, _aten.eq.Scalar, _aten.ne.Tensor, _aten.ne.Scalar, _aten.lt.Tensor, _aten.lt.Scalar,
    _aten.gt.Tensor, _aten.gt.Scalar, _aten.le.Tensor, _aten.le.Scalar, _aten.ge.Tensor, _aten.ge.Scalar,
})


class ReduceRankElementwisePass(MergedDimsPass):
    """Runs each high-rank elementwise op on merged dims; reports those whose dims do not merge enough."""

    targets = ELEMENTWISE_OPS

    def merged(self, node: torch.fx.Node) -> MergedCall | str:
        output_shape = shape_of(node)
        operands = [arg for arg in node.args if isinstance(arg, torch.fx.Node)]
        shapes = [shape_of(arg) for arg in operands]
        if output_shape is None or any(shape is None for shape in shapes):
            return NEEDS_STATIC_SIZES
        if any(isinstance(value, torch.fx.Node) for value in node.kwargs.values()):
            return "a tensor passed by keyword"
        tensor_shapes = [shape for shape in shapes if shape is not None and shape]  # 0-d ones broadcast as they are
        groups = broadcast_groups(output_shape, tensor_shapes)
        if exceeds_rank_limit(len(groups)):
            return f"its operands' broadcasting leaves {len(groups)} dim groups > {XNN_MAX_TENSOR_DIMS}"
        rank = len(output_shape)

        def on_groups(arg: object) -> object:
            shape = shape_of(arg)
            if not shape:  # not a tensor, or a 0-d one
                return arg
            assert isinstance(arg, torch.fx.Node)
            return Reshaped(arg, grouped_shape(shape, rank, groups))

        return MergedCall(node.target, tuple(on_groups(arg) for arg in node.args), dict(node.kwargs))
