"""Elementwise nodes: binary ops, unary ops, Convert, Softmax.

* Binary (Add, Subtract, Multiply, Div, Minimum, Maximum, PReLU): ``xnn_define_binary``
  (src/subgraph/binary.c:156-234) needs one datatype on both inputs and the output; the operator needs a
  kernel for it (src/operators/binary-elementwise-nd.c:141-158, src/reference/binary-elementwise.cc:356-395);
  at reshape the shapes broadcast.
* Unary (Sigmoid ... ELU, Clamp): the operator needs input datatype == output datatype, and a kernel for
  it (src/operators/unary-elementwise-nc.c get_config/init_op; src/reference/unary-elementwise.cc:514-580).
* Convert: the pair of datatypes has a kernel (src/subgraph/unary.c:26-112 and get_config).
* Softmax: fp16 or fp32, input == output (src/subgraph/softmax.c:164-200); rank >= 1 at reshape.

All of these fail the load except the reshape rules, which fail the first run.
"""

from __future__ import annotations

from collections.abc import Iterator

from xnnguard.runtime_check.define_checks.base import AT_LOAD, Finding, NodeCheck, NodeView
from xnnguard.runtime_check.define_checks.shapes import Reshape, Shape, ShapeOf, broadcast, require

__all__ = ["BINARY_OPS", "DEFINE_CHECKS", "RESHAPES", "UNARY_OPS"]

BINARY_OPS = ("XNNAdd", "XNNSubtract", "XNNMultiply", "XNNDiv", "XNNMinimum", "XNNMaximum", "XNNPReLU")
UNARY_OPS = (
    "XNNSigmoid",
    "XNNFloor",
    "XNNSquareRoot",
    "XNNReciprocalSquareRoot",
    "XNNCeiling",
    "XNNGelu",
    "XNNHardswish",
    "XNNLog",
    "XNNNegate",
    "XNNSquare",
    "XNNAbs",
    "XNNSin",
    "XNNCos",
    "XNNTanh",
    "XNNExp",
    "XNNClamp",
    "XNNLeakyReLU",
    "XNNELU",
)
_REAL = frozenset({"fp32", "fp16", "bf16", "qint8", "quint8"})
_REAL_AND_INT32 = _REAL | {"int32"}
# binary: DISPATCH_OPERATOR_FOR_DATATYPE (int32 too) for all but PReLU (REAL only)
_BINARY_DATATYPES = {op: (_REAL if op == "XNNPReLU" else _REAL_AND_INT32) for op in BINARY_OPS}
# unary reference kernels: abs, clamp, negate and square also take int32
_UNARY_DATATYPES = {
    op: (_REAL_AND_INT32 if op in ("XNNAbs", "XNNClamp", "XNNNegate", "XNNSquare") else _REAL) for op in UNARY_OPS
}
# Convert: the reference converts between any two of these (reference/unary-elementwise.cc:190-224) ...
_CONVERTIBLE = frozenset({"fp32", "fp16", "bf16", "qint8", "quint8", "int32"})
# ... plus the dynamic-quantization and channelwise converts (subgraph/unary.c:48-95)
_SPECIAL_CONVERTS = frozenset({("fp32", "qdint8"), ("fp16", "qdint8"), ("fp32", "qpint8"), ("qint8", "qcint8")})


def check_binary_datatypes_match(view: NodeView) -> Iterator[Finding]:
    """input1, input2 and output share one datatype (xnn_subgraph_check_datatype_matches_two_inputs,
    binary.c:203), and the op has a kernel for it (binary-elementwise-nd.c:141-158)."""
    a, b, out = view.value("input1_id"), view.value("input2_id"), view.value("output_id")
    if a is None or b is None or out is None:
        return
    if not a.datatype == b.datatype == out.datatype:
        yield Finding(
            "datatype",
            f"combines {a.datatype} and {b.datatype} into {out.datatype}: XNNPACK needs one datatype for both "
            f"inputs and the output, so {AT_LOAD}",
            out.id,
        )
    elif out.datatype not in _BINARY_DATATYPES[view.op]:
        yield Finding("datatype", f"has no {out.datatype} kernel in XNNPACK: {AT_LOAD}", out.id)


