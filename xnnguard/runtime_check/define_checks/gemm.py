"""GEMM-like nodes: FullyConnected, Conv2d, DepthwiseConv2d, ConvTranspose2d, BatchMatrixMultiply.

Sources (XNNPACK 92a7ad50):

* FullyConnected: ``xnn_define_fully_connected`` (src/subgraph/fully-connected.c:1783-2119; datatype
  combinations :1525-1781), create (:293-340; src/operators/fully-connected-nc.c: channels > 0,
  requantization scale < 256 at :783/:937/:968), reshape (:955-1020).
* Conv2d: ``xnn_define_convolution_2d`` (src/subgraph/convolution-2d.c:1042-1433; combinations :922-1040;
  a 1x1, stride-1, unpadded, single-group conv is defined as a FullyConnected, :1380-1398), create
  (src/operators/convolution-nhwc.c: requantization :1002-1081), reshape (convolution-2d.c:662-800,
  convolution-nhwc.c:3255-3345).
* DepthwiseConv2d: XNNCompiler.cpp:1277-1311 (depth multiplier = gOC / gIC, input channels = groups),
  ``xnn_define_depthwise_convolution_2d`` (src/subgraph/depthwise-convolution-2d.c:617-1047), reshape (:408-440).
* ConvTranspose2d: ``xnn_define_deconvolution_2d`` (src/subgraph/deconvolution-2d.c:577-1010), reshape
  (:400-430, src/operators/deconvolution-nhwc.c:2270-2330).
* BatchMatrixMultiply: src/subgraph/batch-matrix-multiply.c (define :585-735, combinations :545-583,
  create :50-62 and :220-240, reshape :289-345).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from xnnguard.runtime_check.define_checks.base import AT_LOAD, Finding, NodeCheck, NodeView, f32
from xnnguard.runtime_check.define_checks.shapes import (
    Reshape,
    Shape,
    ShapeOf,
    broadcast,
    require,
    require_allocatable,
    require_channels_agree,
)
from xnnguard.runtime_check.xnnpack_blob import PerChannelGroupQuant, PerChannelQuant, PerTensorQuant, XnnValue

__all__ = ["DEFINE_CHECKS", "RESHAPES"]

_SAME_PADDING = 0x4  # XNN_FLAG_TENSORFLOW_SAME_PADDING
_TRANSIENT_INDIRECTION = 0x20  # XNN_FLAG_TRANSIENT_INDIRECTION_BUFFER
_TRANSPOSE = 0x1  # XNN_FLAG_TRANSPOSE_WEIGHTS (FullyConnected), XNN_FLAG_TRANSPOSE_B (BatchMatrixMultiply)
_CONV_OPS = ("XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d")
_NODE_NAMES = {
    "XNNFullyConnected": "fully-connected",
    "XNNConv2d": "convolution",
    "XNNDepthwiseConv2d": "depthwise convolution",
    "XNNConvTranspose2d": "transposed convolution",
    "XNNBatchMatrixMultiply": "batch matrix multiply",
}

Combination = tuple[str, str, str | None, str]  # input, filter, bias (None: no bias), output


def _combinations(
    with_bias: dict[tuple[str, str, str], set[str]], without_bias: set[tuple[str, str, str]]
) -> set[Combination]:
    found: set[Combination] = {(i, w, None, o) for i, w, o in without_bias}
    for (i, w, o), biases in with_bias.items():
        found |= {(i, w, b, o) for b in biases}
    return found


# validate_datatypes_with/without_bias, fully-connected.c:1525-1781 (ExecuTorch's 4-bit and packed kinds included)
_FC_COMBINATIONS = _combinations(
    {
        ("bf16", "bf16", "fp32"): {"fp32"},
        ("fp32", "fp32", "fp32"): {"fp32"},
        ("fp16", "fp32", "fp16"): {"fp32"},
        ("fp16", "fp16", "fp16"): {"fp16", "fp32"},
        ("fp32", "fp16", "fp32"): {"fp16", "fp32"},
        ("fp32", "qcint4", "fp32"): {"fp32"},
        ("qdint8", "qcint4", "fp32"): {"fp32"},
        ("qpint8", "qcint4", "fp32"): {"fp32"},
        ("qdint8", "qcint4", "fp16"): {"fp32"},
        ("qint8", "qcint4", "qint8"): {"qcint32", "qint32"},
        ("qdint8", "qbint4", "fp32"): {"fp32"},
        ("qdint8", "qbint4", "fp16"): {"fp32"},
        ("qdint8", "qbint4", "bf16"): {"fp32"},
        ("qpint8", "qbint4", "fp32"): {"fp32"},
        ("fp32", "qcint8", "fp32"): {"fp32"},
        ("qdint8", "qcint8", "fp32"): {"fp32"},
        ("qpint8", "qcint8", "fp32"): {"fp32"},
        ("qdint8", "qcint8", "fp16"): {"fp32"},
        ("qint8", "qcint8", "qint8"): {"qcint32", "qint32"},
        ("qint8", "qint8", "qint8"): {"qint32"},
        ("quint8", "quint8", "quint8"): {"qint32"},
    },
    {
        ("bf16", "bf16", "fp32"),
        ("fp32", "fp32", "fp32"),
        ("fp16", "fp32", "fp16"),
        ("fp16", "fp16", "fp16"),
        ("fp32", "fp16", "fp32"),
        ("fp32", "qcint4", "fp32"),
        ("qdint8", "qcint4", "fp32"),
        ("qpint8", "qcint4", "fp32"),
        ("qdint8", "qcint4", "fp16"),
        ("qint8", "qcint4", "qint8"),
        ("qdint8", "qbint4", "fp32"),
        ("qdint8", "qbint4", "fp16"),
        ("qdint8", "qbint4", "bf16"),
        ("qpint8", "qbint4", "fp32"),
        ("fp32", "qcint8", "fp32"),
        ("qdint8", "qcint8", "fp32"),
        ("qpint8", "qcint8", "fp32"),
        ("qdint8", "qcint8", "fp16"),
        ("qint8", "qcint8", "qint8"),
        ("qint8", "qint8", "qint8"),
        ("quint8", "quint8", "quint8"),
    },
)
# convolution-2d.c:922-1040; the depthwise convolution takes the same minus the qdint8 inputs (:617-726)
_CONV_COMBINATIONS = _combinations(
    {
        ("fp32", "fp32", "fp32"): {"fp32"},
        ("fp16", "fp32", "fp16"): {"fp32"},
        ("fp32", "fp16", "fp32"): {"fp16", "fp32"},
        ("fp16", "fp16", "fp16"): {"fp16", "fp32"},
        ("qint8", "qint8", "qint8"): {"qint32"},
        ("qint8", "qcint8", "qint8"): {"qcint32"},
        ("qdint8", "qcint8", "fp32"): {"fp32"},
        ("qdint8", "qcint8", "fp16"): {"fp32"},
        ("quint8", "quint8", "quint8"): {"qint32"},
    },
    {
        ("fp32", "fp32", "fp32"),
        ("fp16", "fp32", "fp16"),
        ("fp32", "fp16", "fp32"),
        ("fp16", "fp16", "fp16"),
        ("qint8", "qint8", "qint8"),
        ("qint8", "qcint8", "qint8"),
        ("qdint8", "qcint8", "fp32"),
        ("qdint8", "qcint8", "fp16"),
        ("quint8", "quint8", "quint8"),
    },
)
_DEPTHWISE_COMBINATIONS = {c for c in _CONV_COMBINATIONS if c[0] != "qdint8"}
# deconvolution-2d.c:577-683
_DECONV_COMBINATIONS = _combinations(
    {
        ("fp32", "fp32", "fp32"): {"fp32"},
        ("fp16", "fp32", "fp16"): {"fp32"},
        ("fp32", "fp16", "fp32"): {"fp16", "fp32"},
        ("qint8", "qint8", "qint8"): {"qint32"},
        ("quint8", "quint8", "quint8"): {"qint32"},
        ("qdint8", "qcint8", "fp32"): {"fp32"},
        ("qint8", "qcint8", "qint8"): {"qcint32"},
    },
    {
        ("fp32", "fp32", "fp32"),
        ("fp16", "fp32", "fp16"),
        ("fp32", "fp16", "fp32"),
        ("qint8", "qint8", "qint8"),
        ("quint8", "quint8", "quint8"),
        ("qdint8", "qcint8", "fp32"),
        ("qint8", "qcint8", "qint8"),
    },
)
_COMBINATIONS = {
    "XNNFullyConnected": _FC_COMBINATIONS,
    "XNNConv2d": _CONV_COMBINATIONS,
    "XNNDepthwiseConv2d": _DEPTHWISE_COMBINATIONS,
    "XNNConvTranspose2d": _DECONV_COMBINATIONS,
}
# batch-matrix-multiply.c:545-583: (input1, input2) -> output
_BMM_COMBINATIONS = {
    ("bf16", "bf16"): "fp32",
    ("fp16", "fp16"): "fp16",
    ("fp32", "fp32"): "fp32",
    ("qdint8", "qcint8"): "fp32",
    ("fp32", "qcint8"): "fp32",
    ("qint8", "qint8"): "qint8",
}


def _fc_output_datatype(view: NodeView, output: XnnValue, source: XnnValue, filter_: XnnValue) -> str:
    """The output XNNPACK sees: XNNCompiler computes a bf16 x bf16 -> bf16 linear in fp32, then converts
    (XNNCompiler.cpp:845-903)."""
    if view.op == "XNNFullyConnected" and source.datatype == filter_.datatype == output.datatype == "bf16":
        return "fp32"
    return output.datatype


def check_datatype_combination(view: NodeView) -> Iterator[Finding]:
    """The (input, filter, bias, output) datatypes are a combination XNNPACK has a kernel for."""
    source, filter_, out = view.value("input1_id"), view.value("filter_id"), view.value("output_id")
    if source is None or filter_ is None or out is None:
        return
    bias = view.value("bias_id")
    combination = (
        source.datatype,
        filter_.datatype,
        None if bias is None else bias.datatype,
        _fc_output_datatype(view, out, source, filter_),
    )
    allowed = _COMBINATIONS[view.op]
    if combination in allowed:
        return
    described = f"{combination[0]} input, {combination[1]} filter, " + (
        "no bias" if bias is None else f"{combination[2]} bias"
    )
    yield Finding(
        "datatype",
        f"has {described} and {out.datatype} output: XNNPACK's {_NODE_NAMES[view.op]} has no kernel for "
        f"that combination, so {AT_LOAD}",
        out.id,
    )


def _is_pointwise(view: NodeView) -> bool:
    """The convolution XNNPACK defines as a FullyConnected (convolution-2d.c:1380-1398)."""
    padding = any(view.param(f"padding_{side}") for side in ("top", "right", "bottom", "left"))
    return (
        view.op == "XNNConv2d"
        and view.param("groups") == 1
        and view.param("kernel_height") * view.param("kernel_width") == 1
        and view.param("subsampling_height") == view.param("subsampling_width") == 1
        and not padding
        and view.param("group_input_channels") + view.param("group_output_channels") > 2
    )


def check_filter_and_bias_are_static(view: NodeView) -> Iterator[Finding]:
    """Convolutions need constant filters and biases; a fully-connected one only for non-float filters and
    biases (fully-connected.c:1858-1872, :1992-2012; convolution-2d.c:1206, :1254)."""
    filter_, bias = view.value("filter_id"), view.value("bias_id")
    fc = view.op == "XNNFullyConnected"
    if filter_ is not None and not filter_.is_constant and (not fc or filter_.datatype not in ("fp16", "fp32")):
        yield Finding(
            "datatype",
            f"has a {filter_.datatype} filter computed at run time: XNNPACK needs it constant here, so {AT_LOAD}",
            filter_.id,
        )
    if bias is not None and not bias.is_constant:
        channelwise = filter_ is not None and filter_.datatype in ("qcint8", "qcint4")
        if not fc or bias.datatype not in ("fp16", "fp32") or channelwise:
            yield Finding(
                "datatype",
                f"has a {bias.datatype} bias computed at run time: XNNPACK needs it constant here, so {AT_LOAD}",
                bias.id,
            )
        elif filter_ is not None and filter_.is_constant:
            # only the dynamic fully-connected operators (a filter computed at run time) take their bias at run
            # time; the others pack it with the filter at load (fully-connected.c:293-420), where it is NULL
            yield Finding(
                "datatype",
                "has a constant filter but a bias computed at run time: XNNPACK packs the bias with the filter at "
                "load, so it is ignored or the runtime crashes",
                bias.id,
            )


def check_blockwise_filter(view: NodeView) -> Iterator[Finding]:
    """A qbint4 filter is blocked along its input channels, which the block size divides, and quantized along
    dim 0 (fully-connected.c:1946-1975)."""
    filter_ = view.value("filter_id")
    if filter_ is None or not isinstance(filter_.quantization, PerChannelGroupQuant) or len(filter_.dims) < 2:
        return
    quantization = filter_.quantization
    if quantization.channel_dim != 0 or (quantization.group_size and filter_.dims[1] % quantization.group_size):
        yield Finding(
            "quant_range",
            f"has a blockwise filter {list(filter_.dims)} with blocks of {quantization.group_size} along dim "
            f"{quantization.channel_dim}: XNNPACK needs dim 0 and blocks dividing the {filter_.dims[1]} input "
            f"channels, so {AT_LOAD}",
            filter_.id,
        )


def check_filter_zero_point(view: NodeView) -> Iterator[Finding]:
    """A qint8 filter is symmetric: zero point 0 (fully-connected.c:1908, convolution-2d.c:1219,
    depthwise-convolution-2d.c:870). ConvTranspose2d only logs it (deconvolution-2d.c:825)."""
    filter_ = view.value("filter_id")
    if (
        filter_ is not None
        and view.op != "XNNConvTranspose2d"
        and filter_.datatype == "qint8"
        and isinstance(filter_.quantization, PerTensorQuant)
        and filter_.quantization.zero_point != 0
    ):
        yield Finding(
            "quant_range",
            f"has a qint8 filter with zero point {filter_.quantization.zero_point}: XNNPACK takes symmetric "
            f"filters only, so {AT_LOAD}",
            filter_.id,
        )


def _channel_dim(value: XnnValue) -> int | None:
    return value.quantization.channel_dim if isinstance(value.quantization, PerChannelQuant) else None


def check_channelwise_dims(view: NodeView) -> Iterator[Finding]:
    """Per-channel filters are quantized along the output channels: dim 0 for Conv2d and ConvTranspose2d
    (convolution-2d.c:1359, deconvolution-2d.c:951), the last dim for DepthwiseConv2d (:996), dim
    ``flags & TRANSPOSE`` for FullyConnected (:1934-1944); a qcint32 bias along dim 0."""
    filter_, bias = view.value("filter_id"), view.value("bias_id")
    if filter_ is not None and filter_.datatype in ("qcint8", "qcint4"):
        if view.op == "XNNDepthwiseConv2d":
            expected = len(filter_.dims) - 1
        elif view.op == "XNNFullyConnected" or _is_pointwise(view):
            expected = (view.param("flags") & _TRANSPOSE) if view.op == "XNNFullyConnected" else 0
        else:
            expected = 0
        found = _channel_dim(filter_)
        if found is not None and found != expected:
            yield Finding(
                "quant_range",
                f"has a per-channel filter quantized along dim {found}: this node needs dim {expected} (its output "
                f"channels), so {AT_LOAD}",
                filter_.id,
            )
    if (
        bias is not None
        and view.op != "XNNFullyConnected"
        and bias.datatype == "qcint32"
        and (found := _channel_dim(bias)) not in (None, 0)
    ):
        yield Finding("quant_range", f"has a per-channel bias quantized along dim {found}, not 0: {AT_LOAD}", bias.id)


def _positive(view: NodeView, names: tuple[str, ...]) -> Iterator[Finding]:
    zero = ", ".join(f"{name} 0" for name in names if not view.param(name))
    if zero:
        yield Finding("node_params", f"has {zero}: XNNPACK needs these positive, so {AT_LOAD}")


def check_convolution_parameters(view: NodeView) -> Iterator[Finding]:
    """Kernel, stride (subsampling), dilation, groups and channels per group are positive
    (convolution-2d.c:1057-1098, depthwise :760-782, deconvolution :699-747); flags are SAME padding and
    transient indirection only, and SAME excludes explicit padding (convolution-2d.c:1113-1126)."""
    common: tuple[str, ...] = ("kernel_height", "kernel_width", "subsampling_height", "subsampling_width")
    common += ("dilation_height", "dilation_width", "groups")
    if view.op == "XNNDepthwiseConv2d":
        # XNNCompiler divides by group_input_channels (XNNCompiler.cpp:1291): 0 is a crash, not an error
        yield from _positive(view, ("group_input_channels",))
        if view.param("group_input_channels"):
            multiplier = view.param("group_output_channels") // view.param("group_input_channels")
            if multiplier == 0:
                yield Finding(
                    "node_params",
                    f"has depth multiplier 0 (group_output_channels {view.param('group_output_channels')} / "
                    f"group_input_channels {view.param('group_input_channels')}): {AT_LOAD}",
                )
        yield from _positive(view, common)
    else:
        yield from _positive(view, (*common, "group_input_channels", "group_output_channels"))
    flags = view.param("flags")
    padding = any(view.param(f"padding_{side}") for side in ("top", "right", "bottom", "left"))
    if view.op != "XNNConvTranspose2d" and flags & ~(_SAME_PADDING | _TRANSIENT_INDIRECTION):
        yield Finding("node_params", f"has flags 0x{flags:x}, XNNPACK allows only 0x4 and 0x20 here: {AT_LOAD}")
    elif flags & _SAME_PADDING and padding:
        yield Finding("node_params", f"has SAME padding (flag 0x4) and explicit padding: {AT_LOAD}")


def check_output_min_max(view: NodeView) -> Iterator[Finding]:
    """``output_min_max`` is not NaN and min <= max (xnn_subgraph_check_output_min_max, validation.c:175-198)."""
    low, high = view.min_max()
    if math.isnan(low) or math.isnan(high) or low > high:
        yield Finding("node_params", f"clamps its output to [{low}, {high}]: XNNPACK needs min <= max, so {AT_LOAD}")


def check_filter_matches_channels(view: NodeView) -> Iterator[Finding]:
    """The filter's dim 0 is groups * group_output_channels (convolution-2d.c:1298); every convolution
    reads groups*gOC*kh*kw*gIC filter elements and groups*gOC bias elements without checking the data
    is that large (UB: flagged too). FullyConnected's channels come from the filter (create needs them > 0)."""
    filter_, bias = view.value("filter_id"), view.value("bias_id")
    if filter_ is None:
        return
    if view.op == "XNNFullyConnected":
        if len(filter_.dims) >= 2:
            transpose = view.param("flags") & _TRANSPOSE
            in_ch, out_ch = (filter_.dims[0], filter_.dims[1]) if transpose else (filter_.dims[-1], filter_.dims[0])
            if not in_ch or not out_ch:
                yield Finding(
                    "shape",
                    f"has a {list(filter_.dims)} filter: {in_ch} input and {out_ch} output channels, XNNPACK needs "
                    f"both positive, so {AT_LOAD}",
                    filter_.id,
                )
            elif bias is not None and math.prod(bias.dims) < out_ch:
                yield Finding(
                    "shape",
                    f"has {math.prod(bias.dims)} bias values for {out_ch} output channels: XNNPACK reads past them",
                    bias.id,
                )
        return
    groups, gic, goc = view.param("groups"), view.param("group_input_channels"), view.param("group_output_channels")
    kh, kw = view.param("kernel_height"), view.param("kernel_width")
    if view.op == "XNNDepthwiseConv2d":
        out_channels = groups * (goc // gic) if gic else 0
        needed = kh * kw * out_channels
    else:
        out_channels = groups * goc
        needed = out_channels * kh * kw * gic
        if view.op == "XNNConv2d" and (not filter_.dims or filter_.dims[0] != out_channels):
            yield Finding(
                "shape",
                f"has a {list(filter_.dims)} filter for {groups} groups of {goc} output channels: XNNPACK needs "
                f"dim 0 = {out_channels}, so {AT_LOAD}",
                filter_.id,
            )
            return
    if needed and math.prod(filter_.dims) < needed:
        yield Finding(
            "shape",
            f"has a {list(filter_.dims)} filter, the node's parameters need {needed} elements: XNNPACK reads past it",
            filter_.id,
        )
    elif bias is not None and out_channels and math.prod(bias.dims) < out_channels:
        yield Finding(
            "shape",
            f"has {math.prod(bias.dims)} bias values for {out_channels} output channels: XNNPACK reads past them",
            bias.id,
        )


def _scales(value: XnnValue) -> tuple[float, ...] | None:
    """The scales the runtime uses for ``value`` when the flatbuffer holds them (None: a scale buffer)."""
    quantization = value.quantization
    if isinstance(quantization, PerTensorQuant):
        return (quantization.scale,)
    if isinstance(quantization, PerChannelQuant) and quantization.scale_buffer_idx == 0:
        return quantization.scales
    return None


def check_requantization_scale(view: NodeView) -> Iterator[Finding]:
    """``input_scale * filter_scale / output_scale < 256`` for a quantized output, per channel where the
    filter is per channel (convolution-nhwc.c:1008/:1066, fully-connected-nc.c:783/:937/:968,
    deconvolution-nhwc.c:634/:660): ``unsupported_parameter`` at load. Computable when the filter's
    scales are in the flatbuffer (per tensor, or per channel inline)."""
    source, filter_, out = view.value("input1_id"), view.value("filter_id"), view.value("output_id")
    if source is None or filter_ is None or out is None or out.datatype not in ("qint8", "quint8"):
        return
    if not (isinstance(source.quantization, PerTensorQuant) and isinstance(out.quantization, PerTensorQuant)):
        return
    scales = _scales(filter_)
    if not scales or out.quantization.scale <= 0:
        return
    for channel, scale in enumerate(scales):
        requantization = f32(f32(source.quantization.scale * scale) / out.quantization.scale)
        if requantization >= 256:
            yield Finding(
                "quant_range",
                f"has requantization scale {requantization:.4g} (input scale x filter scale"
                f"{f' of channel {channel}' if len(scales) > 1 else ''} / output scale): XNNPACK needs it below 256, "
                f"so {AT_LOAD}",
                out.id,
            )
            return


def check_dynamic_input_rank(view: NodeView) -> Iterator[Finding]:
    """A dynamically quantized (qdint8) input has fewer non-batch dims than dims for a convolution
    (convolution-2d.c:1169, deconvolution :780), at most as many for FC and BMM (fully-connected.c:1822)."""
    from xnnguard.runtime_check.xnnpack_blob import PerTokenDynamicQuant

    source = view.value("input1_id")
    if source is None or not isinstance(source.quantization, PerTokenDynamicQuant):
        return
    nonbatch, rank = source.quantization.num_nonbatch_dims, len(source.dims)
    strict = view.op in ("XNNConv2d", "XNNConvTranspose2d")  # checked before a 1x1 conv becomes an FC
    if nonbatch >= rank if strict else nonbatch > rank:
        yield Finding(
            "value_def",
            f"has a dynamically quantized input with {nonbatch} non-batch dims of {rank}: {AT_LOAD}",
            source.id,
        )


def check_bmm_datatypes(view: NodeView) -> Iterator[Finding]:
    """BatchMatrixMultiply's (input1, input2, output) datatypes (batch-matrix-multiply.c:545-583); a qint8
    input2 has zero point 0 (create, :234)."""
    a, b, out = view.value("input1_id"), view.value("input2_id"), view.value("output_id")
    if a is None or b is None or out is None:
        return
    if _BMM_COMBINATIONS.get((a.datatype, b.datatype)) != out.datatype:
        yield Finding(
            "datatype",
            f"multiplies {a.datatype} by {b.datatype} into {out.datatype}: XNNPACK's batch matrix multiply has "
            f"no kernel for that, so {AT_LOAD}",
            out.id,
        )
    elif b.datatype == "qint8" and isinstance(b.quantization, PerTensorQuant) and b.quantization.zero_point != 0:
        yield Finding(
            "quant_range", f"has a qint8 second input with zero point {b.quantization.zero_point}: {AT_LOAD}", b.id
        )


def _conv_output(size: int, pad: int, kernel: int, dilation: int, stride: int, same: bool) -> int:
    if same:
        return -(-size // stride)
    effective = (kernel - 1) * dilation + 1
    require(size + pad >= effective, f"the padded input ({size + pad}) is smaller than the kernel ({effective})")
    return (size + pad - effective) // stride + 1


def reshape_fully_connected(view: NodeView, shape_of: ShapeOf) -> dict[str, Shape]:
    """fully-connected.c:955-1020: input rank >= 1, filter rank >= 2, last input dim = input channels."""
    source, filter_shape = shape_of("input1_id"), shape_of("filter_id")
    require(len(source) >= 1, "the input has rank 0")
    require(len(filter_shape) >= 2, f"the filter has {len(filter_shape)} dims, XNNPACK needs at least 2")
    transpose = view.param("flags") & _TRANSPOSE
    in_ch, out_ch = (filter_shape[0], filter_shape[1]) if transpose else (filter_shape[-1], filter_shape[0])
    require(in_ch != 0, "the filter has 0 input channels")
    require_channels_agree(
        source[-1] == in_ch, f"the input {list(source)} has {source[-1]} channels, the filter {in_ch}"
    )
    return {"output_id": (*source[:-1], out_ch)}


def _spatial(source: Shape) -> tuple[int, int, int, int]:
    """(batch, height, width, channels) of an NHWC input, the convolutions' view of it (rank >= 3)."""
    return source[0], source[1], source[2], source[-1]


def reshape_convolution(view: NodeView, shape_of: ShapeOf) -> dict[str, Shape]:
    """Conv2d and DepthwiseConv2d: the input's channels are what the node was created for, H and W are
    positive, and the kernel fits the padded input (convolution-2d.c:662-800, convolution-nhwc.c:3255-3345;
    depthwise rank 3 or 4, depthwise-convolution-2d.c:408-440). A 1x1 Conv2d reshapes as a FullyConnected."""
    source = shape_of("input1_id")
    groups, gic, goc = view.param("groups"), view.param("group_input_channels"), view.param("group_output_channels")
    if _is_pointwise(view):
        filter_shape = shape_of("filter_id")
        require(len(source) >= 1, "the input has rank 0")
        require_channels_agree(
            source[-1] == filter_shape[-1],
            f"the input {list(source)} has {source[-1]} channels, the filter {filter_shape[-1]}",
        )
        return {"output_id": (*source[:-1], filter_shape[0])}
    if view.op == "XNNDepthwiseConv2d":
        require(len(source) in (3, 4), f"the input has {len(source)} dims, a depthwise convolution takes 3 or 4")
        in_channels, out_channels = groups, groups * (goc // gic)
    else:
        require(len(source) >= 3, f"the input has {len(source)} dims, a convolution needs at least 3")
        in_channels, out_channels = groups * gic, groups * goc
    batch, height, width, channels = _spatial(source)
    # 1.4's XNNPACK fails a depthwise convolution whose channels disagree too (the reshape_convolution_depthwise case)
    agree = require if view.op == "XNNDepthwiseConv2d" else require_channels_agree
    agree(channels == in_channels, f"the input {list(source)} has {channels} channels, the node takes {in_channels}")
    require(height > 0 and width > 0, f"the input {list(source)} is empty")
    same = bool(view.param("flags") & _SAME_PADDING)
    out_h = _conv_output(
        height,
        view.param("padding_top") + view.param("padding_bottom"),
        view.param("kernel_height"),
        view.param("dilation_height"),
        view.param("subsampling_height"),
        same,
    )
    out_w = _conv_output(
        width,
        view.param("padding_left") + view.param("padding_right"),
        view.param("kernel_width"),
        view.param("dilation_width"),
        view.param("subsampling_width"),
        same,
    )
    # one pointer per kernel tap and output pixel (convolution-nhwc.c:2716, :3026)
    window = view.param("kernel_height") * view.param("kernel_width")
    require_allocatable(8 * window * out_h * out_w, "its indirection buffer")
    return {"output_id": (batch, out_h, out_w, out_channels)}


def reshape_deconvolution(view: NodeView, shape_of: ShapeOf) -> dict[str, Shape]:
    """ConvTranspose2d: rank 3 or 4, channels = groups*gIC, H and W positive, adjustment < stride
    (deconvolution-2d.c:400-430, deconvolution-nhwc.c:2276-2330)."""
    source = shape_of("input1_id")
    require(len(source) in (3, 4), f"the input has {len(source)} dims, a transposed convolution takes 3 or 4")
    groups, gic, goc = view.param("groups"), view.param("group_input_channels"), view.param("group_output_channels")
    batch, height, width, channels = _spatial(source)
    require(
        channels == groups * gic, f"the input {list(source)} has {channels} channels, the node takes {groups * gic}"
    )
    require(height > 0 and width > 0, f"the input {list(source)} is empty")
    sizes = []
    for axis, size, pads in (("height", height, ("top", "bottom")), ("width", width, ("left", "right"))):
        stride, adjustment = view.param(f"subsampling_{axis}"), view.param(f"adjustment_{axis}")
        require(adjustment < stride, f"its {axis} adjustment {adjustment} is not smaller than its stride {stride}")
        effective = (view.param(f"kernel_{axis}") - 1) * view.param(f"dilation_{axis}") + 1
        padding = view.param(f"padding_{pads[0]}") + view.param(f"padding_{pads[1]}")
        sizes.append(max(stride * (size - 1) + adjustment + effective - padding, 0))
    return {"output_id": (batch, sizes[0], sizes[1], groups * goc)}


def reshape_batch_matrix_multiply(view: NodeView, shape_of: ShapeOf) -> dict[str, Shape]:
    """batch-matrix-multiply.c:289-345: ranks >= 2, K matches (flag 1 transposes B), batch dims broadcast."""
    a, b = shape_of("input1_id"), shape_of("input2_id")
    require(len(a) >= 2 and len(b) >= 2, f"the inputs {list(a)} and {list(b)} need at least 2 dims each")
    transpose = view.param("flags") & _TRANSPOSE
    m, k = a[-2], a[-1]
    n, k_b = (b[-2], b[-1]) if transpose else (b[-1], b[-2])
    require(k == k_b, f"the inputs {list(a)} and {list(b)} disagree on K ({k} vs {k_b})")  # 1.4's XNNPACK checks it too
    batch = broadcast(a[:-2], b[:-2], "the batch dims of") if (a[:-2] or b[:-2]) else ()
    return {"output_id": (*batch, m, n)}


_GEMM_CHECKS: tuple[NodeCheck, ...] = (
    check_datatype_combination,
    check_filter_and_bias_are_static,
    check_filter_zero_point,
    check_channelwise_dims,
    check_output_min_max,
    check_filter_matches_channels,
    check_requantization_scale,
    check_dynamic_input_rank,
)


DEFINE_CHECKS: dict[str, tuple[NodeCheck, ...]] = {
    "XNNFullyConnected": (*_GEMM_CHECKS, check_blockwise_filter),
    "XNNConv2d": (*_GEMM_CHECKS, check_convolution_parameters),
    "XNNDepthwiseConv2d": (*_GEMM_CHECKS, check_convolution_parameters),
    "XNNConvTranspose2d": (*_GEMM_CHECKS, check_convolution_parameters),
    "XNNBatchMatrixMultiply": (check_bmm_datatypes,),
}
RESHAPES: dict[str, Reshape] = {
    "XNNFullyConnected": reshape_fully_connected,
    "XNNConv2d": reshape_convolution,
    "XNNDepthwiseConv2d": reshape_convolution,
    "XNNConvTranspose2d": reshape_deconvolution,
    "XNNBatchMatrixMultiply": reshape_batch_matrix_multiply,
}
