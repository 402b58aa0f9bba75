"""A bounds-checked, read-only view of a FlatBuffers table, addressed by field name.

The generated FlatBuffers readers trust their input: an offset or a vector length from a damaged file
reads outside the buffer or iterates billions of times. Here every read is checked against the region
the flatbuffer occupies (``[start, end)`` of a larger buffer, e.g. a memory-mapped ``.pte``), so a bad
file costs at most one pass over its own bytes and ends in a ``FlatbufferError`` that says where.
Nothing is copied: reads go straight to the underlying buffer.
"""

from __future__ import annotations

import struct
from typing import Any

from xnnguard.runtime_check.fbs_schema import FieldDef, FieldKind, Schema

__all__ = ["FlatbufferError", "Region", "TableView", "root_table"]

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U8 = struct.Struct("<B")
_STRUCTS: dict[str, struct.Struct] = {}


def _struct(fmt: str) -> struct.Struct:
    found = _STRUCTS.get(fmt)
    if found is None:
        found = _STRUCTS[fmt] = struct.Struct(fmt)
    return found


class FlatbufferError(ValueError):
    """The flatbuffer is damaged: an offset, a length or a type tag points outside what is valid."""


class Region:
    """``buffer[start:end]``, read without copying; every read is bounds-checked."""

    __slots__ = ("buffer", "start", "end", "what")

    def __init__(self, buffer: Any, start: int, end: int, what: str) -> None:
        self.buffer = buffer
        self.start = start
        self.end = end
        self.what = what

    def check(self, offset: int, size: int) -> None:
        if offset < self.start or offset + size > self.end:
            raise FlatbufferError(
                f"{self.what}: read of {size} bytes at offset {offset} is outside the flatbuffer "
                f"(bytes {self.start}..{self.end})"
            )

    def unpack(self, fmt: struct.Struct, offset: int) -> Any:
        self.check(offset, fmt.size)
        return fmt.unpack_from(self.buffer, offset)[0]

    def bytes_at(self, offset: int, size: int) -> bytes:
        self.check(offset, size)
        return bytes(self.buffer[offset : offset + size])


