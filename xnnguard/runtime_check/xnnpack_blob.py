"""The graph inside one XNNPACK delegate blob: values (datatype, shape, quantization, I/O) and nodes.

Layout (ExecuTorch 1.5.1, ``backends/xnnpack/serialization``): an optional 32-byte ``XH00`` header giving
the flatbuffer's offset and size, then an ``XNNGraph`` flatbuffer (identifier ``XN01``; the runtime also
accepts ``XN00`` and a blob without header). The field layout comes from the ``runtime_schema.fbs`` the
installed ExecuTorch ships, which is the schema the runtime itself is compiled against.

Everything here comes from the flatbuffer itself: per-channel scales that ExecuTorch stores in a scale
buffer (named data, like the weights) are described (index, count) but not read.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from xnnguard.boundary.package_files import XNNPACK_SCHEMA
from xnnguard.boundary.xnnpack_constants import (
    XNN_INVALID_VALUE_ID,  # "no value" in an id field: a missing bias, an unused concatenation input
    XNN_VALUE_FLAG_EXTERNAL_INPUT,
    XNN_VALUE_FLAG_EXTERNAL_OUTPUT,
)
from xnnguard.runtime_check.fbs_schema import FieldKind, Schema, executorch_schema
from xnnguard.runtime_check.flatbuffer_verifier import FlatbufferRejected, verify_flatbuffer
from xnnguard.runtime_check.flatbuffer_view import FlatbufferError, Region, TableView, root_table

__all__ = [
    "XNNPACK_BACKEND_ID",
    "BlobFormatError",
    "ConstantData",
    "GraphRejected",
    "PerChannelGroupQuant",
    "PerChannelQuant",
    "PerTensorQuant",
    "PerTokenDynamicQuant",
    "Quantization",
    "XnnGraph",
    "XnnNode",
    "XnnValue",
    "datatype_name",
    "graph_table",
    "read_xnnpack_blob",
]

XNNPACK_BACKEND_ID = "XnnpackBackend"
_HEADER_MAGIC = b"XH00"
_HEADER_LAYOUT = struct.Struct("<HIIIQ")  # header length, flatbuffer offset, size, constant offset, size
_HEADER_USED = 8 + _HEADER_LAYOUT.size  # XNNHeader::kMinSize, 30
_MIN_FLATBUFFER_SIZE = 8  # a root offset and an identifier
_IDENTIFIERS = (b"XN01", b"XN00")
_CONCATENATE = re.compile(r"XNNConcatenate(\d+)$")
_DATATYPE_PREFIX = "xnn_datatype_"


class BlobFormatError(ValueError):
    """The bytes are not a readable XNNPACK graph."""


class GraphRejected(BlobFormatError):
    """The runtime's flatbuffers verifier rejects the graph (``XNNCompiler.cpp:2171``): ``path`` names the
    table and field where it stops (``XNNGraph.xvalues[3].xvalue_union(XNNTensorValue).dims``)."""

    def __init__(self, rejected: FlatbufferRejected) -> None:
        super().__init__(str(rejected))
        self.path = rejected.path
        self.reason = rejected.reason


@dataclass(frozen=True)
class PerTensorQuant:
    scale: float
    zero_point: int


@dataclass(frozen=True)
class PerChannelQuant:
    """Per-channel scales: inline (``scales``) or in a scale buffer (``scale_buffer_idx`` > 0, not read)."""

    scales: tuple[float, ...]
    has_scale_vector: bool  # the ``scale`` vector is present (possibly empty); XNNCompiler dereferences it
    channel_dim: int
    scale_buffer_idx: int
    num_scales: int


@dataclass(frozen=True)
class PerChannelGroupQuant:
    scales: tuple[float, ...]
    has_scale_vector: bool
    channel_dim: int
    group_size: int
    scale_buffer_idx: int
    num_scales: int


@dataclass(frozen=True)
class PerTokenDynamicQuant:
    num_nonbatch_dims: int


Quantization = PerTensorQuant | PerChannelQuant | PerChannelGroupQuant | PerTokenDynamicQuant


@dataclass(frozen=True)
class XnnValue:
    id: int  # id_out: the id nodes refer to
    num_dims: int
    dims: tuple[int, ...]
    flags: int
    external_id: int
    constant_buffer_idx: int  # 0: not a constant; else an index into XnnGraph.constant_data
    datatype: str = "fp32"  # "fp32", "qint8", ... (XNNDatatype without its prefix); "unknown(N)" if not in the enum
    dq_datatype: str = "invalid"
    quantization: Quantization | None = None
    quantized_kind: str = ""  # the XNNQuantParams member for a quantized value ("NONE" if it holds none), else ""

    @property
    def is_constant(self) -> bool:
        return self.constant_buffer_idx > 0

    @property
    def is_external_input(self) -> bool:
        return bool(self.flags & XNN_VALUE_FLAG_EXTERNAL_INPUT)

    @property
    def is_external_output(self) -> bool:
        return bool(self.flags & XNN_VALUE_FLAG_EXTERNAL_OUTPUT)

    @property
    def is_external(self) -> bool:
        return self.is_external_input or self.is_external_output


@dataclass(frozen=True)
class XnnNode:
    index: int
    op: str  # the XNodeUnion member, e.g. "XNNConv2d"
    inputs: tuple[int, ...]  # ids read (no-value ids left out)
    outputs: tuple[int, ...]  # ids written
    # every id field the runtime uses, by name ("input1_id", "filter_id", ...), no-value ids included
    ids: dict[str, int] = field(default_factory=dict)
    # every other field of the op table: scalars as numbers, vectors as tuples ("perm": (0, 2, 1))
    params: dict[str, Any] = field(default_factory=dict)
    output_min_max: tuple[float, float] | None = None
    debug_handle: int = 0


@dataclass(frozen=True)
class ConstantData:
    """Where a constant's bytes are: a named-data key (1.5.1) or an offset into the blob's constant section."""

    offset: int
    size: int
    named_key: str | None  # None: the field is absent (XNNCompiler then reads the blob's constant section)
    raw_key: bytes | None = None  # the key's bytes as stored (named_key replaces what is not UTF-8)


@dataclass(frozen=True)
class XnnGraph:
    num_externs: int
    values: tuple[XnnValue, ...]
    nodes: tuple[XnnNode, ...]
    constant_data: tuple[ConstantData, ...] = ()
    constant_buffers: int = 0  # entries of the legacy inline constant_buffer table
    constant_region_size: int = 0  # bytes of constant data after the flatbuffer (XH00 header)
    has_header: bool = True  # an XH00 header: constants are then looked up in constant_data, else constant_buffer

    def value_map(self) -> dict[int, XnnValue]:
        """id -> value as the runtime sees it: for a duplicate id the first definition wins (XNNCompiler.cpp:672)."""
        found: dict[int, XnnValue] = {}
        for value in self.values:
            found.setdefault(value.id, value)
        return found


def _schema() -> Schema:
    return executorch_schema(XNNPACK_SCHEMA)


@cache
def _datatype_names() -> dict[int, str]:
    _, members = _schema().enums["XNNDatatype"]
    return {code: name.removeprefix(_DATATYPE_PREFIX) for name, code in members.items()}


def datatype_name(code: int) -> str:
    """``1`` -> ``"fp32"``: the serialized XNNDatatype code by its XNNPACK name."""
    return _datatype_names().get(code, f"unknown({code})")


@dataclass(frozen=True)
class _Layout:
    """How one op table's fields are read: ids the node reads, ids it writes, everything else."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    scalars: tuple[str, ...]
    vectors: tuple[str, ...]


