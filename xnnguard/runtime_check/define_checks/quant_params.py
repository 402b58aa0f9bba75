"""XNNPACK's quantization-parameter equality rule: ops that move values keep their quantization.

``xnn_subgraph_check_quantization_parameter_matches`` (src/subgraph/validation.c:200-230): when a node's
output is qint8 or quint8, its input must have exactly the output's zero point and float32 scale. An fp32
input carries no quantization (scale 0, zero point 0), so an fp32 input with a quantized output fails it
too: that is the StaticConstantPad ExecuTorch 1.5.1's ``InsertPadQDQPass`` builds (issue 13). The node
types that call it and that ExecuTorch builds, with the XNNPACK line of the call:

* StaticConstantPad (static-constant-pad.c:253), StaticSlice (static-slice.c:248),
  StaticTranspose (static-transpose.c:273), StaticReshape and Copy (copy.c:490),
  MaxPooling2d (max-pooling-2d.c:404), StaticResizeBilinear2D (static-resize-bilinear-2d.c:279):
  the input against the output;
* Concatenate2..5 (concatenate.c:327, called per input at :369-374): every input against the output.

A failure fails the load ("Failed to create <op> node ... xnn_status_invalid_parameter").
"""

from __future__ import annotations

from collections.abc import Iterator

from xnnguard.runtime_check.define_checks.base import AT_LOAD, QUANTIZED_8BIT, Finding, NodeView, quantized_label
from xnnguard.runtime_check.xnnpack_blob import PerTensorQuant, XnnValue

__all__ = ["QUANTIZATION_PRESERVING", "check_quantization_parameters_match", "compared_inputs"]

_ONE_INPUT = ("input_id",)
QUANTIZATION_PRESERVING: dict[str, tuple[str, ...]] = {
    "XNNStaticConstantPad": _ONE_INPUT,
    "XNNStaticSlice": _ONE_INPUT,
    "XNNStaticTranspose": _ONE_INPUT,
    "XNNStaticReshape": _ONE_INPUT,
    "XNNCopy": _ONE_INPUT,
    "XNNMaxPooling2d": _ONE_INPUT,
    "XNNStaticResizeBilinear2D": _ONE_INPUT,
    **{f"XNNConcatenate{n}": tuple(f"input{i}_id" for i in range(1, n + 1)) for n in range(2, 6)},
}


def _parameters(value: XnnValue) -> tuple[float, int]:
    """(scale, zero point) as XNNPACK stores them for a value: 0/0 unless it is quantized per tensor."""
    quantization = value.quantization
    if isinstance(quantization, PerTensorQuant):
        return quantization.scale, quantization.zero_point
    return 0.0, 0


def compared_inputs(op: str) -> tuple[str, ...]:
    """The id fields whose values must share the output's quantization, for a node type (none: no rule)."""
    return QUANTIZATION_PRESERVING.get(op, ())


def check_quantization_parameters_match(view: NodeView) -> Iterator[Finding]:
    """Each compared input has the output's exact (scale, zero point) when the output is qint8/quint8."""
    output = view.value("output_id")
    if output is None or output.datatype not in QUANTIZED_8BIT:
        return
    expected = _parameters(output)
    for field in compared_inputs(view.op):
        value = view.value(field)
        if value is None or _parameters(value) == expected:
            continue
        if value.datatype in QUANTIZED_8BIT:
            difference = "its input's quantization differs"
        else:
            difference = "its input is not quantized"
        yield Finding(
            "quant_params",
            f"output value {output.id} is {quantized_label(output)} but {difference} (value {value.id} is "
            f"{quantized_label(value)}): XNNPACK requires a {view.op.removeprefix('XNN')} to keep its input's "
            f"scale and zero point exactly, so {AT_LOAD}",
            value.id,
        )
