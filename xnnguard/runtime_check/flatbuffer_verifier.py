"""The FlatBuffers verifier the runtime runs before it reads a flatbuffer, on the schema the runtime reads.

ExecuTorch runs ``flatbuffers::Verifier`` (FlatBuffers 24.3.25, the submodule of ExecuTorch 1.4 and 1.5)
on each XNNPACK graph before reading it (``XNNCompiler.cpp:2171-2175``, "FlatBuffer verification failed;
data may be truncated or corrupt") and on the Program when a program is loaded with
``Verification::InternalConsistency`` (``program.cpp:170-176``, the pybindings' ``Module`` default). A
flatbuffer it rejects does not load, and one it accepts is safe to read; so this module does exactly what
it does, neither more nor less: ``verifier.h`` and the ``Verify`` methods ``flatc`` generates from the
schema (field by field, in schema order), with the same limits (64 nested tables, 1,000,000 tables, 2 GiB).

What that means, for a table: its offset is 4-aligned and inside the buffer, its vtable (``table -
soffset``) is 2-aligned, of even size and inside; each present scalar field is aligned to its size and
inside; each present offset field is 4-aligned, non-zero, below 2**31 and points inside; a vector's length
is 4-aligned and its elements inside; a string is also NUL-terminated; a union's type byte is read and its
value verified as the table of that type (an unknown type passes, as ``flatc``'s ``default: return true``).
What it does *not* check, the runtime does not either: the table's inline size, element offsets of a
vector of tables being non-zero, element alignment beyond the length field.

Work is linear in the tables the buffer references (bounded by the table limit) and reads no byte outside
the flatbuffer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from xnnguard.runtime_check.fbs_schema import FieldKind, Schema

__all__ = ["MAX_DEPTH", "MAX_TABLES", "FlatbufferRejected", "verify_flatbuffer"]

MAX_DEPTH = 64  # Verifier::Options::max_depth
MAX_TABLES = 1_000_000  # Verifier::Options::max_tables
_MAX_SIZE = 2**31 - 1  # FLATBUFFERS_MAX_BUFFER_SIZE (the largest soffset_t)
_MIN_BUFFER_SIZE = 12  # FLATBUFFERS_MIN_BUFFER_SIZE: root offset, vtable offset, vtable size, table size

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")


class FlatbufferRejected(ValueError):
    """The verifier rejects the flatbuffer: ``path`` is where (``XNNGraph.xvalues[3].xvalue_union.dims``),
    ``reason`` what is wrong there."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.parts: list[str] = []

    @property
    def path(self) -> str:
        return "".join(self.parts).lstrip(".")

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.parts else self.reason


@dataclass(frozen=True)
class _Field:
    """One field as the generated ``Verify`` checks it: its vtable entry (byte offset in the vtable)."""

    name: str
    kind: FieldKind
    entry: int
    size: int = 0  # bytes of a scalar, or of a vector element
    ref: str = ""  # table or union


_plans: dict[int, tuple[Schema, dict[str, tuple[_Field, ...]]]] = {}


def _plan(schema: Schema) -> dict[str, tuple[_Field, ...]]:
    """Per table, its fields in schema order (the order of the generated checks); made once per schema."""
    found = _plans.get(id(schema))
    if found is not None and found[0] is schema:
        return found[1]
    tables: dict[str, tuple[_Field, ...]] = {}
    for name, fields in schema.tables.items():
        plan = []
        for field in sorted(fields.values(), key=lambda field: field.slot):
            size = struct.calcsize(field.scalar_format) if field.scalar_format else 4
            plan.append(_Field(field.name, field.kind, 4 + 2 * field.slot, size, field.ref))
        tables[name] = tuple(plan)
    _plans[id(schema)] = (schema, tables)
    return tables


