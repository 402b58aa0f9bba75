"""Pooling nodes: MaxPooling2d, AvgPooling2d, GlobalAvgPooling2d.

Sources (XNNPACK 92a7ad50):

* MaxPooling2d: ``xnn_define_max_pooling_2d`` (src/subgraph/max-pooling-2d.c:280-439; its quantization
  rule is in ``quant_params``), create (src/operators/max-pooling-nhwc.c:40-175), reshape
  (max-pooling-2d.c:128-230: rank >= 4; max-pooling-nhwc.c:391-440).
* AvgPooling2d: ``xnn_define_average_pooling_2d`` (src/subgraph/average-pooling-2d.c:184-315), create
  (src/operators/average-pooling-nhwc.c:55-150), reshape (average-pooling-2d.c:80-100: rank == 4).
* GlobalAvgPooling2d: a mean over axes (rank-3, rank-2) of the *serialized* input rank
  (src/subgraph/deprecated.c:137-172), ``xnn_define_static_reduce_v2`` (src/subgraph/static-reduce.c:292-388),
  reshape (:100-175: each axis, negative ones counted from the end, lies in the runtime rank).

ArgMaxPooling2d has no checks here: ExecuTorch 1.5.1's partitioner never builds one (a max pooling whose
indices are used stays outside XNNPACK), so its outputs' shapes are left unknown.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from xnnguard.runtime_check.define_checks.base import AT_LOAD, QUANTIZED_8BIT, Finding, NodeCheck, NodeView
from xnnguard.runtime_check.define_checks.shapes import Reshape, Shape, ShapeOf, require, require_allocatable

__all__ = ["DEFINE_CHECKS", "RESHAPES"]

_SAME_PADDING = 0x4
_KEEP_DIMS = 0x40
_MAX_POOL_DATATYPES = frozenset({"fp16", "fp32", "qint8", "quint8"})
_AVG_POOL_DATATYPES = frozenset({"fp16", "fp32"})


def _padding(view: NodeView) -> tuple[int, int]:
    return (
        view.param("padding_top") + view.param("padding_bottom"),
        view.param("padding_left") + view.param("padding_right"),
    )


def check_pooling_parameters(view: NodeView) -> Iterator[Finding]:
    """Pooling size non-zero (a uint32 product, max-pooling-2d.c:303), stride and dilation positive
    (:312, :319; average pooling has no dilation, :214); SAME padding excludes explicit padding (:332)."""
    size = (view.param("pooling_height") * view.param("pooling_width")) & 0xFFFFFFFF
    names = ["stride_height", "stride_width"]
    if view.op == "XNNMaxPooling2d":
        names += ["dilation_height", "dilation_width"]
    zero = [name for name in names if not view.param(name)]
    if not size:
        yield Finding(
            "node_params", f"has pooling size {view.param('pooling_height')}x{view.param('pooling_width')}: {AT_LOAD}"
        )
    if zero:
        yield Finding(
            "node_params", f"has {', '.join(f'{n} 0' for n in zero)}: XNNPACK needs them positive, so {AT_LOAD}"
        )
    if view.param("flags") & _SAME_PADDING and any(_padding(view)):
        yield Finding("node_params", f"has SAME padding (flag 0x4) and explicit padding: {AT_LOAD}")


def check_pooling_min_max(view: NodeView) -> Iterator[Finding]:
    """``output_min_max`` is not NaN and min <= max (xnn_subgraph_check_output_min_max, max-pooling-2d.c:326,
    average-pooling-2d.c:222)."""
    low, high = view.min_max()
    if math.isnan(low) or math.isnan(high) or low > high:
        yield Finding("node_params", f"clamps its output to [{low}, {high}]: XNNPACK needs min <= max, so {AT_LOAD}")


def check_max_pooling_datatypes(view: NodeView) -> Iterator[Finding]:
    """Input and output one of fp16, fp32, qint8, quint8, and equal (max-pooling-2d.c:356, :381, :398). An
    fp32 input with a quantized output is the quantization rule's (``quant_params``)."""
    source, out = view.value("input_id"), view.value("output_id")
    if source is None or out is None:
        return
    if out.datatype in QUANTIZED_8BIT and source.datatype not in QUANTIZED_8BIT:
        return
    if source.datatype not in _MAX_POOL_DATATYPES or source.datatype != out.datatype:
        yield Finding(
            "datatype",
            f"max-pools {source.datatype} into {out.datatype}: XNNPACK needs one of "
            f"{', '.join(sorted(_MAX_POOL_DATATYPES))} on both sides, so {AT_LOAD}",
            out.id,
        )


