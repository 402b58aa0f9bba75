"""What ``Program::load`` checks before any method loads, on the file alone (``program.cpp:74-318``).

The runtime reads the first 64 bytes, its extended header (``eh00``: the program's size, where segments
start and how many bytes they take, all of which must fit in the file), the ``ET12`` identifier, then,
with ``Verification::InternalConsistency`` (the pybindings' ``Module`` default), runs the flatbuffers
verifier over the Program and ``validate_program`` (``program_validation.cpp``: tensor sizes that are
non-negative and whose byte count fits in 64 bits, known scalar types, tensor lists of tensors). Named
data needs a segment table, and a constant segment must exist and lie in the file. ExecuTorch 1.4.0 and
1.5.1 run the same code here, but for one check 1.5's runtime adds: a program whose schema ``version`` is
above the runtime's ``kMaxSupportedSchemaVersion`` (read from the header the wheel ships) is refused. A
program the verifier rejects may still load with ``Verification::Minimal``, but then the runtime reads a
damaged flatbuffer unchecked: ``verify`` calls it unreadable.

``ProgramLayout`` says where the Program and the segments are; ``check_program`` raises
``ProgramRejected`` naming what the runtime would refuse.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from xnnguard.boundary.package_files import PROGRAM_HEADER, max_schema_version
from xnnguard.runtime_check.fbs_schema import Schema
from xnnguard.runtime_check.flatbuffer_verifier import FlatbufferRejected, verify_flatbuffer
from xnnguard.runtime_check.flatbuffer_view import FlatbufferError, Region, TableView, root_table

__all__ = ["ELEMENT_SIZES", "PROGRAM_IDENTIFIER", "ProgramLayout", "ProgramRejected", "check_program", "program_layout"]

PROGRAM_IDENTIFIER = b"ET12"
_HEAD_BYTES = 64  # ExtendedHeader::kNumHeadBytes: Program::load reads these first, so a shorter file fails
_EXTENDED_HEADER_MAGIC = b"eh00"
_MIN_HEADER_LENGTH = 24  # magic, length, program_size, segment_base_offset
_HEADER_WITH_DATA_SIZE = 32  # ... and segment_data_size (ExecuTorch 1.0 on)
_MIN_PROGRAM_SIZE = 8  # a root offset and an identifier
_U64_LIMIT = 2**64
_SSIZE_LIMIT = 2**63
_STATIC = 0  # TensorShapeDynamism::STATIC
_UNDEFINED_SCALAR_TYPE = 30  # ScalarType::Undefined; NumOptions is 31
# bytes per element of each ScalarType the runtime knows (runtime/core/portable_type/scalar_type.h)
ELEMENT_SIZES = dict(
    enumerate([1, 1, 2, 4, 8, 2, 4, 8, 4, 8, 16, 1, 1, 1, 4, 2, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 2, 4, 8])
)


class ProgramRejected(ValueError):
    """The runtime refuses the program before any method loads; the message says what and where."""


@dataclass(frozen=True)
class ProgramLayout:
    """Where things are in the file: the Program flatbuffer is ``[0, program_size)``; segments start at
    ``segment_base`` (0: the file has none)."""

    file_size: int
    program_size: int
    segment_base: int
    segment_data_size: int

    def loadable(self, offset: int, size: int) -> bool:
        """``DataLoader::load(offset, size)`` succeeds: the bytes lie in the file (no overflow)."""
        return offset >= 0 and size >= 0 and offset + size < _U64_LIMIT and offset + size <= self.file_size


def program_layout(buffer: Any) -> ProgramLayout:
    """The extended header as ``Program::load`` reads it, with its checks against the file's length."""
    size = len(buffer)
    if size < 8 or bytes(buffer[4:8]) != PROGRAM_IDENTIFIER:
        found = bytes(buffer[4:8]) if size >= 8 else b""
        raise ProgramRejected(
            f"not an ExecuTorch program (no {PROGRAM_IDENTIFIER.decode()} identifier at bytes 4..8"
            f"{f', found {found!r}' if found else ''})"
        )
    if bytes(buffer[8:12]) != _EXTENDED_HEADER_MAGIC:  # no header: the program is the whole file, no segments
        if size < _HEAD_BYTES:
            raise ProgramRejected(f"the file has {size} bytes, fewer than the {_HEAD_BYTES} the runtime reads first")
        return ProgramLayout(size, size, 0, 0)
    if size < _HEAD_BYTES:
        raise ProgramRejected(f"the file has {size} bytes, fewer than the {_HEAD_BYTES} the runtime reads first")
    header_length, program_size, segment_base = struct.unpack_from("<IQQ", buffer, 12)
    if header_length < _MIN_HEADER_LENGTH:
        raise ProgramRejected(f"extended header length {header_length} is too small")
    data_size = struct.unpack_from("<Q", buffer, 32)[0] if header_length >= _HEADER_WITH_DATA_SIZE else 0
    if program_size > size:
        raise ProgramRejected(f"extended header says the program has {program_size} bytes, file has {size}")
    # segment_data_size 0 with segments means a file from before ExecuTorch 1.0: the runtime checks nothing
    if (data_size == 0 and segment_base == 0) or data_size > 0:
        if segment_base + data_size >= _U64_LIMIT:
            raise ProgramRejected(f"extended header's segment base {segment_base} + size {data_size} overflows")
        expected = segment_base + data_size if segment_base else program_size
        if expected > size:
            raise ProgramRejected(
                f"extended header says the segment data ends at byte {expected}, past the end of the file "
                f"({size} bytes): the file is cut off"
            )
    if program_size < _MIN_PROGRAM_SIZE:
        raise ProgramRejected(f"extended header says the program has {program_size} bytes, fewer than 8")
    return ProgramLayout(size, program_size, segment_base, data_size)


