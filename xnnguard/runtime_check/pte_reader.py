"""What a ``.pte`` holds for the verifier: its methods, their delegates (blob location) and kernel calls.

Reads the Program flatbuffer in place (memory-mapped for files) and stops there: delegate blobs are
handed out as regions of the same buffer, and weights (named data, constant segments) are never
touched. ``deserialize_pte_binary`` is not used because it copies every segment back into memory.
"""

from __future__ import annotations

import mmap
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from xnnguard.boundary.package_files import PROGRAM_SCHEMA
from xnnguard.runtime_check.fbs_schema import Schema, executorch_schema
from xnnguard.runtime_check.flatbuffer_view import FlatbufferError, Region, TableView
from xnnguard.runtime_check.method_load import method_load_failures
from xnnguard.runtime_check.program_structure import ProgramLayout, ProgramRejected, check_program, program_layout

__all__ = [
    "Delegate",
    "DelegateCall",
    "KernelCall",
    "Method",
    "NamedData",
    "NamedDataEntry",
    "Program",
    "PteReadError",
    "PteSource",
    "TensorMeta",
    "open_pte",
    "read_methods",
    "read_program",
    "source_name",
]

PteSource = str | os.PathLike | bytes | bytearray | memoryview

_DATA_LOCATION_INLINE = 0


class PteReadError(ValueError):
    """The input is not a readable ExecuTorch program; the message names the input and what is wrong.

    ``detail`` is the same without the input's name, for whoever names the input already.
    """

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"{name}: {detail}")
        self.name = name
        self.detail = detail


_DYNAMISM_STATIC = 0


@dataclass(frozen=True)
class TensorMeta:
    """A tensor EValue as the method declares it: sizes (upper bounds when dynamic), dim order, dtype."""

    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    dynamic: bool
    scalar_type: int
    constant: bool  # its data is in the program (data_buffer_idx > 0 without allocation), not computed


@dataclass(frozen=True)
class DelegateCall:
    """One call of a delegate: its arguments are the delegate's inputs, then its outputs (EValue indices).

    The split is found from the method's dataflow: an output is a memory-planned tensor that is not a
    method input and that no earlier instruction mentions (the call is where it is first written).
    ``arg_tensors`` holds each argument's tensor metadata (None for a non-tensor).
    """

    args: tuple[int, ...]
    num_inputs: int
    arg_tensors: tuple[TensorMeta | None, ...] = ()


@dataclass(frozen=True)
class Delegate:
    """One backend delegate of a method; ``blob`` is where its processed bytes lie (not copied)."""

    index: int
    backend: str
    blob: Region
    calls: tuple[DelegateCall, ...]


@dataclass(frozen=True)
class KernelCall:
    """One call of an operator outside the delegates: its arguments (EValue indices) and, for each, the
    sizes of the tensor it is (None for a non-tensor)."""

    operator: str  # "aten::convolution.out"
    args: tuple[int, ...]
    arg_dims: tuple[tuple[int, ...] | None, ...]
    arg_tensors: tuple[TensorMeta | None, ...] = ()


@dataclass(frozen=True)
class Method:
    name: str
    delegates: tuple[Delegate, ...]
    kernel_calls: tuple[KernelCall, ...] = ()
    planned_buffers: tuple[int, ...] = ()  # bytes of each buffer ExecuTorch's memory plan allocates (may be < 0)

    @property
    def kernel_operators(self) -> tuple[str, ...]:
        """``"aten::add.out"`` for each operator a kernel call uses, first use first."""
        return tuple(dict.fromkeys(call.operator for call in self.kernel_calls))


@dataclass(frozen=True)
class NamedData:
    """A named blob of the program (ExecuTorch 1.5.1 names each XNNPACK constant by the sha256 of its bytes)."""

    key: str
    offset: int  # absolute offset in the file
    size: int


@dataclass(frozen=True)
class NamedDataEntry:
    """One entry of the program's ``named_data``, as the runtime searches them: the key's bytes (None: the
    entry has no key) and the segment it names (which may not exist)."""

    key: bytes | None
    segment_index: int


@dataclass(frozen=True)
class Program:
    """What the verifier reads of a program: its methods and its named data (where, never the bytes).

    ``named_data`` maps each key to the bytes the runtime finds for it (the first entry of that key, whose
    segment lies in the file); ``named_entries`` lists every entry as the runtime searches them, and
    ``segments`` each segment's (offset from ``layout.segment_base``, size). ``has_named_data`` is False
    when the program has no ``named_data`` table at all (the runtime then has no named-data map).
    """

    methods: list[Method]
    named_data: dict[str, NamedData]
    named_entries: tuple[NamedDataEntry, ...] = ()
    segments: tuple[tuple[int, int], ...] = ()
    has_named_data: bool = False
    layout: ProgramLayout | None = None
    load_failures: dict[str, str] = field(default_factory=dict)  # method -> why the runtime cannot load it
    external_constants: dict[str, tuple[bytes, ...]] = field(default_factory=dict)  # method -> .ptd keys it needs