@cache
def _layout(op: str, table: str) -> _Layout:
    """The fields of an op table, in schema order.

    Ids are the uint fields named ``*_id``; outputs are those named ``output*``. A concatenation of N
    reads only its first N inputs (the table has room for 5).
    """
    fields = _schema().tables[table].values()
    ids = [f.name for f in fields if f.kind is FieldKind.SCALAR and f.name.endswith("_id")]
    outputs = tuple(name for name in ids if name.startswith("output"))
    inputs = tuple(name for name in ids if not name.startswith("output"))
    if match := _CONCATENATE.match(op):
        inputs = tuple(name for name in inputs if name.startswith("input"))[: int(match.group(1))]
    scalars = tuple(f.name for f in fields if f.kind is FieldKind.SCALAR and not f.name.endswith("_id"))
    vectors = tuple(f.name for f in fields if f.kind is FieldKind.SCALAR_VECTOR)
    return _Layout(inputs, outputs, scalars, vectors)


def _quantization(kind: str, params: TableView | None) -> Quantization | None:
    if params is None:
        return None
    if kind == "PerTensorQuant":
        return PerTensorQuant(params.scalar("scale"), params.scalar("zero_point"))
    if kind == "PerChannelQuant":
        return PerChannelQuant(
            params.scalars("scale"),
            params.has("scale"),
            params.scalar("channel_dim"),
            params.scalar("scale_buffer_idx"),
            params.scalar("num_scales"),
        )
    if kind == "PerChannelGroupQuant":
        return PerChannelGroupQuant(
            params.scalars("scale"),
            params.has("scale"),
            params.scalar("channel_dim"),
            params.scalar("group_size"),
            params.scalar("scale_buffer_idx"),
            params.scalar("num_scales"),
        )
    if kind == "PerTokenDynamicQuant":
        return PerTokenDynamicQuant(params.scalar("num_nonbatch_dims"))
    return None


