"""What a ``.ptd`` file (external named data, ``FlatTensor``) holds for the verifier: its keys and segments.

A program exported with its weights outside names them in a ``.ptd`` that the runtime is given at load
(``_load_program(path, data_path=...)``); XNNPACK constants are then looked up there first. This reads
the keys and where each segment is, never the segment bytes. The checks are ``FlatTensorDataMap::load``'s
(``flat_tensor_data_map.cpp:240-309``: a 64-byte head, the ``FH01`` header, segments that fit in the file,
the ``FT01`` identifier, a ``named_data`` and a ``segments`` table). The runtime does not verify this
flatbuffer before reading it; the verifier runs here anyway, so a damaged file is said to be damaged
rather than read past its end.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

from xnnguard.boundary.package_files import FLAT_TENSOR_HEADER, FLAT_TENSOR_SCHEMA, max_schema_version
from xnnguard.runtime_check.fbs_schema import executorch_schema
from xnnguard.runtime_check.flatbuffer_verifier import FlatbufferRejected, verify_flatbuffer
from xnnguard.runtime_check.flatbuffer_view import FlatbufferError, Region, root_table
from xnnguard.runtime_check.pte_reader import NamedDataEntry, PteReadError, open_pte

__all__ = ["DataFile", "read_data_file"]

_HEAD_BYTES = 64  # FlatTensorHeader::kNumHeadBytes
_HEADER_MAGIC = b"FH01"
_MIN_HEADER_LENGTH = 40  # magic, length, flatbuffer offset and size, segment base and data size
_IDENTIFIER = b"FT01"


@dataclass(frozen=True)
class DataFile:
    """A ``.ptd``'s named data as ``FlatTensorDataMap`` searches it: entries in order; each segment's
    (offset, size) relative to ``segment_base``; the file's length."""

    path: str
    entries: tuple[NamedDataEntry, ...]
    segments: tuple[tuple[int, int], ...]
    segment_base: int
    segment_data_size: int
    file_size: int


def read_data_file(path: str | os.PathLike[str]) -> DataFile:
    """The named data of the ``.ptd`` at ``path`` (memory-mapped: only its head and flatbuffer are read);
    raises ``PteReadError`` naming it and the damage."""
    name = os.fspath(path)
    with open_pte(name) as data:
        return _read(data, name)


def _read(data: Any, name: str) -> DataFile:
    size = len(data)
    if size < _HEAD_BYTES or bytes(data[8:12]) != _HEADER_MAGIC:
        raise PteReadError(name, f"not an ExecuTorch data file (no {_HEADER_MAGIC.decode()} header at bytes 8..12)")
    length, flatbuffer_offset, flatbuffer_size, segment_base, data_size = struct.unpack_from("<IQQQQ", data, 12)
    if length < _MIN_HEADER_LENGTH:
        raise PteReadError(name, f"data file header length {length} is too small")
    if segment_base + data_size > size:
        raise PteReadError(name, f"the header says the file has {segment_base + data_size} bytes, it has {size}")
    end = flatbuffer_offset + flatbuffer_size
    if end > size or bytes(data[4:8]) != _IDENTIFIER:
        raise PteReadError(name, f"no FlatTensor flatbuffer (identifier {_IDENTIFIER.decode()}) in bytes 0..{end}")
    schema = executorch_schema(FLAT_TENSOR_SCHEMA)
    try:
        verify_flatbuffer(data, 0, end, "FlatTensor", schema, _IDENTIFIER)
        root = root_table(Region(data, 0, end, "data file"), "FlatTensor", schema)
        if not root.has("named_data") or not root.has("segments"):
            raise PteReadError(name, "damaged data file: no named_data or no segments table")
        entries = tuple(
            NamedDataEntry(entry.raw_string("key") if entry.has("key") else None, entry.scalar("segment_index"))
            for entry in root.tables("named_data")
        )
        segments = tuple((segment.scalar("offset"), segment.scalar("size")) for segment in root.tables("segments"))
        limit = max_schema_version(FLAT_TENSOR_HEADER)
        if limit is not None and root.scalar("version") > limit:
            version = root.scalar("version")
            raise PteReadError(name, f"its schema version {version} is newer than the {limit} the runtime loads")
    except (FlatbufferRejected, FlatbufferError) as error:
        raise PteReadError(name, f"damaged data file: {error}") from None
    return DataFile(name, entries, segments, segment_base, data_size, size)