def check_average_pooling_datatypes(view: NodeView) -> Iterator[Finding]:
    """Input and output fp16 or fp32: XNNPACK has no quantized average pooling (average-pooling-2d.c:252,
    :275). It does not compare them; different ones compute garbage, flagged too."""
    source, out = view.value("input_id"), view.value("output_id")
    if source is None or out is None:
        return
    if source.datatype not in _AVG_POOL_DATATYPES or out.datatype not in _AVG_POOL_DATATYPES:
        yield Finding(
            "datatype", f"average-pools {source.datatype} into {out.datatype} (fp16/fp32 only): {AT_LOAD}", out.id
        )
    elif source.datatype != out.datatype:
        yield Finding("datatype", f"average-pools {source.datatype} into {out.datatype}: the output is garbage", out.id)


def check_global_pooling_datatypes(view: NodeView) -> Iterator[Finding]:
    """A mean takes fp16, fp32, qint8 or quint8 (static-reduce.c:318) and computes in the input's datatype:
    another output datatype is written with the input's element size (flagged)."""
    source, out = view.value("input_id"), view.value("output_id")
    if source is None or out is None:
        return
    if source.datatype not in _MAX_POOL_DATATYPES:
        yield Finding(
            "datatype", f"averages a {source.datatype} tensor (fp16, fp32, qint8, quint8 only): {AT_LOAD}", out.id
        )
    elif source.datatype != out.datatype:
        yield Finding("datatype", f"averages {source.datatype} into {out.datatype}: the output is garbage", out.id)


def _pooled(size: int, pad: int, kernel: int, dilation: int, stride: int, same: bool) -> int:
    if same:
        return -(-size // stride)
    effective = (kernel - 1) * dilation + 1
    return max(size + pad - effective, 0) // stride + 1


def reshape_pooling(view: NodeView, shape_of: ShapeOf) -> dict[str, Shape]:
    """Max pooling takes rank >= 4 and reads dims 0..3, average pooling rank 4; H, W and C are non-zero."""
    source = shape_of("input_id")
    if view.op == "XNNMaxPooling2d":
        require(len(source) >= 4, f"the input has {len(source)} dims, max pooling needs at least 4")
    else:
        require(len(source) == 4, f"the input has {len(source)} dims, average pooling needs 4")
    batch, height, width, channels = source[:4]
    require(height > 0 and width > 0 and channels > 0, f"the input {list(source)} is empty")
    pad_h, pad_w = _padding(view)
    same = bool(view.param("flags") & _SAME_PADDING)
    dilation_h = view.param("dilation_height") if view.op == "XNNMaxPooling2d" else 1
    dilation_w = view.param("dilation_width") if view.op == "XNNMaxPooling2d" else 1
    out_h = _pooled(height, pad_h, view.param("pooling_height"), dilation_h, view.param("stride_height"), same)
    out_w = _pooled(width, pad_w, view.param("pooling_width"), dilation_w, view.param("stride_width"), same)
    # one pointer per pooling tap and output pixel (average-pooling-nhwc.c:432-470, max-pooling-nhwc.c)
    window = view.param("pooling_height") * view.param("pooling_width")
    require_allocatable(8 * window * out_h * out_w, "its indirection buffer")
    return {"output_id": (batch, out_h, out_w, channels)}


def _axis(serialized_rank: int, offset: int) -> int:
    """``rank - offset`` computed in size_t and read back as int64 (deprecated.c:155, static-reduce.c:285)."""
    axis = (serialized_rank - offset) % 2**64
    return axis - 2**64 if axis >= 2**63 else axis


def reshape_global_pooling(view: NodeView, shape_of: ShapeOf) -> dict[str, Shape]:
    """A mean over the two axes before the last of the serialized rank, checked against the runtime rank."""
    source = shape_of("input_id")
    serialized = view.value("input_id")
    rank = len(serialized.dims) if serialized is not None else len(source)
    axes = []
    for offset in (3, 2):
        axis = _axis(rank, offset)
        axis = axis if axis >= 0 else len(source) + axis
        require(0 <= axis < len(source), f"its reduction axis {axis} is outside the rank-{len(source)} input")
        axes.append(axis)
    if view.param("flags") & _KEEP_DIMS:
        return {"output_id": tuple(1 if d in axes else size for d, size in enumerate(source))}
    return {"output_id": tuple(size for d, size in enumerate(source) if d not in axes)}


DEFINE_CHECKS: dict[str, tuple[NodeCheck, ...]] = {
    "XNNMaxPooling2d": (check_pooling_parameters, check_pooling_min_max, check_max_pooling_datatypes),
    "XNNAvgPooling2d": (check_pooling_parameters, check_pooling_min_max, check_average_pooling_datatypes),
    "XNNGlobalAvgPooling2d": (check_global_pooling_datatypes,),
}
RESHAPES: dict[str, Reshape] = {
    "XNNMaxPooling2d": reshape_pooling,
    "XNNAvgPooling2d": reshape_pooling,
    "XNNGlobalAvgPooling2d": reshape_global_pooling,
}
