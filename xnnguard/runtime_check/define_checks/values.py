"""Value definition: what ``XNNCompiler::defineTensor`` and XNNPACK's ``xnn_define_*_tensor_value`` check.

Each value of a delegate is defined before any node, in order (``XNNCompiler.cpp:2243``); the first
failure fails the load ("Failed to define tensor"). Ranks above 6 and external ids out of range are
checked in ``xnnguard.runtime_check.checks``; the rest of the per-value rules live here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from xnnguard.boundary.xnnpack_constants import (
    XNN_INVALID_VALUE_ID,
    XNN_VALUE_FLAG_EXTERNAL_INPUT,
    XNN_VALUE_FLAG_EXTERNAL_OUTPUT,
)
from xnnguard.runtime_check.define_checks.base import AT_LOAD, AT_RUN, Finding, byte_size, is_normal_positive
from xnnguard.runtime_check.xnnpack_blob import (
    PerChannelGroupQuant,
    PerChannelQuant,
    PerTensorQuant,
    PerTokenDynamicQuant,
    XnnGraph,
    XnnValue,
)

__all__ = ["VALUE_CHECKS", "check_unique_value_ids", "value_findings"]

_EXTERNAL_FLAGS = XNN_VALUE_FLAG_EXTERNAL_INPUT | XNN_VALUE_FLAG_EXTERNAL_OUTPUT
# xnn_define_tensor_value (src/tensor.c:132-144)
_PLAIN_DATATYPES = frozenset({"fp32", "fp16", "bf16", "int32", "pfp32"})
# check_zero_point (src/tensor.c:50-100): the zero points each quantized datatype accepts
_ZERO_POINT_RANGES = {
    "qint8": (-128, 127),
    "quint8": (0, 255),
    "qcint4": (0, 15),
    "qbint4": (0, 15),
    "qint32": (0, 0),
    "qcint8": (0, 0),
    "qcint32": (0, 0),
}
# xnn_validate_channelwise_quantized_tensor (src/tensor.c:400-410)
_CHANNELWISE_DATATYPES = frozenset({"qcint4", "qcint8", "qcint32"})


def _as_size_t(number: int) -> int:
    """An ``int`` field passed where XNNPACK takes a ``size_t``: a negative one becomes huge."""
    return number if number >= 0 else number + 2**64


def check_value_flags(value: XnnValue, graph: XnnGraph) -> Iterator[Finding]:
    """Flags are a subset of EXTERNAL_INPUT | EXTERNAL_OUTPUT (XNNCompiler.cpp:342-349)."""
    if value.flags & ~_EXTERNAL_FLAGS:
        yield Finding(
            "value_def",
            f"has flags 0x{value.flags:x}, the runtime allows only external input (1) and output (2): {AT_LOAD}",
            value.id,
        )


def check_external_value_has_no_data(value: XnnValue, graph: XnnGraph) -> Iterator[Finding]:
    """A value with data is static even when flagged external (src/tensor.c:26-35); binding it at the first
    execute fails ("Value is not external", src/runtime.c:61)."""
    if value.is_external and value.is_constant:
        yield Finding(
            "extern_ids",
            f"is a delegate {'input' if value.is_external_input else 'output'} and also has constant data "
            f"(constant {value.constant_buffer_idx}): XNNPACK treats it as static, so {AT_RUN} (binding it fails)",
            value.id,
        )


def check_internal_value_has_no_external_id(value: XnnValue, graph: XnnGraph) -> Iterator[Finding]:
    """A value that is neither input nor output has external id XNN_INVALID_VALUE_ID: XNNPACK defines a value
    with any other id in that external slot (``subgraph->values + external_id``, src/tensor.c:146), where it
    replaces the delegate input or output bound there, and rejects an id >= num_externs (src/tensor.c:117)."""
    if value.is_external or value.external_id == XNN_INVALID_VALUE_ID:
        return
    num_externs = graph.num_externs
    if value.external_id >= num_externs:
        consequence = f"outside the {num_externs} the delegate reserves: {AT_LOAD}"
    else:
        consequence = (
            f"so XNNPACK puts it in the slot of delegate argument {value.external_id}, which then is no longer "
            f"bound to the argument: {AT_LOAD} or {AT_RUN.removeprefix('the method ')}"
        )
    yield Finding("extern_ids", f"is internal but has external id {value.external_id}, {consequence}", value.id)


def check_plain_datatype(value: XnnValue, graph: XnnGraph) -> Iterator[Finding]:
    """A value without quantization is fp32, fp16, bf16, int32 or pfp32 (xnn_define_tensor_value, tensor.c:132)."""
    if not value.quantized_kind and value.dq_datatype == "invalid" and value.datatype not in _PLAIN_DATATYPES:
        yield Finding(
            "datatype",
            f"is a {value.datatype} value without quantization parameters: XNNPACK defines only "
            f"{', '.join(sorted(_PLAIN_DATATYPES))} that way, so {AT_LOAD}",
            value.id,
        )


def _check_zero_point(value: XnnValue, zero_point: int) -> Iterator[Finding]:
    limits = _ZERO_POINT_RANGES.get(value.datatype)
    if limits is None:
        yield Finding(
            "datatype",
            f"is a {value.datatype} value with {type(value.quantization).__name__} parameters: "
            f"XNNPACK quantizes {', '.join(sorted(_ZERO_POINT_RANGES))} only, so {AT_LOAD}",
            value.id,
        )
    elif not limits[0] <= zero_point <= limits[1]:
        yield Finding(
            "quant_range",
            f"has zero point {zero_point}, outside [{limits[0]}, {limits[1]}] for {value.datatype}: {AT_LOAD}",
            value.id,
        )


def _check_scales(value: XnnValue, scales: tuple[float, ...], what: str) -> Iterator[Finding]:
    for channel, scale in enumerate(scales):
        if not is_normal_positive(scale):
            yield Finding(
                "quant_range",
                f"has {what}{f' {channel}' if len(scales) > 1 else ''} of {scale:.7g}: XNNPACK needs a positive, "
                f"normal float32 scale, so {AT_LOAD}",
                value.id,
            )
            return


def check_per_tensor_quantization(value: XnnValue, graph: XnnGraph) -> Iterator[Finding]:
    """Zero point in its datatype's range and ``scale > 0 && isnormal(scale)`` (xnn_validate_quantized_tensor,
    src/tensor.c:338-364)."""
    quantization = value.quantization
    if not isinstance(quantization, PerTensorQuant):
        return
    if value.datatype in _CHANNELWISE_DATATYPES:
        # tensor.c accepts it, but the nodes that take a channelwise datatype read per-channel scales this
        # value does not have (a NULL pointer): the runtime crashes or fails to create the node
        yield Finding(
            "datatype",
            f"is a per-channel datatype ({value.datatype}) with per-tensor quantization: the runtime crashes or "
            "fails to create its node",
            value.id,
        )
        return
    yield from _check_zero_point(value, quantization.zero_point)
    yield from _check_scales(value, (quantization.scale,), "scale")


def _scale_count(value: XnnValue, quantization: PerChannelQuant | PerChannelGroupQuant, graph: XnnGraph) -> int | None:
    """How many scales the runtime can read: inline ones, or the scale buffer's bytes (None: its entry is bad)."""
    if quantization.scale_buffer_idx == 0:
        return len(quantization.scales)
    if quantization.scale_buffer_idx >= len(graph.constant_data):
        return None
    element = 4 if isinstance(quantization, PerChannelQuant) else 2  # fp32 channel scales, bf16 block scales
    return graph.constant_data[quantization.scale_buffer_idx].size // element