class TableView:
    """One table: ``view.scalar("num_externs")``, ``view.tables("xnodes")``, ``view.union("xnode_union")``."""

    __slots__ = ("region", "pos", "vtable", "vtable_size", "fields", "schema", "name")

    def __init__(self, region: Region, pos: int, name: str, schema: Schema) -> None:
        self.region = region
        self.pos = pos
        self.name = name
        self.schema = schema
        self.fields: dict[str, FieldDef] = schema.tables[name]
        self.vtable = pos - region.unpack(_I32, pos)
        self.vtable_size = region.unpack(_U16, self.vtable)
        if self.vtable_size % 2:
            raise FlatbufferError(f"{region.what}: {name} at {pos} has a bad vtable size {self.vtable_size}")
        region.check(self.vtable, self.vtable_size)

    def _field_pos(self, slot: int) -> int | None:
        """Where a field's bytes start, None when it is absent. As in the runtime, a field may lie anywhere
        in the flatbuffer (the table's own size is not a bound): reads check the region, not the table."""
        entry = 4 + 2 * slot
        if entry + 2 > self.vtable_size:
            return None
        offset = _U16.unpack_from(self.region.buffer, self.vtable + entry)[0]  # vtable range checked in __init__
        return None if offset == 0 else self.pos + offset

    def _field(self, name: str) -> FieldDef:
        return self.fields[name]

    def has(self, name: str) -> bool:
        return self._field_pos(self._field(name).slot) is not None

    def field_offset(self, name: str) -> int | None:
        """Where a scalar field's bytes are in the buffer (None when the field takes its default), for
        tools that patch a field in place."""
        return self._field_pos(self._field(name).slot)

    def vector_length_offset(self, name: str) -> int | None:
        """Where a vector's u32 length is in the buffer (None when the vector is absent)."""
        pos = self._field_pos(self._field(name).slot)
        return None if pos is None else self._indirect(pos)

    def union_tag_offset(self, name: str) -> int | None:
        """Where a union's u8 type tag is in the buffer (None when absent)."""
        return self._field_pos(self._field(name).slot - 1)

    def element_offsets(self, name: str) -> list[int]:
        """Where each element of a scalar vector is in the buffer."""
        field = self._field(name)
        size = struct.calcsize(field.scalar_format)
        start, length = self._vector(name, size)
        return [start + size * index for index in range(length)]

    def scalar(self, name: str) -> Any:
        # The hot path of reading a big delegate: one bounds check of the field's own bytes.
        field = self.fields[name]
        entry = 4 + 2 * field.slot
        if entry + 2 > self.vtable_size:
            return field.default
        offset = _U16.unpack_from(self.region.buffer, self.vtable + entry)[0]
        if offset == 0:
            return field.default
        fmt = _struct(field.scalar_format)
        pos = self.pos + offset
        if pos + fmt.size > self.region.end:
            raise FlatbufferError(f"{self.region.what}: field {name} of {self.name} at {self.pos} lies past the end")
        return fmt.unpack_from(self.region.buffer, pos)[0]

    def _indirect(self, pos: int) -> int:
        return pos + self.region.unpack(_U32, pos)

    def table(self, name: str) -> TableView | None:
        field = self._field(name)
        pos = self._field_pos(field.slot)
        return None if pos is None else TableView(self.region, self._indirect(pos), field.ref, self.schema)

    def string(self, name: str) -> str:
        pos = self._field_pos(self._field(name).slot)
        return "" if pos is None else self._string_at(self._indirect(pos))

    def _string_at(self, pos: int) -> str:
        return self._raw_string_at(pos).decode("utf-8", errors="replace")

    def _raw_string_at(self, pos: int) -> bytes:
        length = self.region.unpack(_U32, pos)
        return self.region.bytes_at(pos + 4, length)

    def raw_string(self, name: str) -> bytes:
        """A string field's bytes as stored (``string`` decodes them, replacing what is not UTF-8)."""
        pos = self._field_pos(self._field(name).slot)
        return b"" if pos is None else self._raw_string_at(self._indirect(pos))

    def _vector(self, name: str, element_size: int) -> tuple[int, int]:
        """(position of element 0, length); the whole vector is checked to lie in the region."""
        pos = self._field_pos(self._field(name).slot)
        if pos is None:
            return 0, 0
        vector = self._indirect(pos)
        length = self.region.unpack(_U32, vector)
        self.region.check(vector + 4, length * element_size)
        return vector + 4, length

    def vector_span(self, name: str) -> tuple[int, int]:
        """(start, byte length) of a scalar vector, e.g. the bytes of an inline delegate blob."""
        field = self._field(name)
        size = struct.calcsize(field.scalar_format)
        start, length = self._vector(name, size)
        return start, length * size

    def vector_length(self, name: str) -> int:
        field = self._field(name)
        size = struct.calcsize(field.scalar_format) if field.kind is FieldKind.SCALAR_VECTOR else 4
        return self._vector(name, size)[1]

    def scalars(self, name: str) -> tuple[Any, ...]:
        field = self._field(name)
        fmt = field.scalar_format
        size = struct.calcsize(fmt)
        start, length = self._vector(name, size)
        if not length:
            return ()
        return struct.unpack_from(f"<{length}{fmt[1:]}", self.region.buffer, start)

    def tables(self, name: str) -> list[TableView]:
        field = self._field(name)
        start, length = self._vector(name, 4)
        buffer = self.region.buffer
        return [
            TableView(self.region, start + 4 * i + _U32.unpack_from(buffer, start + 4 * i)[0], field.ref, self.schema)
            for i in range(length)
        ]

    def strings(self, name: str) -> list[str]:
        start, length = self._vector(name, 4)
        return [self._string_at(self._indirect(start + 4 * i)) for i in range(length)]

    def union(self, name: str) -> tuple[str, TableView | None]:
        """(member name, its table); ``("NONE", None)`` when the union holds nothing."""
        field = self._field(name)
        members = self.schema.union_members[field.ref]
        tables = self.schema.unions[field.ref]
        tag_pos = self._field_pos(field.slot - 1)
        tag = 0 if tag_pos is None else self.region.unpack(_U8, tag_pos)
        if tag >= len(members):
            raise FlatbufferError(f"{self.region.what}: {self.name} at {self.pos} has unknown {name} type {tag}")
        pos = self._field_pos(field.slot)
        if tag == 0 or pos is None:
            return members[tag], None
        return members[tag], TableView(self.region, self._indirect(pos), tables[tag], self.schema)


def root_table(region: Region, name: str, schema: Schema) -> TableView:
    """The root table of the flatbuffer that starts at ``region.start``."""
    return TableView(region, region.start + region.unpack(_U32, region.start), name, schema)