def _program_schema() -> Schema:
    return executorch_schema(PROGRAM_SCHEMA)


def source_name(source: PteSource) -> str:
    """How messages name ``source``: its path, or ``<N bytes>``."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    if not isinstance(source, (bytes, bytearray, memoryview)):
        raise TypeError(f"a .pte source is a path, bytes or a memoryview, not {type(source).__name__}")
    return f"<{memoryview(source).nbytes} bytes>"


@contextmanager
def open_pte(source: PteSource) -> Iterator[Any]:
    """The bytes of ``source`` as a buffer: a read-only memory map for a path, the object itself otherwise."""
    if not isinstance(source, (str, os.PathLike)):
        yield source if not isinstance(source, memoryview) else source.cast("B")
        return
    name = os.fspath(source)
    try:
        if not stat.S_ISREG(os.stat(name).st_mode):  # a FIFO or a device would block or never end
            kind = "a directory" if os.path.isdir(name) else "not a regular file"
            raise PteReadError(name, f"is {kind}, not a .pte file")
        with open(name, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size == 0:
                yield b""
                return
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as error:
        raise PteReadError(name, f"cannot open: {error.strerror or error}") from None
    try:
        yield mapped
    finally:
        mapped.close()


def _blob_region(program: TableView, reference: TableView | None, segment_base: int, name: str) -> Region:
    if reference is None:
        raise FlatbufferError("delegate has no processed data reference")
    index = reference.scalar("index")
    what = "flatbuffer"
    if reference.scalar("location") == _DATA_LOCATION_INLINE:
        inline = program.tables("backend_delegate_data")
        if index >= len(inline):
            raise FlatbufferError(f"inline delegate data {index} does not exist ({len(inline)} entries)")
        start, length = inline[index].vector_span("data")
        return Region(program.region.buffer, start, start + length, what)
    segments = program.tables("segments")
    if index >= len(segments):
        raise FlatbufferError(f"delegate segment {index} does not exist ({len(segments)} segments)")
    start = segment_base + segments[index].scalar("offset")  # inside the file: see _check_segments
    return Region(program.region.buffer, start, start + segments[index].scalar("size"), what)


def _mentioned_values(kind: str, args: TableView) -> tuple[int, ...]:
    """EValue indices an instruction reads or writes."""
    if kind in ("KernelCall", "DelegateCall"):
        return args.scalars("args")
    if kind == "MoveCall":
        return (args.scalar("move_from"), args.scalar("move_to"))
    if kind == "JumpFalseCall":
        return (args.scalar("cond_value_index"),)
    if kind == "FreeCall":
        return (args.scalar("value_index"),)
    return ()


def _is_planned_tensor(values: list[TableView], index: int) -> bool:
    if not 0 <= index < len(values):
        raise FlatbufferError(f"an instruction uses value {index}, the plan has {len(values)}")
    kind, tensor = values[index].union("val")
    return kind == "Tensor" and tensor is not None and tensor.has("allocation_info")


def _tensor_meta(values: list[TableView], index: int, cache: dict[int, TensorMeta | None]) -> TensorMeta | None:
    if index in cache:
        return cache[index]
    if not 0 <= index < len(values):
        raise FlatbufferError(f"an instruction uses value {index}, the plan has {len(values)}")
    kind, tensor = values[index].union("val")
    meta = None
    if kind == "Tensor" and tensor is not None:
        meta = TensorMeta(
            sizes=tuple(tensor.scalars("sizes")),
            dim_order=tuple(tensor.scalars("dim_order")),
            dynamic=tensor.scalar("shape_dynamism") != _DYNAMISM_STATIC,
            scalar_type=tensor.scalar("scalar_type"),
            constant=tensor.scalar("data_buffer_idx") > 0 and not tensor.has("allocation_info"),
        )
    cache[index] = meta
    return meta


def _delegate_call(
    args: tuple[int, ...], values: list[TableView], known: set[int], cache: dict[int, TensorMeta | None]
) -> DelegateCall:
    num_inputs = len(args)
    while num_inputs and args[num_inputs - 1] not in known and _is_planned_tensor(values, args[num_inputs - 1]):
        num_inputs -= 1
    return DelegateCall(args, num_inputs, tuple(_tensor_meta(values, index, cache) for index in args))


def _check_segments(program: TableView, segment_base: int, size: int) -> None:
    """Every segment (weights included) lies in the file: a cut-off file fails at load, so say so now.

    Only the segment table is read, never the segment bytes.
    """
    for index, segment in enumerate(program.tables("segments")):
        length = segment.scalar("size")
        end = segment_base + segment.scalar("offset") + length
        if length and (not segment_base or end > size):
            raise FlatbufferError(
                f"segment {index} ends at byte {end}, past the end of the file ({size} bytes): the file is cut off"
            )


def _method(plan: TableView, program: TableView, segment_base: int, name: str) -> Method:
    operators = [
        f"{op.string('name')}.{overload}" if (overload := op.string("overload")) else op.string("name")
        for op in plan.tables("operators")
    ]
    values = plan.tables("values")
    known = set(plan.scalars("inputs"))  # values that exist before the instruction at hand
    calls: dict[int, list[DelegateCall]] = {}
    kernel_calls: list[KernelCall] = []
    metas: dict[int, TensorMeta | None] = {}
    for chain in plan.tables("chains"):
        for instruction in chain.tables("instructions"):
            kind, args = instruction.union("instr_args")
            if args is None:
                continue
            if kind == "DelegateCall":
                call = _delegate_call(args.scalars("args"), values, known, metas)
                calls.setdefault(args.scalar("delegate_index"), []).append(call)
            elif kind == "KernelCall":
                op_index = args.scalar("op_index")
                if not 0 <= op_index < len(operators):
                    raise FlatbufferError(f"kernel call of operator {op_index}, the plan has {len(operators)}")
                call_args = args.scalars("args")
                tensors = tuple(_tensor_meta(values, index, metas) for index in call_args)
                dims = tuple(None if meta is None else meta.sizes for meta in tensors)
                kernel_calls.append(KernelCall(operators[op_index], call_args, dims, tensors))
            known.update(_mentioned_values(kind, args))
    delegates = tuple(
        Delegate(
            index=index,
            backend=delegate.string("id"),
            blob=_blob_region(program, delegate.table("processed"), segment_base, name),
            calls=tuple(calls.get(index, ())),
        )
        for index, delegate in enumerate(plan.tables("delegates"))
    )
    planned = tuple(plan.scalars("non_const_buffer_sizes"))[1:]  # entry 0 is reserved
    return Method(plan.string("name"), delegates, tuple(kernel_calls), planned)


def _named_entries(program: TableView) -> tuple[NamedDataEntry, ...]:
    return tuple(
        NamedDataEntry(entry.raw_string("key") if entry.has("key") else None, entry.scalar("segment_index"))
        for entry in program.tables("named_data")
    )


def _named_data(
    entries: tuple[NamedDataEntry, ...], segments: tuple[tuple[int, int], ...], segment_base: int
) -> dict[str, NamedData]:
    """Key -> where its bytes are in the file, for the entries the runtime can load (the first of a key)."""
    found: dict[str, NamedData] = {}
    for entry in entries:
        if entry.key is None or entry.segment_index >= len(segments):
            continue
        offset, size = segments[entry.segment_index]
        key = entry.key.decode("utf-8", errors="replace")
        found.setdefault(key, NamedData(key, segment_base + offset, size))
    return found


def read_program(buffer: Any, name: str) -> Program:
    """The methods and named data of the program in ``buffer``; raises ``PteReadError`` naming ``name``.

    First what ``Program::load`` checks (``program_structure``): a program it refuses is not readable.
    """
    if len(buffer) == 0:
        raise PteReadError(name, "empty file")
    try:
        layout = program_layout(buffer)
    except ProgramRejected as rejected:
        raise PteReadError(name, str(rejected)) from None
    try:
        program = check_program(buffer, layout, _program_schema())
    except ProgramRejected as rejected:
        raise PteReadError(name, f"damaged program: {rejected}") from None
    segment_base = layout.segment_base
    try:
        load = method_load_failures(program, layout)
        if load.aborts is not None:
            raise PteReadError(name, f"damaged program: {load.aborts}")
        _check_segments(program, segment_base, len(buffer))
        plans = program.tables("execution_plan")
        if not plans:
            raise FlatbufferError("the program has no execution plan (method)")
        methods = [_method(plan, program, segment_base, name) for plan in plans]
        segments = tuple((segment.scalar("offset"), segment.scalar("size")) for segment in program.tables("segments"))
        entries = _named_entries(program)
        return Program(
            methods,
            _named_data(entries, segments, segment_base),
            entries,
            segments,
            program.has("named_data"),
            layout,
            load.failures,
            load.external,
        )
    except FlatbufferError as error:
        raise PteReadError(name, f"damaged program: {error}") from None


def read_methods(buffer: Any, name: str) -> list[Method]:
    """Every method of the program in ``buffer``; raises ``PteReadError`` naming ``name`` and the damage."""
    return read_program(buffer, name).methods