_SCALE_KEY_PREFIX = "scale_"  # ExecuTorch 1.5.1 names a scale buffer "scale_<sha256>" (node_visitor.py:296-297)


def _key(graph: XnnGraph, index: int) -> str:
    key = graph.constant_data[index].named_key
    return f"named {key[:20]}..." if key else "an unnamed entry"


def _holds_scales(graph: XnnGraph, index: int) -> bool:
    """Whether constant ``index`` is a scale buffer by ExecuTorch's naming: a tensor's data is named by the bare
    hash of its bytes, a scale buffer ``scale_<hash>``. Entries not named this way are given the benefit."""
    key = graph.constant_data[index].named_key
    if key is None or not _is_hash_name(key.removeprefix(_SCALE_KEY_PREFIX)):
        return True
    return key.startswith(_SCALE_KEY_PREFIX)


def _is_hash_name(key: str) -> bool:
    return len(key) == 64 and all(c in "0123456789abcdef" for c in key)


def check_per_channel_quantization(value: XnnValue, graph: XnnGraph) -> Iterator[Finding]:
    """xnn_validate_channelwise_quantized_tensor (src/tensor.c:366-424) after XNNCompiler.cpp:502-549.

    rank >= 1, 0 <= channel_dim < rank, a channelwise datatype, and ``dims[channel_dim]`` positive normal
    scales. XNNCompiler dereferences the inline ``scale`` vector even when a scale buffer is used, and never
    compares the number of scales with ``dims[channel_dim]``: too few is a read past them.
    """
    quantization = value.quantization
    if not isinstance(quantization, PerChannelQuant):
        return
    rank = len(value.dims)
    channel_dim = _as_size_t(quantization.channel_dim)
    if rank == 0 or channel_dim >= rank:
        yield Finding(
            "quant_range",
            f"has per-channel quantization along dim {quantization.channel_dim} of a rank-{rank} tensor: {AT_LOAD}",
            value.id,
        )
        return
    if value.datatype not in _CHANNELWISE_DATATYPES:
        yield Finding(
            "datatype",
            f"is a {value.datatype} value with per-channel quantization: XNNPACK quantizes "
            f"{', '.join(sorted(_CHANNELWISE_DATATYPES))} per channel only, so {AT_LOAD}",
            value.id,
        )
        return
    if quantization.scale_buffer_idx >= len(graph.constant_data) and quantization.scale_buffer_idx:
        yield Finding(
            "constants",
            f"takes its scales from constant {quantization.scale_buffer_idx}, the delegate has "
            f"{len(graph.constant_data)}: {AT_LOAD}",
            value.id,
        )
        return
    if quantization.scale_buffer_idx and not _holds_scales(graph, quantization.scale_buffer_idx):
        yield Finding(
            "constants",
            f"takes its scales from constant {quantization.scale_buffer_idx}, which holds a tensor's data "
            f"({_key(graph, quantization.scale_buffer_idx)}), not scales: XNNPACK reads its bytes as scales, so "
            f"{AT_LOAD} or computes garbage",
            value.id,
        )
        return
    if not quantization.has_scale_vector and quantization.scale_buffer_idx == 0:
        yield Finding(
            "quant_range",
            f"has per-channel quantization without scales (no scale vector, no scale buffer): {AT_LOAD} "
            "or the runtime crashes",
            value.id,
        )
        return
    channels = value.dims[channel_dim]
    available = _scale_count(value, quantization, graph)
    if available is not None and available < channels:
        yield Finding(
            "quant_range",
            f"has {available} per-channel scales for {channels} channels (dim {channel_dim}): XNNPACK reads past "
            "the scales, so the numbers are garbage or the runtime crashes",
            value.id,
        )
        return
    if quantization.scale_buffer_idx == 0:
        yield from _check_scales(value, quantization.scales[:channels], "scale of channel")


