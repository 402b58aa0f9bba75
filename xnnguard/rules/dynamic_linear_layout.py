"""A dynamically quantized linear is taken only where 1.5.1 need not convert its input from channels-last.

Before serializing a delegate, 1.5.1's ``ChannelsLastTaggedReshapePass`` gives a linear an NCHW input.
When the 4-D tensor a linear quantizes comes from a conv or pooling, XNNPACK holds it NHWC, and the pass
converts the linear's input with a copy: a statically quantized input between a new quantize and
dequantize, but a dynamically quantized one (its scale chosen at run time, ``dequantize_per_tensor.tensor``)
as if it were float. The linear then reads a float tensor with int8 weights and the lowering fails
(``RuntimeError: Weight and Input should both be quantized``), stock too: ``avg_pool2d -> linear`` over the
width in dynamic int8 (fuzz seed 18).

Such a linear is not delegated, neither whole nor once decomposed (a view, then ``addmm``): it runs on the
portable kernels, quantized as the model was, right.
``xnnguard.XNNPACKQuantizer`` gives it a 2-D input instead (``xnnguard.quantizer.dynamic_linear_input``),
and it stays on XNNPACK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xnnguard.graph.channels_last import may_be_channels_last
from xnnguard.graph.ops import is_op
from xnnguard.report import Rule
from xnnguard.rules.dynamic_conv_source import is_dynamic_dequantize
from xnnguard.rules.rule import RuleCheck, Scope

if TYPE_CHECKING:
    import torch

__all__ = ["RULE", "dynamic_linear_layout_violation"]

_VIEWS = frozenset({"view", "view_copy", "reshape", "_unsafe_view"})


def dynamic_linear_layout_violation(node: torch.fx.Node) -> str | None:
    """Why ``node``, a linear reading a dynamically quantized 4-D input 1.5.1 may hold NHWC, cannot be delegated."""
    dequantize = _matrix_input(node)
    if not is_dynamic_dequantize(dequantize):
        return None
    quantized = _first_arg(_first_arg(dequantize))  # dequantize(quantize(x)): x
    value = getattr(quantized, "meta", {}).get("val")
    if getattr(value, "ndim", None) != 4 or not may_be_channels_last(quantized):  # type: ignore[arg-type]
        return None
    return (
        f"its input {getattr(quantized, 'name', '?')} is dynamically quantized and may be channels-last (a "
        "conv's or pooling's output): ExecuTorch 1.5.1 would convert it for the linear as a float tensor and "
        "fail ('Weight and Input should both be quantized'); xnnguard.XNNPACKQuantizer gives such a linear a "
        "2-D input and keeps it on XNNPACK"
    )


def _matrix_input(node: object) -> object:
    """The tensor a linear multiplies: its input, or, once it is decomposed (``view -> addmm``), the view's."""
    if is_op(node, "linear"):
        return _first_arg(node)
    if not is_op(node, frozenset({"addmm", "mm"})):
        return None
    rows = getattr(node, "args", ())[1 if is_op(node, "addmm") else 0]
    return _first_arg(rows) if is_op(rows, _VIEWS) else rows


def _first_arg(node: object) -> object:
    args = getattr(node, "args", ())
    return args[0] if args else None


RULE = RuleCheck(
    Rule.DYNAMIC_LINEAR_LAYOUT,
    Scope.NODE,
    "a dynamically quantized linear is taken only where 1.5.1 need not convert its 4-D input from channels-last",
    lambda node, _context: dynamic_linear_layout_violation(node),
)