def _value(view: TableView) -> XnnValue:
    kind, table = view.union("xvalue_union")
    quantization: Quantization | None = None
    quantized_kind = ""
    if kind == "XNNQuantizedTensorValue" and table is not None:
        quantized_kind, params = table.union("quant_params")
        quantization = _quantization(quantized_kind, params)
        table = table.table("tensor_value")
    if table is None:
        raise FlatbufferError(f"value at {view.pos} holds no tensor ({kind})")
    return XnnValue(
        id=table.scalar("id_out"),
        num_dims=table.scalar("num_dims"),
        dims=table.scalars("dims"),
        flags=table.scalar("flags"),
        external_id=table.scalar("external_id"),
        constant_buffer_idx=table.scalar("constant_buffer_idx"),
        datatype=datatype_name(table.scalar("datatype")),
        dq_datatype=datatype_name(table.scalar("dq_datatype")),
        quantization=quantization,
        quantized_kind=quantized_kind,
    )


def _node(index: int, view: TableView) -> XnnNode:
    op, table = view.union("xnode_union")
    if table is None:
        raise FlatbufferError(f"node {index} holds no operation")
    layout = _layout(op, table.name)
    ids = {name: table.scalar(name) for name in (*layout.inputs, *layout.outputs)}
    inputs = tuple(ids[name] for name in layout.inputs if ids[name] != XNN_INVALID_VALUE_ID)
    outputs = tuple(ids[name] for name in layout.outputs if ids[name] != XNN_INVALID_VALUE_ID)
    params: dict[str, Any] = {name: table.scalar(name) for name in layout.scalars}
    for name in layout.vectors:
        params[name] = table.scalars(name) if table.has(name) else None
    min_max = view.table("output_min_max")
    output_min_max = None if min_max is None else (min_max.scalar("output_min"), min_max.scalar("output_max"))
    return XnnNode(index, op, inputs, outputs, ids, params, output_min_max, view.scalar("debug_handle"))


def _constant_data(entry: TableView) -> ConstantData:
    if not entry.has("named_key"):
        return ConstantData(entry.scalar("offset"), entry.scalar("size"), None)
    raw = entry.raw_string("named_key")
    return ConstantData(entry.scalar("offset"), entry.scalar("size"), raw.decode("utf-8", errors="replace"), raw)


