"""Byte-level mutation of real ``.pte`` files: what a truncated upload, a cache that flips bits or a tool
that rewrites a word does to a program.

Unlike ``tests.mutation`` (one schema field at a time), these mutants know nothing of the schema: they
change raw bytes of the two flatbuffers the runtime parses (the Program and each XNNPACK graph), so they
hit offsets, lengths, vtables and string bytes as often as values.

* ``word_mutants``: an aligned 32-bit word set to a neighbour, 0..8, all ones, or doubled;
* ``byte_mutants``: one byte set to another value (a flipped bit, 0, 0xFF or any);
* ``truncations``: the file cut at evenly spaced lengths;
* ``appended``: garbage after the end of the file;
* ``byte_level_mutants``: a seeded mix of all four, the mutation test's byte-level arm.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

from xnnguard.runtime_check.program_structure import program_layout
from xnnguard.runtime_check.pte_reader import read_program
from xnnguard.runtime_check.xnnpack_blob import XNNPACK_BACKEND_ID, graph_table

__all__ = [
    "ByteMutant",
    "Span",
    "appended",
    "byte_level_mutants",
    "byte_mutants",
    "flatbuffer_spans",
    "truncations",
    "word_mutants",
]

_ALL_ONES = 0xFFFFFFFF


@dataclass(frozen=True)
class Span:
    """Bytes ``[start, end)`` of the file holding one flatbuffer, ``what``: ``program`` or ``<method>/delegate N``."""

    what: str
    start: int
    end: int


@dataclass(frozen=True)
class ByteMutant:
    """One damaged copy of a program: ``kind`` (word, byte, truncate, append) and ``where`` say what changed."""

    kind: str
    where: str
    data: bytes


def flatbuffer_spans(data: bytes) -> list[Span]:
    """The Program flatbuffer and every XNNPACK graph flatbuffer of ``data`` (a readable program)."""
    program = read_program(data, "mutation source")
    spans = [Span("program", 0, program_layout(data).program_size)]
    for method in program.methods:
        for delegate in method.delegates:
            if delegate.backend == XNNPACK_BACKEND_ID:
                region = graph_table(delegate.blob).region
                spans.append(Span(f"{method.name}/delegate {delegate.index}", region.start, region.end))
    return spans


def _word_values(value: int) -> list[int]:
    return sorted({(value + 1) & _ALL_ONES, (value - 1) & _ALL_ONES, *range(9), _ALL_ONES, (value * 2) & _ALL_ONES})


def word_mutants(data: bytes, span: Span, count: int, rng: random.Random) -> list[ByteMutant]:
    """``count`` mutants of aligned 32-bit words in ``span`` (relative alignment: flatbuffers align to their start)."""
    out = []
    for _ in range(count):
        position = span.start + 4 * rng.randrange((span.end - span.start) // 4)
        old = struct.unpack_from("<I", data, position)[0]
        new = rng.choice([value for value in _word_values(old) if value != old])
        mutated = bytearray(data)
        struct.pack_into("<I", mutated, position, new)
        where = f"{span.what} word at {position - span.start:#x}: {old:#x} -> {new:#x}"
        out.append(ByteMutant("word", where, bytes(mutated)))
    return out


def byte_mutants(data: bytes, span: Span, count: int, rng: random.Random) -> list[ByteMutant]:
    """``count`` mutants of single bytes in ``span``: a flipped bit, 0, 0xFF or any other value."""
    out = []
    for _ in range(count):
        position = rng.randrange(span.start, span.end)
        old = data[position]
        choices = [old ^ (1 << rng.randrange(8)), 0, 0xFF, rng.randrange(256)]
        new = rng.choice([value for value in choices if value != old] or [old ^ 1])
        mutated = bytearray(data)
        mutated[position] = new
        where = f"{span.what} byte at {position - span.start:#x}: {old:#04x} -> {new:#04x}"
        out.append(ByteMutant("byte", where, bytes(mutated)))
    return out


def truncations(data: bytes, count: int = 64) -> list[ByteMutant]:
    """The file cut at ``count`` evenly spaced lengths in ``[0, len(data))``."""
    lengths = sorted({len(data) * index // count for index in range(count)})
    return [ByteMutant("truncate", f"cut to {length} of {len(data)} bytes", data[:length]) for length in lengths]


def appended(data: bytes, count: int, rng: random.Random) -> list[ByteMutant]:
    """``count`` copies with 1 byte to 4 KiB of garbage after the end."""
    out = []
    for _ in range(count):
        extra = rng.randbytes(rng.choice([1, 3, 16, 100, 4096]))
        out.append(ByteMutant("append", f"{len(extra)} bytes appended", data + extra))
    return out


def byte_level_mutants(
    data: bytes, per_span: int, seed: str, *, truncated: int = 64, garbage: int = 4
) -> list[ByteMutant]:
    """A seeded mix: per flatbuffer, ``per_span`` word and ``per_span`` byte mutants; ``truncated`` truncations;
    ``garbage`` appended copies. Mutants equal to ``data`` or to an earlier one are left out."""
    rng = random.Random(seed)
    found: list[ByteMutant] = []
    for span in flatbuffer_spans(data):
        found += word_mutants(data, span, per_span, rng)
        found += byte_mutants(data, span, per_span, rng)
    found += truncations(data, truncated) if truncated else []
    found += appended(data, garbage, rng)
    seen = {data}
    unique = []
    for mutant in found:
        if mutant.data not in seen:
            seen.add(mutant.data)
            unique.append(mutant)
    return unique