def check_per_channel_group_quantization(value: XnnValue, graph: XnnGraph) -> Iterator[Finding]:
    """XNNCompiler.cpp:550-630, then xnn_define_blockwise_quantized_tensor_value (src/tensor.c:506-665).

    qbint4 only; XNNCompiler reads dims 0 and 1 without checking the rank and divides by ``group_size``;
    the scale count must be ``dims[0] * dims[1] / group_size``.
    """
    quantization = value.quantization
    if not isinstance(quantization, PerChannelGroupQuant):
        return
    if value.datatype != "qbint4":
        yield Finding(
            "datatype", f"is a {value.datatype} value with blockwise quantization (qbint4 only): {AT_LOAD}", value.id
        )
        return
    if len(value.dims) < 2 or quantization.group_size <= 0:
        yield Finding(
            "quant_range",
            f"has blockwise quantization with group size {quantization.group_size} on a rank-{len(value.dims)} "
            f"tensor: the runtime needs rank >= 2 and a positive group size, so it crashes or {AT_LOAD}",
            value.id,
        )
        return
    if quantization.scale_buffer_idx and (
        quantization.scale_buffer_idx >= len(graph.constant_data)
        or not _holds_scales(graph, quantization.scale_buffer_idx)
    ):
        yield Finding(
            "constants",
            f"takes its block scales from constant {quantization.scale_buffer_idx}, which is not a scale buffer: "
            f"{AT_LOAD} or computes garbage",
            value.id,
        )
        return
    channel_dim = _as_size_t(quantization.channel_dim)
    expected = value.dims[0] * value.dims[1] // quantization.group_size
    count = quantization.num_scales if quantization.scale_buffer_idx else len(quantization.scales)
    if channel_dim >= len(value.dims) or count != expected:
        yield Finding(
            "quant_range",
            f"has {count} block scales along dim {quantization.channel_dim}, the runtime expects {expected} "
            f"({value.dims[0]} x {value.dims[1]} / group size {quantization.group_size}): {AT_LOAD}",
            value.id,
        )
        return
    if quantization.scale_buffer_idx == 0:
        yield from _check_scales(value, quantization.scales, "block scale")
        return
    entry = graph.constant_data[quantization.scale_buffer_idx]
    if entry.named_key is None and entry.size < 2 * count:  # bf16 scales in the blob (named: see named_data)
        yield Finding(
            "constants",
            f"takes its {count} block scales ({2 * count} bytes) from constant {quantization.scale_buffer_idx}, "
            f"which has {entry.size}: XNNPACK reads past it, so {AT_LOAD} or computes garbage",
            value.id,
        )