def _tensor_problem(tensor: TableView | None) -> str | None:
    """``validate_tensor``: what makes the runtime refuse a tensor EValue, None when it takes it."""
    if tensor is None:
        return "is a Tensor without a tensor"
    if not tensor.has("sizes"):
        return "has no sizes"
    sizes = tensor.scalars("sizes")
    negative = [size for size in sizes if size < 0]
    if negative:
        return f"has a negative size ({negative[0]})"
    scalar_type = tensor.scalar("scalar_type")
    if not 0 <= scalar_type < _UNDEFINED_SCALAR_TYPE:
        return f"has scalar type {scalar_type}, which the runtime does not know"
    numel = 1
    for size in sizes:
        numel *= size
        if numel >= _SSIZE_LIMIT:
            return f"has {list(sizes)} elements, more than a 64-bit count holds"
    if numel * ELEMENT_SIZES[scalar_type] >= _U64_LIMIT:
        return f"of {list(sizes)} elements takes more bytes than a 64-bit size holds"
    return None


def _validate_plan(plan: TableView, index: int) -> None:
    """``validate_program`` for one execution plan (``program_validation.cpp:84-235``)."""
    if not plan.has("values"):
        raise ProgramRejected(f"execution plan {index} has no values")
    values = plan.tables("values")
    inputs = set(plan.scalars("inputs"))
    for value_index, value in enumerate(values):
        kind, table = value.union("val")
        if kind == "Tensor":
            problem = _tensor_problem(table)
            dynamic_input = value_index in inputs and table is not None and table.scalar("shape_dynamism") != _STATIC
            if problem is not None and not dynamic_input:  # a dynamic input's sizes are checked when it is set
                raise ProgramRejected(f"value {value_index} of execution plan {index} {problem}")
        elif kind == "TensorList":
            if table is None or not table.has("items"):
                raise ProgramRejected(f"value {value_index} of execution plan {index} is a TensorList without items")
            for item in table.scalars("items"):
                if not 0 <= item < len(values) or values[item].union("val")[0] != "Tensor":
                    raise ProgramRejected(
                        f"value {value_index} of execution plan {index} lists value {item}, which is not a tensor"
                    )


def _check_load_tables(program: TableView, layout: ProgramLayout) -> None:
    """The tables ``Program::load`` reads: named data needs segments; a constant segment must be loadable."""
    if program.has("named_data") and not program.has("segments"):
        raise ProgramRejected("the program has named data but no segment table")
    constant_segment = program.table("constant_segment")
    if constant_segment is None or not constant_segment.has("offsets") or not constant_segment.vector_length("offsets"):
        # program.cpp:326-345: the constant_buffer path, which ExecuTorch's pip runtimes are built without
        raise ProgramRejected(
            "the program has no constant segment, so its constants would be read from the deprecated "
            "constant_buffer, which the runtime is built without (ET_ENABLE_DEPRECATED_CONSTANT_BUFFER=0)"
        )
    if constant_segment.vector_length("offsets") == 1:
        return
    if program.vector_length("constant_buffer"):
        raise ProgramRejected("the program has both a constant buffer and a constant segment")
    if not program.has("segments"):
        raise ProgramRejected("the program has a constant segment but no segment table")
    segments = program.tables("segments")
    index = constant_segment.scalar("segment_index")
    if index >= len(segments):
        raise ProgramRejected(f"the constant segment is segment {index}, the program has {len(segments)}")
    offset, size = segments[index].scalar("offset"), segments[index].scalar("size")
    if not layout.loadable(layout.segment_base + offset, size):
        raise ProgramRejected(
            f"the constant segment (segment {index}) ends at byte {layout.segment_base + offset + size}, past the "
            f"end of the file ({layout.file_size} bytes): the file is cut off"
        )


def check_program(buffer: Any, layout: ProgramLayout, schema: Schema) -> TableView:
    """The Program's root table, once everything ``Program::load`` checks holds; raises ``ProgramRejected``."""
    try:
        verify_flatbuffer(buffer, 0, layout.program_size, "Program", schema, PROGRAM_IDENTIFIER)
    except FlatbufferRejected as rejected:
        raise ProgramRejected(f"the runtime's flatbuffers verifier rejects it at {rejected}") from None
    try:
        program = root_table(Region(buffer, 0, layout.program_size, "flatbuffer"), "Program", schema)
        limit = max_schema_version(PROGRAM_HEADER)
        if limit is not None and program.scalar("version") > limit:
            raise ProgramRejected(
                f"its schema version {program.scalar('version')} is newer than the {limit} this runtime loads"
            )
        if not program.has("execution_plan"):
            raise ProgramRejected("the program has no execution plans")
        for index, plan in enumerate(program.tables("execution_plan")):
            _validate_plan(plan, index)
        _check_load_tables(program, layout)
    except FlatbufferError as error:  # an unknown union type: the verifier lets it pass, the runtime does not
        raise ProgramRejected(str(error)) from None
    return program