def _flatbuffer_region(blob: Region) -> tuple[Region, int | None]:
    """The flatbuffer's region and the size of the constant section the header declares (None: no header).

    What ``XNNHeader::Parse`` and ``XNNCompiler::compileModel`` check before they verify the flatbuffer
    (``XNNHeader.cpp:44-105``, ``XNNCompiler.cpp:2133-2168``), no more: a blob of at least 30 bytes; with the
    ``XH00`` magic, a flatbuffer of at least 8 bytes inside the blob and a constant section inside it too,
    after the flatbuffer (the header's own length field is not read); an ``XN00`` or ``XN01`` identifier.
    """
    size = blob.end - blob.start
    if size < _HEADER_USED:  # Parse refuses it before it looks for the magic: "XNNHeader may be corrupt"
        raise BlobFormatError(f"the blob has {size} bytes, fewer than the {_HEADER_USED} the runtime reads first")
    constant_size: int | None = None
    if blob.bytes_at(blob.start + 4, 4) == _HEADER_MAGIC:
        _, offset, length, constant_offset, constant_size = _HEADER_LAYOUT.unpack_from(blob.buffer, blob.start + 8)
        if length < _MIN_FLATBUFFER_SIZE:
            raise BlobFormatError(f"XNNPACK header gives the graph {length} bytes, fewer than {_MIN_FLATBUFFER_SIZE}")
        if offset + length > size:
            raise BlobFormatError(
                f"XNNPACK header puts the graph at bytes {offset}..{offset + length} of a {size}-byte blob"
            )
        if constant_offset + constant_size > size or constant_offset < offset + length:
            raise BlobFormatError(
                f"XNNPACK header puts the constant data at bytes {constant_offset}..{constant_offset + constant_size} "
                f"of a {size}-byte blob whose graph is at bytes {offset}..{offset + length}"
            )
        flatbuffer = Region(blob.buffer, blob.start + offset, blob.start + offset + length, blob.what)
    else:
        flatbuffer = Region(blob.buffer, blob.start, blob.end, blob.what)
    found = flatbuffer.bytes_at(flatbuffer.start + 4, 4)
    if found not in _IDENTIFIERS:
        raise BlobFormatError(f"not an XNNPACK graph (no XH00 header and no XN01/XN00 identifier, found {found!r})")
    return flatbuffer, constant_size


def _verified_root(blob: Region) -> tuple[TableView, int | None]:
    """The root ``XNNGraph`` table, once the runtime's flatbuffers verifier would accept the graph, and the
    constant section's size; raises ``GraphRejected`` where the verifier would stop."""
    region, constant_size = _flatbuffer_region(blob)
    try:
        verify_flatbuffer(region.buffer, region.start, region.end, "XNNGraph", _schema())
    except FlatbufferRejected as rejected:
        raise GraphRejected(rejected) from None
    graph = root_table(region, "XNNGraph", _schema())
    missing = [name for name in ("xvalues", "xnodes") if not graph.has(name)]
    if missing:  # XNNCompiler.cpp:2177-2182
        raise BlobFormatError(f"the graph has no {' and no '.join(missing)}: the runtime refuses it")
    return graph, constant_size


def graph_table(blob: Region) -> TableView:
    """The root ``XNNGraph`` table of ``blob``, for readers that need field positions (tests mutate them)."""
    try:
        return _verified_root(blob)[0]
    except FlatbufferError as error:
        raise BlobFormatError(str(error)) from None


def read_xnnpack_blob(blob: Region) -> XnnGraph:
    """The graph in ``blob``; raises ``BlobFormatError`` saying what is damaged."""
    try:
        graph, constant_size = _verified_root(blob)
        return XnnGraph(
            num_externs=graph.scalar("num_externs"),
            values=tuple(_value(view) for view in graph.tables("xvalues")),
            nodes=tuple(_node(index, view) for index, view in enumerate(graph.tables("xnodes"))),
            constant_data=tuple(
                _constant_data(entry) for entry in graph.tables("constant_data")
            ),
            constant_buffers=graph.vector_length("constant_buffer"),
            constant_region_size=constant_size or 0,
            has_header=constant_size is not None,
        )
    except FlatbufferError as error:
        raise BlobFormatError(str(error)) from None
