"""Nodes that move values without computing: pad, transpose, reshape, copy, concatenate, slice, resize.

Their shared quantization rule (an input keeps the output's scale and zero point) is ``quant_params``;
the datatype, parameter and shape rules are here. Sources (XNNPACK 92a7ad50, XNNCompiler.cpp):

* StaticConstantPad: XNNCompiler.cpp:1231-1272 (the deprecated entry point copies *serialized input rank*
  entries of each padding array, src/subgraph/deprecated.c:417-434), src/subgraph/static-constant-pad.c:185-309
  (byte-addressable and equal datatypes); reshape: output = input + paddings (:70-137).
* StaticTranspose: XNNCompiler.cpp:1156-1190, src/subgraph/static-transpose.c:189-299 (1 <= len(perm) <= 6,
  a permutation), reshape needs input rank == len(perm) (:77).
* StaticReshape / Copy: XNNCompiler.cpp:1324-1350 and :1728-1745, src/subgraph/copy.c:437-623; reshape
  (``resize_copy_output_tensor``, :68-143): at most one 0 ("infer") and matching element counts.
* Concatenate2..5: src/subgraph/concatenate.c:284-397 (each input's datatype is the output's); reshape
  (:98-205): one rank, equal non-axis dims, axis (an int32, negative counts from the end) within the rank.
* StaticSlice: XNNCompiler.cpp:1650-1690 (offsets and sizes of one length), src/subgraph/static-slice.c:170-321;
  reshape (:62-125) clamps out-of-range slices instead of failing.
* StaticResizeBilinear2D: src/subgraph/static-resize-bilinear-2d.c:178-305 (sizes in [1, 2^24), flags,
  datatypes); reshape rank == 4 (:72).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from xnnguard.boundary.xnnpack_constants import XNN_MAX_TENSOR_DIMS
from xnnguard.runtime_check.define_checks.base import (
    AT_LOAD,
    BYTE_ADDRESSABLE,
    QUANTIZED_8BIT,
    Finding,
    NodeCheck,
    NodeView,
)
from xnnguard.runtime_check.define_checks.quant_params import compared_inputs
from xnnguard.runtime_check.define_checks.shapes import Reshape, Shape, ShapeOf, require

__all__ = ["DEFINE_CHECKS", "RESHAPES"]

_MAX_DIMS = XNN_MAX_TENSOR_DIMS
_RESIZE_DATATYPES = frozenset({"fp16", "fp32", "qint8", "quint8"})
_LEGACY_MODE, _ALIGN_CORNERS, _TRANSIENT_INDIRECTION = 0x4, 0x8, 0x20


def check_datatypes_match(view: NodeView) -> Iterator[Finding]:
    """Each input has the output's datatype, and it is byte-addressable (xnn_subgraph_check_datatype_matches:
    static-constant-pad.c:247, static-slice.c:242, static-transpose.c:267, copy.c:485, concatenate.c:305).

    An fp32 input with a quantized output is reported by the quantization rule instead (``quant_params``).
    """
    out = view.value("output_id")
    if out is None:
        return
    for field in compared_inputs(view.op):
        source = view.value(field)
        if source is None or source.datatype == out.datatype:
            continue
        if out.datatype in QUANTIZED_8BIT and source.datatype not in QUANTIZED_8BIT:
            continue  # the quantization rule's
        yield Finding(
            "datatype",
            f"moves {source.datatype} (value {source.id}) into {out.datatype}: XNNPACK keeps the datatype here, "
            f"so {AT_LOAD}",
            out.id,
        )
        return
    if out.datatype not in BYTE_ADDRESSABLE:
        yield Finding("datatype", f"has a {out.datatype} output, which XNNPACK cannot move bytewise: {AT_LOAD}", out.id)


def check_pad_arrays_cover_rank(view: NodeView) -> Iterator[Finding]:
    """XNNCompiler needs both padding arrays (XNNCompiler.cpp:1241) and XNNPACK copies as many entries as
    the serialized input has dims (deprecated.c:431): shorter arrays are read past their end; at most 6."""
    source = view.value("input_id")
    pre, post = view.param("pre_paddings"), view.param("post_paddings")
    if pre is None or post is None:
        yield Finding("node_params", f"has no {'pre' if pre is None else 'post'}_paddings: {AT_LOAD}")
        return
    if source is None:
        return
    rank = len(source.dims)
    if rank > _MAX_DIMS:
        return  # a rank problem already
    if len(pre) < rank or len(post) < rank:
        yield Finding(
            "node_params",
            f"has {len(pre)} pre- and {len(post)} post-paddings for a rank-{rank} input: XNNPACK reads {rank} of "
            "each, past the end of the shorter",
        )


def check_transpose_permutation(view: NodeView) -> Iterator[Finding]:
    """``perm`` exists (XNNCompiler.cpp:1166), has 1..6 entries and is a permutation of 0..len-1
    (static-transpose.c:202-225)."""
    perm = view.param("perm")
    source = view.value("input_id")
    if perm is None:
        yield Finding("node_params", f"has no perm: {AT_LOAD}")
    elif sorted(perm) != list(range(len(perm))) or not perm:
        yield Finding("node_params", f"has perm {list(perm)}, not a permutation of 0..{len(perm) - 1}: {AT_LOAD}")
    elif len(perm) > _MAX_DIMS and not (source is not None and len(source.dims) > _MAX_DIMS):  # else a rank problem
        yield Finding("node_params", f"has a perm of {len(perm)} dims, XNNPACK takes at most 6: {AT_LOAD}")


def check_reshape_shape(view: NodeView) -> Iterator[Finding]:
    """``new_shape`` exists (XNNCompiler.cpp:1334) and has at most 6 dims (copy.c:529)."""
    new_shape = view.param("new_shape")
    out = view.value("output_id")
    if new_shape is None:
        yield Finding("node_params", f"has no new_shape: {AT_LOAD}")
    elif len(new_shape) > _MAX_DIMS and not (out is not None and len(out.dims) > _MAX_DIMS):  # else a rank problem
        yield Finding("node_params", f"reshapes to {len(new_shape)} dims, XNNPACK takes at most 6: {AT_LOAD}")


def check_slice_arrays(view: NodeView) -> Iterator[Finding]:
    """``offsets`` and ``sizes`` exist, have one length (XNNCompiler.cpp:1659-1671), at most 6 (static-slice.c:284)."""
    offsets, sizes = view.param("offsets"), view.param("sizes")
    source = view.value("input_id")
    if offsets is None or sizes is None:
        yield Finding("node_params", f"has no {'offsets' if offsets is None else 'sizes'}: {AT_LOAD}")
    elif len(offsets) != len(sizes) or (
        len(offsets) > _MAX_DIMS and not (source is not None and len(source.dims) > _MAX_DIMS)  # else a rank problem
    ):
        yield Finding("node_params", f"has {len(offsets)} offsets and {len(sizes)} sizes: {AT_LOAD}")


def check_resize_parameters(view: NodeView) -> Iterator[Finding]:
    """new height and width in [1, 2^24) (static-resize-bilinear-2d.c:191-198); flags a subset of
    legacy mode, align corners and transient indirection, not both of the first two (:205-224)."""
    height, width, flags = view.param("new_height"), view.param("new_width"), view.param("flags")
    if not (0 < height < 2**24 and 0 < width < 2**24):
        yield Finding("node_params", f"resizes to {height}x{width}: XNNPACK takes 1 to 2^24 - 1, so {AT_LOAD}")
    if flags & ~(_LEGACY_MODE | _ALIGN_CORNERS | _TRANSIENT_INDIRECTION) or (
        flags & _LEGACY_MODE and flags & _ALIGN_CORNERS
    ):
        yield Finding("node_params", f"has flags 0x{flags:x}, which XNNPACK's bilinear resize refuses: {AT_LOAD}")


def check_resize_datatypes(view: NodeView) -> Iterator[Finding]:
    """Input and output fp16, fp32, qint8 or quint8 (static-resize-bilinear-2d.c:237, :262). XNNPACK does not
    compare them (an fp32 input with a quantized output fails the quantization rule); other pairs compute
    in the input's datatype: flagged as garbage."""
    source, out = view.value("input_id"), view.value("output_id")
    if source is None or out is None:
        return
    if source.datatype not in _RESIZE_DATATYPES or out.datatype not in _RESIZE_DATATYPES:
        yield Finding(
            "datatype",
            f"resizes {source.datatype} into {out.datatype} (fp16, fp32, qint8, quint8 only): {AT_LOAD}",
            out.id,
        )
    elif source.datatype != out.datatype and not (
        out.datatype in QUANTIZED_8BIT and source.datatype not in QUANTIZED_8BIT
    ):
        yield Finding("datatype", f"resizes {source.datatype} into {out.datatype}: the output is garbage", out.id)