class _Verifier:
    """``flatbuffers::Verifier`` over ``buffer[start:start + size]``; positions are relative to ``start``."""

    def __init__(self, buffer: Any, start: int, size: int, schema: Schema) -> None:
        self.buffer = buffer
        self.start = start
        self.size = size
        self.schema = schema
        self.plans = _plan(schema)
        self.depth = 0
        self.tables = 0

    def _inside(self, position: int, length: int) -> bool:
        """``Verifier::Verify(elem, elem_len)``: ``elem_len < size_ && elem <= size_ - elem_len``."""
        return position >= 0 and length < self.size and position <= self.size - length

    def _check(self, position: int, length: int, what: str) -> None:
        if not self._inside(position, length):
            raise FlatbufferRejected(
                f"{what} (bytes {position}..{position + length}) lies outside the {self.size}-byte flatbuffer"
            )

    def _check_aligned(self, position: int, length: int, what: str) -> None:
        """``Verify<T>(elem)``: aligned to its own size, then inside."""
        if position & (length - 1):
            raise FlatbufferRejected(f"{what} at byte {position} is not aligned to {length} bytes")
        self._check(position, length, what)

    def _read(self, fmt: struct.Struct, position: int) -> int:
        return int(fmt.unpack_from(self.buffer, self.start + position)[0])

    def offset(self, position: int, what: str) -> int:
        """``Verifier::VerifyOffset``: where the offset stored at ``position`` points."""
        self._check_aligned(position, 4, f"the offset to {what}")
        offset = self._read(_U32, position)
        if offset == 0:
            raise FlatbufferRejected(f"the offset to {what} at byte {position} is 0")
        if offset >= 2**31:
            raise FlatbufferRejected(f"the offset to {what} at byte {position} is {offset}, above 2**31 - 1")
        target = position + offset
        self._check(target, 1, f"{what}, {offset} bytes after its offset at byte {position},")
        return target

    def vector(self, position: int, element_size: int, what: str) -> int:
        """``VerifyVectorOrString``: the vector's element count (its bytes lie inside)."""
        self._check_aligned(position, 4, f"the length of {what}")
        count = self._read(_U32, position)
        if count >= _MAX_SIZE // element_size:
            raise FlatbufferRejected(f"{what} claims {count} elements, more than a flatbuffer can hold")
        self._check(position, 4 + element_size * count, f"{what} of {count} elements")
        return count

    def string(self, position: int, what: str) -> None:
        """``VerifyString``: a vector of bytes followed by a NUL."""
        end = position + 4 + self.vector(position, 1, what)
        self._check(end, 1, f"the terminator of {what}")
        if self.buffer[self.start + end] != 0:
            raise FlatbufferRejected(f"{what} is not NUL-terminated (byte {end} is {self.buffer[self.start + end]})")

    def table(self, position: int, name: str) -> None:
        """``T::Verify``: ``VerifyTableStart``, each field, ``EndTable``. The hot path of a big graph: the
        vtable is read in one piece, and scalar fields are checked inline."""
        self._check_aligned(position, 4, f"the {name} table")
        vtable = position - self._read(_I32, position)
        self.depth += 1
        self.tables += 1
        if self.depth > MAX_DEPTH:
            raise FlatbufferRejected(f"tables nest deeper than {MAX_DEPTH}")
        if self.tables > MAX_TABLES:
            raise FlatbufferRejected(f"the flatbuffer has more than {MAX_TABLES:,} tables, the verifier's limit")
        self._check_aligned(vtable, 2, f"the vtable of {name} (table at byte {position})")
        vtable_size = self._read(_U16, vtable)
        if vtable_size & 1:
            raise FlatbufferRejected(f"the vtable of {name} at byte {vtable} has an odd size {vtable_size}")
        self._check(vtable, vtable_size, f"the vtable of {name}")
        entries = struct.unpack_from(f"<{vtable_size // 2}H", self.buffer, self.start + vtable)
        size = self.size
        field = None
        try:
            for field in self.plans[name]:
                kind = field.kind
                if kind is FieldKind.UNION:
                    self._union(position, entries, field)
                    continue
                slot = field.entry >> 1
                offset = entries[slot] if slot < len(entries) else 0
                if not offset:
                    continue
                at = position + offset
                if kind is FieldKind.SCALAR:
                    length = field.size
                    if at & (length - 1) or not (length < size and at <= size - length):
                        self._check_aligned(at, length, f"field {field.name}")  # raises, saying which
                elif kind is FieldKind.STRING:
                    self.string(self.offset(at, "the string"), "the string")
                elif kind is FieldKind.TABLE:
                    self.table(self.offset(at, f"the {field.ref} table"), field.ref)
                elif kind is FieldKind.SCALAR_VECTOR:
                    self.vector(self.offset(at, "the vector"), field.size, "the vector")
                else:
                    self._offsets(self.offset(at, "the vector"), field)
        except FlatbufferRejected as rejected:
            rejected.parts.insert(0, f".{field.name}" if field is not None else "")
            raise
        self.depth -= 1

    def _offsets(self, vector: int, field: _Field) -> None:
        """A vector of tables or of strings: its offsets, then each element (the element offsets are read
        unchecked, as ``Vector<Offset<T>>::Get`` does)."""
        count = self.vector(vector, 4, "the vector")
        offsets = struct.unpack_from(f"<{count}I", self.buffer, self.start + vector + 4) if count else ()
        index = 0
        try:
            for index, offset in enumerate(offsets):
                element = vector + 4 + 4 * index + offset
                if field.kind is FieldKind.TABLE_VECTOR:
                    self.table(element, field.ref)
                else:
                    self.string(element, "the string")
        except FlatbufferRejected as rejected:
            rejected.parts.insert(0, f"[{index}]")
            raise

    def _union(self, table: int, entries: tuple[int, ...], field: _Field) -> None:
        """The type byte (the slot before), the value's offset, then the value as the table of that type."""
        slot = field.entry >> 1
        type_offset = entries[slot - 1] if slot - 1 < len(entries) else 0
        tag = 0
        if type_offset:
            self._check_aligned(table + type_offset, 1, f"the type of {field.name}")
            tag = self._read(_U8, table + type_offset)
        offset = entries[slot] if slot < len(entries) else 0
        if not offset:
            return
        target = self.offset(table + offset, f"the {field.name} value")
        members = self.schema.unions[field.ref]
        if 0 < tag < len(members):  # NONE and unknown types pass (the generated switch's default)
            try:
                self.table(target, members[tag])
            except FlatbufferRejected as rejected:
                rejected.parts.insert(0, f"({self.schema.union_members[field.ref][tag]})")
                raise


def verify_flatbuffer(
    buffer: Any, start: int, end: int, root: str, schema: Schema, identifier: bytes | None = None
) -> None:
    """``Verifier(buffer + start, end - start).VerifyBuffer<root>(identifier)``; raises ``FlatbufferRejected``
    naming the table and field where it stops (``Program.execution_plan[0].values[3].val(Tensor).sizes``)."""
    size = end - start
    verifier = _Verifier(buffer, start, size, schema)
    if size < _MIN_BUFFER_SIZE:
        raise FlatbufferRejected(f"{size} bytes is shorter than any flatbuffer ({_MIN_BUFFER_SIZE})")
    if identifier is not None and bytes(buffer[start + 4 : start + 8]) != identifier:
        raise FlatbufferRejected(f"the identifier is {bytes(buffer[start + 4 : start + 8])!r}, not {identifier!r}")
    try:
        verifier.table(verifier.offset(0, f"the root {root} table"), root)
    except FlatbufferRejected as rejected:
        rejected.parts.insert(0, root)
        raise
