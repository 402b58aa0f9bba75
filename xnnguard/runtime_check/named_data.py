"""Every XNNPACK constant named by a key resolves, as the runtime looks it up when it loads the method.

``XNNCompiler`` defines each value in order; a constant (``constant_buffer_idx``) or a per-channel scale
buffer (``scale_buffer_idx``) whose ``constant_data`` entry has a ``named_key`` is fetched with
``named_data_map->get_data(key.c_str())`` (``XNNCompiler.cpp:235-268``): the key up to its first NUL. The
map is the ``.ptd`` the program is loaded with, if any, searched first, then the program's own named data
(``MergedDataMap``, ``method.cpp:929-950``); a program with neither has no map, and the first named
constant dereferences a null pointer. ``PteDataMap::get_data`` (``pte_data_map.cpp:27-56``) walks the
entries in order: an entry without a key fails the search, the first whose key has the same bytes wins,
and its segment must exist and lie in the file; ``FlatTensorDataMap`` does the same within its segment
data. A key that is not found fails the load ("Failed to get constant data for key ..."), and when it is
not valid UTF-8 the Python runtime aborts the process logging that line.

No weight byte is read: this needs the keys and the segment table only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from xnnguard.runtime_check.define_checks.base import AT_LOAD, byte_size
from xnnguard.runtime_check.ptd_reader import DataFile
from xnnguard.runtime_check.pte_reader import NamedDataEntry, Program
from xnnguard.runtime_check.report import Problem
from xnnguard.runtime_check.xnnpack_blob import PerChannelGroupQuant, PerChannelQuant, XnnGraph, XnnValue

__all__ = ["DataMap", "data_maps", "external_constant_problems", "named_data_problems"]

_U64_LIMIT = 2**64


@dataclass(frozen=True)
class DataMap:
    """One named-data map as the runtime searches it."""

    origin: str  # "the program's named data", "data file model.ptd"
    entries: tuple[NamedDataEntry, ...]
    segments: tuple[tuple[int, int], ...]  # (offset from segment_base, size)
    segment_base: int
    file_size: int
    segment_end: int | None = None  # a .ptd's segment_base + segment_data_size: segments must end before it

    def lookup(self, key: bytes) -> tuple[bool, str | None, int]:
        """(found, why the search fails or the entry cannot be loaded, the bytes it loads); (False, None, 0):
        not in this map."""
        for index, entry in enumerate(self.entries):
            if entry.key is None:  # PteDataMap fails its search there; FlatTensorDataMap reads a null key
                return True, f"comes after entry {index} of {self.origin}, which has no key and fails the search", 0
            if entry.key != key:
                continue
            if entry.segment_index >= len(self.segments):
                count = len(self.segments)
                return True, f"names segment {entry.segment_index} in {self.origin}, which has {count}", 0
            offset, size = self.segments[entry.segment_index]
            start = self.segment_base + offset
            if self.segment_end is not None and offset + size > self.segment_end:
                return True, f"names a segment past the segment data of {self.origin}", 0
            if start + size >= _U64_LIMIT or start + size > self.file_size:
                return True, (
                    f"names segment {entry.segment_index} of {self.origin}, which ends at byte {start + size}, "
                    f"past the end of its file ({self.file_size} bytes)"
                ), 0
            return True, None, size
        return False, None, 0


def data_maps(program: Program, data_files: Iterable[DataFile] = ()) -> list[DataMap]:
    """The maps a method's delegates search, in order: the ``.ptd`` files, then the program's named data."""
    maps = [
        DataMap(
            f"data file {data.path}",
            data.entries,
            data.segments,
            data.segment_base,
            data.file_size,
            segment_end=data.segment_base + data.segment_data_size,
        )
        for data in data_files
    ]
    if program.has_named_data and program.layout is not None:
        maps.append(
            DataMap(
                "the program's named data",
                program.named_entries,
                program.segments,
                program.layout.segment_base,
                program.layout.file_size,
            )
        )
    return maps


def _scale_bytes(value: XnnValue, quantization: PerChannelQuant | PerChannelGroupQuant) -> int | None:
    """Bytes of scales XNNPACK reads for ``value``: fp32 per channel, bf16 per block (None: not known here)."""
    if isinstance(quantization, PerChannelGroupQuant):
        return 2 * quantization.num_scales
    if 0 <= quantization.channel_dim < len(value.dims):
        return 4 * value.dims[quantization.channel_dim]
    return None


def _named_uses(graph: XnnGraph) -> Iterator[tuple[int, int, str, int | None]]:
    """(value id, constant entry, what it holds, bytes XNNPACK reads of it) for each constant entry the runtime
    fetches, in value order."""
    if not graph.has_header:  # no XH00 header: constants come from the graph's own constant_buffer
        return
    for value in graph.values:
        if value.constant_buffer_idx:
            yield value.id, value.constant_buffer_idx, "data", byte_size(value)
        quantization = value.quantization
        if isinstance(quantization, (PerChannelQuant, PerChannelGroupQuant)) and quantization.scale_buffer_idx:
            yield value.id, quantization.scale_buffer_idx, "scales", _scale_bytes(value, quantization)


def _shown(key: bytes) -> str:
    text = key.decode("utf-8", errors="backslashreplace")
    return text if len(text) <= 80 else f"{text[:77]}..."


def _is_text(key: bytes) -> bool:
    try:
        key.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def named_data_problems(graph: XnnGraph, maps: list[DataMap], method: str, delegate: int) -> list[Problem]:
    """A problem for each named constant of ``graph`` (each key once) that the runtime cannot fetch."""
    problems: list[Problem] = []
    seen: set[bytes] = set()
    if not maps:
        users = [
            value_id
            for value_id, index, _, _ in _named_uses(graph)
            if index < len(graph.constant_data) and graph.constant_data[index].raw_key is not None
        ]
        if users:
            text = (
                f"names {len(users)} constant{'s' * (len(users) != 1)} by key, but the program has no named data "
                "and no data file was given (--data): the runtime dereferences a missing named-data map and crashes"
            )
            problems.append(Problem("named_data", text, method=method, delegate=delegate, value=users[0]))
        return problems
    for value_id, index, what, needed in _named_uses(graph):
        if index >= len(graph.constant_data):
            continue  # a "constants" problem already
        raw = graph.constant_data[index].raw_key
        if raw is None:
            continue  # an offset into the blob's constant section, checked with the values
        key = raw.split(b"\0", 1)[0]  # the runtime passes the key's c_str()
        if key in seen:
            continue
        seen.add(key)
        named = f"its {what} (constant {index}) by key {_shown(key)!r}"
        message: str | None = None
        for data_map in maps:
            found, failure, size = data_map.lookup(key)
            if not found:
                continue
            if failure is not None:
                message = f"names {named}, which {failure}: {AT_LOAD}"
            elif needed is not None and size < needed:
                message = (
                    f"names {named}, whose bytes in {data_map.origin} are {size}, fewer than the {needed} XNNPACK "
                    "reads: it reads past them, so the numbers are garbage or the runtime crashes"
                )
            break
        else:
            where = " or ".join(data_map.origin for data_map in maps)
            message = f"names {named}, which is not in {where}: {AT_LOAD} (\"Failed to get constant data\")"
            if not _is_text(key):
                message += "; the key is not valid UTF-8 text, and the Python runtime aborts the process logging it"
        if message is not None:
            problems.append(Problem("named_data", message, method=method, delegate=delegate, value=value_id))
    return problems


def external_constant_problems(
    method: str, keys: tuple[bytes, ...], data_files: Iterable[DataFile]
) -> list[Problem]:
    """Constants of the method itself (not of a delegate) stored in a ``.ptd``: without a data file the load
    fails ("external_data_map is null"), and each key must be in it (``Method::parse_external_constants``)."""
    files = list(data_files)
    if not files:
        return [
            Problem(
                "named_data",
                f"takes {len(keys)} constant{'s' * (len(keys) != 1)} from a .ptd file (first {_shown(keys[0])!r}), "
                f"but no data file was given (--data): {AT_LOAD}",
                method=method,
            )
        ]
    known = {entry.key for data in files for entry in data.entries}
    return [
        Problem(
            "named_data",
            f"takes constant {_shown(key)!r} from the data file, which does not have it: {AT_LOAD}",
            method=method,
        )
        for key in keys
        if key not in known
    ]