def check_unary_datatypes_match(view: NodeView) -> Iterator[Finding]:
    """Input datatype == output datatype, with a kernel for it (unary-elementwise-nc.c get_config and the
    reference fallback, reference/unary-elementwise.cc:581-591)."""
    source, out = view.value("input_id"), view.value("output_id")
    if source is None or out is None:
        return
    if source.datatype != out.datatype:
        yield Finding(
            "datatype",
            f"turns {source.datatype} into {out.datatype}: XNNPACK's {view.op.removeprefix('XNN')} keeps the "
            f"datatype (only Convert changes it), so {AT_LOAD}",
            out.id,
        )
    elif out.datatype not in _UNARY_DATATYPES[view.op]:
        yield Finding("datatype", f"has no {out.datatype} kernel in XNNPACK: {AT_LOAD}", out.id)


def check_convert_pair_supported(view: NodeView) -> Iterator[Finding]:
    """A Convert between two datatypes XNNPACK has a kernel for (subgraph/unary.c:26-112)."""
    source, out = view.value("input_id"), view.value("output_id")
    if source is None or out is None:
        return
    pair = (source.datatype, out.datatype)
    if pair in _SPECIAL_CONVERTS or (pair[0] in _CONVERTIBLE and pair[1] in _CONVERTIBLE):
        return
    yield Finding("datatype", f"converts {pair[0]} to {pair[1]}, which XNNPACK has no kernel for: {AT_LOAD}", out.id)


def check_softmax_datatypes(view: NodeView) -> Iterator[Finding]:
    """Softmax: input and output fp16 or fp32, and equal (src/subgraph/softmax.c:164, :187, :200)."""
    source, out = view.value("input_id"), view.value("output_id")
    if source is None or out is None:
        return
    if source.datatype not in ("fp16", "fp32") or source.datatype != out.datatype:
        yield Finding(
            "datatype",
            f"is a softmax from {source.datatype} to {out.datatype}: XNNPACK's is fp16 or fp32 on both sides, "
            f"so {AT_LOAD}",
            out.id,
        )


def reshape_binary(view: NodeView, shape_of: ShapeOf) -> dict[str, Shape]:
    """Output = the broadcast of the inputs; rank <= 6 (binary-elementwise-nd.c:285-349)."""
    shape = broadcast(shape_of("input1_id"), shape_of("input2_id"), "the inputs")
    require(len(shape) <= 6, f"the broadcast output has {len(shape)} dims, XNNPACK takes at most 6")
    return {"output_id": shape}


def reshape_same(view: NodeView, shape_of: ShapeOf) -> dict[str, Shape]:
    """Unary ops and Convert: the output takes the input's shape."""
    return {"output_id": shape_of("input_id")}


def reshape_softmax(view: NodeView, shape_of: ShapeOf) -> dict[str, Shape]:
    """Softmax over the last dim: rank >= 1 (softmax.c:64)."""
    shape = shape_of("input_id")
    require(len(shape) >= 1, "softmax of a rank-0 tensor")
    return {"output_id": shape}


DEFINE_CHECKS: dict[str, tuple[NodeCheck, ...]] = {
    **{op: (check_binary_datatypes_match,) for op in BINARY_OPS},
    **{op: (check_unary_datatypes_match,) for op in UNARY_OPS},
    "XNNConvert": (check_convert_pair_supported,),
    "XNNSoftmax": (check_softmax_datatypes,),
}
RESHAPES: dict[str, Reshape] = {
    **dict.fromkeys(BINARY_OPS, reshape_binary),
    **dict.fromkeys(UNARY_OPS, reshape_same),
    "XNNConvert": reshape_same,
    "XNNSoftmax": reshape_softmax,
}
