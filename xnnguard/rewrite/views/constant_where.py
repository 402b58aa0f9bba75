"""A selection by a constant mask between a tensor and a constant as a clamp between two constant bounds.

Invariant established: no ``where`` / ``masked_fill`` on a floating-point tensor whose condition is a
constant and whose other operand is a number or a constant is left. XNNPACK has no select: ExecuTorch
1.5.1 ran each on portable kernels, with the ``scalar_tensor`` of its fill, between delegates. They come
from hand-written attention (``scores.masked_fill(~causal, finfo.min)`` with a constant causal mask,
fuzz seed 194) and from masks a model builds from its input's shape (constants once ``FoldConstantsPass``
ran).

The form: ``where(keep, x, fill)`` is ``minimum(maximum(x, low), high)`` with ``low`` = -inf where ``x``
is kept and ``fill`` elsewhere, ``high`` = +inf where kept and ``fill`` elsewhere (both constants of the
result's shape and dtype). Why it is exact: where kept, ``x`` clamped to (-inf, +inf) is ``x``,
infinities included; elsewhere, ``maximum(x, fill)`` is at least ``fill`` and its minimum with ``fill``
is ``fill``, whatever finite or infinite ``x`` is. (A NaN in ``x`` where the mask drops it gives what
XNNPACK's ``maximum`` makes of a NaN, not ``fill``.) A multiply by the mask would not do: ``inf * 0`` is
NaN. int8: the stock quantizer leaves ``where`` float; so are the pieces.
"""

from __future__ import annotations

import torch

from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.constants import constant_value
from xnnguard.rewrite.views.base import AliasAwarePass, replace_by

__all__ = ["ConstantWherePass", "clamp_bounds", "select_by_bounds"]

_aten = torch.ops.aten
_WHERE = frozenset({_aten.where.self, _aten.where.ScalarOther, _aten.where.ScalarSelf})
_MASKED_FILL = frozenset({_aten.masked_fill.Scalar, _aten.masked_fill.Tensor})


def clamp_bounds(keep: torch.Tensor, fill: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> tuple[
    torch.Tensor, torch.Tensor
]:
    """``(low, high)`` of ``select_by_bounds`` for ``where(keep, x, fill)`` with a result of ``shape``.

    Each is made at the smallest shape ``keep`` and ``fill`` broadcast to (the multiply broadcasts the rest).
    """
    keep, fill = torch.broadcast_tensors(keep, fill.to(dtype))
    inf = torch.tensor(float("inf"), dtype=dtype)
    low, high = torch.where(keep, -inf, fill), torch.where(keep, inf, fill)
    while low.dim() > len(shape) and low.shape[0] == 1:  # a mask of more dims than the result
        low, high = low[0], high[0]
    return low.contiguous(), high.contiguous()


def select_by_bounds(x: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """``where(keep, x, fill)`` for the bounds ``clamp_bounds`` made of ``keep`` and ``fill``."""
    return torch.minimum(torch.maximum(x, low), high)


def _operands(node: torch.fx.Node) -> tuple[object, object, object, bool] | None:
    """``(condition, tensor, other, tensor_where_true)`` of a where / masked_fill, else None."""
    if node.target in _MASKED_FILL:
        x, mask, fill = node.args[:3]
        return mask, x, fill, False  # the fill where the mask is true
    if node.target in _WHERE:
        condition, a, b = node.args[:3]
        if isinstance(a, torch.fx.Node) and not isinstance(b, torch.fx.Node):
            return condition, a, b, True
        if isinstance(b, torch.fx.Node) and not isinstance(a, torch.fx.Node):
            return condition, b, a, False
        return condition, a, b, True  # both nodes: one of them must be a constant
    return None


class ConstantWherePass(AliasAwarePass):
    """Rewrites each where / masked_fill by a constant mask with a constant fill into maximum, minimum."""

    rule = Rule.NOT_REWRITTEN  # reported; the portable kernels run what is left
    tags_what_it_leaves = False  # untagged: the partitioner decides about what is left
    subject = "selection by a constant mask"
    pieces_stay_float = True

    def chooses(self, node: torch.fx.Node) -> bool:
        return node.target in _WHERE or node.target in _MASKED_FILL

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        operands = _operands(node)
        out = tensor_value(node)
        if operands is None or out is None or not out.dtype.is_floating_point:
            return "its result is not a floating-point tensor (XNNPACK clamps floating-point ones)"
        condition, x, other, kept_where_true = operands
        mask = constant_value(graph_module, condition)
        if mask is None or mask.dtype != torch.bool:
            return "its condition is computed at run time"
        fill = torch.tensor(other) if isinstance(other, (int, float)) else constant_value(graph_module, other)
        if fill is None and isinstance(x, torch.fx.Node):  # where(mask, constant, x)
            fill, x, kept_where_true = constant_value(graph_module, x), other, not kept_where_true
        if fill is None or not isinstance(x, torch.fx.Node):
            return "neither of its values is a constant"
        value = tensor_value(x)
        if value is None or value.dtype != out.dtype or tuple(value.shape) != tuple(out.shape):
            return "its tensor is broadcast by the selection"
        low, high = clamp_bounds(mask if kept_where_true else ~mask, fill, out.shape, out.dtype)
        replace_by(graph_module, node, select_by_bounds, [x, low, high])
        return None