def reshape_pad(view: NodeView, shape_of: ShapeOf) -> dict[str, Shape]:
    """Output dim d = input + pre[d] + post[d] for the serialized input's rank (static-constant-pad.c:70-137)."""
    source = shape_of("input_id")
    serialized = view.value("input_id")
    rank = len(serialized.dims) if serialized is not None else len(source)
    pre, post = view.param("pre_paddings") or (), view.param("post_paddings") or ()
    out = list(source)
    for d in range(min(rank, len(out), len(pre), len(post))):
        out[d] += pre[d] + post[d]
    return {"output_id": tuple(out)}


def reshape_transpose(view: NodeView, shape_of: ShapeOf) -> dict[str, Shape]:
    """Input rank == len(perm); output[d] = input[perm[d]] (static-transpose.c:60-135)."""
    source, perm = shape_of("input_id"), view.param("perm") or ()
    require(len(source) == len(perm), f"the input {list(source)} has {len(source)} dims, perm {list(perm)} {len(perm)}")
    return {"output_id": tuple(source[p] for p in perm)}


def reshape_static_reshape(view: NodeView, shape_of: ShapeOf) -> dict[str, Shape]:
    """At most one 0 (inferred) dim; it must divide the element count, else the counts match (copy.c:68-143)."""
    source, new_shape = shape_of("input_id"), tuple(view.param("new_shape") or ())
    elements = math.prod(source)
    inferred = [d for d, size in enumerate(new_shape) if size == 0]
    require(len(inferred) <= 1, f"new shape {list(new_shape)} has {len(inferred)} dims to infer (0), at most 1")
    if inferred:
        rest = math.prod(size for size in new_shape if size)
        require(
            rest != 0 and elements % rest == 0,
            f"the {elements} elements of {list(source)} do not fill {list(new_shape)}",
        )
        return {"output_id": tuple(elements // rest if size == 0 else size for size in new_shape)}
    require(math.prod(new_shape) == elements, f"reshapes {list(source)} ({elements} elements) to {list(new_shape)}")
    return {"output_id": new_shape}


def reshape_copy(view: NodeView, shape_of: ShapeOf) -> dict[str, Shape]:
    return {"output_id": shape_of("input_id")}


def reshape_concatenate(view: NodeView, shape_of: ShapeOf) -> dict[str, Shape]:
    """One rank, equal non-axis dims, 0 <= axis < rank after negative axes count from the end."""
    shapes = [shape_of(field) for field in compared_inputs(view.op)]
    rank = len(shapes[0])
    axis = view.param("axis")
    axis = axis - 2**32 if axis >= 2**31 else axis  # a uint field XNNPACK reads as int32
    axis = axis + rank if axis < 0 else axis
    require(0 <= axis < rank, f"concatenates along axis {view.param('axis')} of rank-{rank} inputs")
    for index, shape in enumerate(shapes[1:], start=2):
        require(len(shape) == rank, f"input {index} {list(shape)} has another rank than input 1 {list(shapes[0])}")
        require(
            all(a == b for d, (a, b) in enumerate(zip(shape, shapes[0])) if d != axis),
            f"input {index} {list(shape)} and input 1 {list(shapes[0])} differ outside axis {axis}",
        )
    out = list(shapes[0])
    out[axis] = sum(shape[axis] for shape in shapes)
    return {"output_id": tuple(out)}


def reshape_slice(view: NodeView, shape_of: ShapeOf) -> dict[str, Shape]:
    """Rank >= 1; begin = offset, end = offset + size (0 meaning "to the end" when both are 0), clamped
    into the dim (static-slice.c:62-125); dims past the arrays are kept whole."""
    source = shape_of("input_id")
    require(len(source) >= 1, "slices a rank-0 tensor")
    offsets, sizes = view.param("offsets") or (), view.param("sizes") or ()
    out = []
    for d, dim in enumerate(source):
        begin, end = (offsets[d], offsets[d] + sizes[d]) if d < len(offsets) and d < len(sizes) else (0, 0)
        length = max(dim - begin, 0) if end <= 0 else max(end - begin, 0)
        out.append(max(min(length, max(dim - min(begin, dim), 0)), 0))
    return {"output_id": tuple(out)}


def reshape_resize(view: NodeView, shape_of: ShapeOf) -> dict[str, Shape]:
    """Rank 4 NHWC; the output takes the new height and width (static-resize-bilinear-2d.c:72)."""
    source = shape_of("input_id")
    require(len(source) == 4, f"the input has {len(source)} dims, a bilinear resize needs 4")
    return {"output_id": (source[0], view.param("new_height"), view.param("new_width"), source[3])}


_CONCATENATES = tuple(f"XNNConcatenate{n}" for n in range(2, 6))
DEFINE_CHECKS: dict[str, tuple[NodeCheck, ...]] = {
    "XNNStaticConstantPad": (check_pad_arrays_cover_rank, check_datatypes_match),
    "XNNStaticTranspose": (check_transpose_permutation, check_datatypes_match),
    "XNNStaticReshape": (check_reshape_shape, check_datatypes_match),
    "XNNCopy": (check_datatypes_match,),
    "XNNStaticSlice": (check_slice_arrays, check_datatypes_match),
    "XNNStaticResizeBilinear2D": (check_resize_parameters, check_resize_datatypes),
    **dict.fromkeys(_CONCATENATES, (check_datatypes_match,)),
}
RESHAPES: dict[str, Reshape] = {
    "XNNStaticConstantPad": reshape_pad,
    "XNNStaticTranspose": reshape_transpose,
    "XNNStaticReshape": reshape_static_reshape,
    "XNNCopy": reshape_copy,
    "XNNStaticSlice": reshape_slice,
    "XNNStaticResizeBilinear2D": reshape_resize,
    **dict.fromkeys(_CONCATENATES, reshape_concatenate),
}
