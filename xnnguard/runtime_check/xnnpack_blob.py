"""The graph inside one XNNPACK delegate blob: its values (shape, I/O flags) and its nodes (reads, writes).

Layout (ExecuTorch 1.5.1, ``backends/xnnpack/serialization``): an optional 32-byte ``XH00`` header giving
the flatbuffer's offset and size, then an ``XNNGraph`` flatbuffer (identifier ``XN01``; the runtime also
accepts ``XN00`` and a blob without header). The field layout comes from the ``runtime_schema.fbs`` the
installed ExecuTorch ships, which is the schema the runtime itself is compiled against.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from functools import cache

from xnnguard.runtime_check.fbs_schema import FieldKind, Schema, executorch_schema
from xnnguard.runtime_check.flatbuffer_view import FlatbufferError, Region, TableView, root_table
from xnnguard.xnnpack_constants import (
    XNN_INVALID_VALUE_ID,  # "no value" in an id field: a missing bias, an unused concatenation input
    XNN_VALUE_FLAG_EXTERNAL_INPUT,
    XNN_VALUE_FLAG_EXTERNAL_OUTPUT,
)

__all__ = ["XNNPACK_BACKEND_ID", "BlobFormatError", "XnnGraph", "XnnNode", "XnnValue", "read_xnnpack_blob"]

XNNPACK_BACKEND_ID = "XnnpackBackend"
_HEADER_MAGIC = b"XH00"
_HEADER_LAYOUT = struct.Struct("<HIIIQ")  # header length, flatbuffer offset, size, constant offset, size
_HEADER_USED = 8 + _HEADER_LAYOUT.size
_IDENTIFIERS = (b"XN01", b"XN00")
_CONCATENATE = re.compile(r"XNNConcatenate(\d+)$")


class BlobFormatError(ValueError):
    """The bytes are not a readable XNNPACK graph."""


@dataclass(frozen=True)
class XnnValue:
    id: int  # id_out: the id nodes refer to
    num_dims: int
    dims: tuple[int, ...]
    flags: int
    external_id: int
    is_constant: bool

    @property
    def is_external_input(self) -> bool:
        return bool(self.flags & XNN_VALUE_FLAG_EXTERNAL_INPUT)

    @property
    def is_external_output(self) -> bool:
        return bool(self.flags & XNN_VALUE_FLAG_EXTERNAL_OUTPUT)


@dataclass(frozen=True)
class XnnNode:
    index: int
    op: str  # the XNodeUnion member, e.g. "XNNConv2d"
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclass(frozen=True)
class XnnGraph:
    num_externs: int
    values: tuple[XnnValue, ...]
    nodes: tuple[XnnNode, ...]


def _schema() -> Schema:
    return executorch_schema("backends/xnnpack/serialization/runtime_schema.fbs")


@cache
def _io_fields(op: str, table: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(input id fields, output id fields) of an op table, in schema order.

    Ids are the uint fields named ``*_id``; outputs are those named ``output*``. A concatenation of N
    reads only its first N inputs (the table has room for 5).
    """
    ids = [f.name for f in _schema().tables[table].values() if f.kind is FieldKind.SCALAR and f.name.endswith("_id")]
    outputs = tuple(name for name in ids if name.startswith("output"))
    inputs = tuple(name for name in ids if not name.startswith("output"))
    if match := _CONCATENATE.match(op):
        inputs = tuple(name for name in inputs if name.startswith("input"))[: int(match.group(1))]
    return inputs, outputs


def _value(view: TableView) -> XnnValue:
    kind, table = view.union("xvalue_union")
    if kind == "XNNQuantizedTensorValue" and table is not None:
        table = table.table("tensor_value")
    if table is None:
        raise FlatbufferError(f"value at {view.pos} holds no tensor ({kind})")
    return XnnValue(
        id=table.scalar("id_out"),
        num_dims=table.scalar("num_dims"),
        dims=table.scalars("dims"),
        flags=table.scalar("flags"),
        external_id=table.scalar("external_id"),
        is_constant=table.scalar("constant_buffer_idx") > 0,
    )


def _node(index: int, view: TableView) -> XnnNode:
    op, table = view.union("xnode_union")
    if table is None:
        raise FlatbufferError(f"node {index} holds no operation")
    input_fields, output_fields = _io_fields(op, table.name)
    inputs = tuple(i for i in (table.scalar(name) for name in input_fields) if i != XNN_INVALID_VALUE_ID)
    outputs = tuple(o for o in (table.scalar(name) for name in output_fields) if o != XNN_INVALID_VALUE_ID)
    return XnnNode(index, op, inputs, outputs)


def _flatbuffer_region(blob: Region) -> Region:
    size = blob.end - blob.start
    magic = blob.bytes_at(blob.start + 4, 4) if size >= 8 else b""
    if magic == _HEADER_MAGIC:
        if size < _HEADER_USED:
            raise BlobFormatError(f"XNNPACK header is cut off ({size} bytes)")
        header_length, offset, length, _, _ = _HEADER_LAYOUT.unpack_from(blob.buffer, blob.start + 8)
        if header_length < _HEADER_USED or offset < header_length or offset + length > size:
            raise BlobFormatError(
                f"XNNPACK header puts the graph at bytes {offset}..{offset + length} of a {size}-byte blob "
                f"(header length {header_length})"
            )
        flatbuffer = Region(blob.buffer, blob.start + offset, blob.start + offset + length, blob.what)
    else:
        flatbuffer = Region(blob.buffer, blob.start, blob.end, blob.what)
    found = flatbuffer.bytes_at(flatbuffer.start + 4, 4) if flatbuffer.end - flatbuffer.start >= 8 else b""
    if found not in _IDENTIFIERS:
        raise BlobFormatError(
            f"not an XNNPACK graph (no XH00 header and no XN01/XN00 identifier{f', found {found!r}' if found else ''})"
        )
    return flatbuffer


def read_xnnpack_blob(blob: Region) -> XnnGraph:
    """The graph in ``blob``; raises ``BlobFormatError`` saying what is damaged."""
    try:
        graph = root_table(_flatbuffer_region(blob), "XNNGraph", _schema())
        return XnnGraph(
            num_externs=graph.scalar("num_externs"),
            values=tuple(_value(view) for view in graph.tables("xvalues")),
            nodes=tuple(_node(index, view) for index, view in enumerate(graph.tables("xnodes"))),
        )
    except FlatbufferError as error:
        raise BlobFormatError(str(error)) from None