def check_dynamic_quantization(value: XnnValue, graph: XnnGraph) -> Iterator[Finding]:
    """PerTokenDynamicQuant: qdint8, no constant data, no external flags, ``num_nonbatch_dims <= rank``
    (XNNCompiler.cpp:638; xnn_define_dynamically_quantized_tensor_value, src/tensor.c:229-304)."""
    quantization = value.quantization
    if not isinstance(quantization, PerTokenDynamicQuant):
        return
    if value.datatype != "qdint8":
        reason = f"it is {value.datatype} (only qdint8 is dynamically quantized)"
    elif value.is_constant:
        reason = "it has constant data"
    elif value.is_external:
        reason = "it is a delegate input or output (XNNPACK has no external dynamically quantized tensors)"
    elif _as_size_t(quantization.num_nonbatch_dims) > len(value.dims):
        reason = f"its {quantization.num_nonbatch_dims} non-batch dims exceed its rank {len(value.dims)}"
    else:
        return
    yield Finding("value_def", f"is dynamically quantized but {reason}: {AT_LOAD}", value.id)


def check_quantized_value_has_parameters(value: XnnValue, graph: XnnGraph) -> Iterator[Finding]:
    """A quantized tensor value holds one of the four kinds of parameters (XNNCompiler.cpp:650-660)."""
    if value.quantized_kind and value.quantization is None:
        yield Finding("value_def", f"is a quantized value without quantization parameters: {AT_LOAD}", value.id)


def check_constant_entry(value: XnnValue, graph: XnnGraph) -> Iterator[Finding]:
    """getConstantDataPtr (XNNCompiler.cpp:179-275): the index exists; an offset entry lies in the constant
    section. The bytes are never compared with the tensor's size there, so a smaller entry is a read past
    its end: flagged here too."""
    index = value.constant_buffer_idx
    if not index:
        return
    entries = len(graph.constant_data) if graph.has_header else graph.constant_buffers
    if index >= entries:
        table = "constant_data" if graph.has_header else "constant_buffer"
        yield Finding("constants", f"has constant {index}, the delegate's {table} has {entries}: {AT_LOAD}", value.id)
        return
    if not graph.has_header:
        return
    entry = graph.constant_data[index]
    if entry.named_key is None and not (
        entry.offset <= graph.constant_region_size and entry.size <= graph.constant_region_size - entry.offset
    ):
        yield Finding(
            "constants",
            f"has constant {index} at bytes {entry.offset}..{entry.offset + entry.size}, outside the "
            f"{graph.constant_region_size}-byte constant section: {AT_LOAD}",
            value.id,
        )
        return
    needed = byte_size(value)
    if needed is not None and entry.size < needed:
        yield Finding(
            "constants",
            f"is a {list(value.dims)} {value.datatype} constant ({needed} bytes) whose data has {entry.size} bytes: "
            "XNNPACK reads past it, so the numbers are garbage or the runtime crashes",
            value.id,
        )


def check_unique_value_ids(graph: XnnGraph) -> Iterator[Finding]:
    """``id_out`` identifies one value: for a duplicate the runtime keeps the first (XNNCompiler.cpp:672) and
    the second one's nodes read the wrong tensor."""
    counts = Counter(value.id for value in graph.values)
    for value_id, count in counts.items():
        if count > 1:
            yield Finding(
                "value_def",
                f"is the id of {count} values: the runtime keeps the first, nodes meant for the others read it",
                value_id,
            )


ValueCheck = Callable[[XnnValue, XnnGraph], Iterator[Finding]]
# in the order XNNCompiler::defineTensor meets them
VALUE_CHECKS: tuple[ValueCheck, ...] = (
    check_value_flags,
    check_internal_value_has_no_external_id,
    check_external_value_has_no_data,
    check_plain_datatype,
    check_quantized_value_has_parameters,
    check_per_tensor_quantization,
    check_per_channel_quantization,
    check_per_channel_group_quantization,
    check_dynamic_quantization,
    check_constant_entry,
)


def value_findings(graph: XnnGraph) -> Iterator[Finding]:
    """Every per-value rule, value by value, in the order the runtime defines them."""
    yield from check_unique_value_ids(graph)
    for value in graph.values:
        for check in VALUE_CHECKS:
            yield from check(value, graph)
