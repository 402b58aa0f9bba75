"""What ``Method::load`` checks of the Program's tables before any delegate runs (``method.cpp``,
``tensor_parser_portable.cpp``, ``tensor_parser_exec_aten.cpp``, ``method_meta.cpp``).

The flatbuffers verifier proves the Program can be read; a method still fails to load when what it reads
does not make sense: a value of no known type, a tensor with a storage offset, a rank above 16, a dim
order that is not a permutation, planned memory outside its buffer, constant data outside the constant
segment, an instruction of no known type or whose operands are not values, a delegate without its data.
The Python runtime also reads every method's meta (name, inputs, outputs, planned buffers) when it loads
the program, and aborts the process when one is missing. ExecuTorch 1.4.0 and 1.5.1 run the same code.

``method_load_failures`` gives, per method, the first thing its load fails on, as the runtime stops there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from xnnguard.runtime_check.flatbuffer_view import FlatbufferError, TableView
from xnnguard.runtime_check.program_structure import ELEMENT_SIZES, ProgramLayout

__all__ = ["MethodLoad", "method_load_failures"]

_MAX_RANK = 16  # kTensorDimensionLimit
_DYNAMIC_UNBOUND = 2  # TensorShapeDynamism::DYNAMIC_UNBOUND: "not yet supported"
_EXTERNAL = 1  # TensorDataLocation::EXTERNAL
_U32 = 2**32
_OPERATOR_NAME_LIMIT = 100  # kTempBufferSizeForName, the terminating NUL included
_TAGGED = frozenset({"Null", "Int", "Double", "Bool", "String", "Tensor"})  # MethodMeta's get_tag
_INSTRUCTIONS = frozenset({"KernelCall", "DelegateCall", "JumpFalseCall", "MoveCall", "FreeCall"})
_INLINE, _SEGMENT = 0, 1


class _Refused(Exception):
    """The method does not load; the message says why."""

    consequence = "the runtime fails to load the method"


class _FailsAtRun(_Refused):
    """The method loads but fails when it runs."""

    consequence = "the method fails when it runs"


def _require(condition: Any, message: str) -> None:
    if not condition:
        raise _Refused(message)


class _Constants:
    """Where a tensor's constant data comes from: the constant segment (its offsets and size) or, in older
    programs, the ``constant_buffer`` table (each buffer's size)."""

    def __init__(self, program: TableView, layout: ProgramLayout) -> None:
        self.mutable = _mutable_segment(program, layout)
        self.offsets: tuple[int, ...] | None = None
        self.segment_size = 0
        self.buffer_sizes: list[int] = []
        constant_segment = program.table("constant_segment")
        if constant_segment is not None and constant_segment.vector_length("offsets") > 1:
            self.offsets = constant_segment.scalars("offsets")
            segments = program.tables("segments")  # Program::load checked the segment exists
            self.segment_size = segments[constant_segment.scalar("segment_index")].scalar("size")
        else:
            self.buffer_sizes = [buffer.vector_length("storage") for buffer in program.tables("constant_buffer")]

    def check(self, index: int, nbytes: int, where: str) -> None:
        if self.offsets is not None:
            _require(
                index < len(self.offsets), f"{where} has constant {index}, the constant segment has {len(self.offsets)}"
            )
            offset = self.offsets[index]
            _require(
                offset + nbytes <= self.segment_size,
                f"{where} has its {nbytes} bytes at offset {offset} of a {self.segment_size}-byte constant segment",
            )
        else:
            _require(
                index < len(self.buffer_sizes),
                f"{where} has constant buffer {index}, the program has {len(self.buffer_sizes)}",
            )
            _require(
                nbytes <= self.buffer_sizes[index],
                f"{where} needs {nbytes} bytes of a {self.buffer_sizes[index]}-byte constant buffer",
            )


def _mutable_segment(program: TableView, layout: ProgramLayout) -> tuple[tuple[int, ...], int] | str:
    """The offsets of ``mutable_data_segments[0]`` and its segment's size, which initial values of planned
    tensors are copied from (``Program::load_mutable_subsegment_into``); or why there are none."""
    if layout.segment_base == 0:
        return "the file has no segments"
    mutable = program.tables("mutable_data_segments")
    if not mutable:
        return "the program has no mutable data segment"
    if not mutable[0].has("offsets"):
        return "the mutable data segment has no offsets"
    segments = program.tables("segments")
    index = mutable[0].scalar("segment_index")
    if index >= len(segments):
        return f"the mutable data segment is segment {index}, the program has {len(segments)}"
    return mutable[0].scalars("offsets"), segments[index].scalar("size")


def _check_tensor(
    tensor: TableView, where: str, planned: tuple[int, ...], constants: _Constants, external: list[bytes]
) -> None:
    """``parseTensor`` and ``getTensorDataPtr``."""
    _require(tensor.scalar("storage_offset") == 0, f"{where} has a storage offset, which the runtime does not support")
    scalar_type = tensor.scalar("scalar_type")
    _require(scalar_type in ELEMENT_SIZES, f"{where} has scalar type {scalar_type}, which the runtime does not know")
    _require(tensor.scalar("shape_dynamism") != _DYNAMIC_UNBOUND, f"{where} has an unbounded dynamic shape")
    _require(tensor.has("sizes"), f"{where} has no sizes")
    sizes = tensor.scalars("sizes")
    _require(len(sizes) <= _MAX_RANK, f"{where} has rank {len(sizes)}, above the runtime's {_MAX_RANK}")
    _require(tensor.has("dim_order"), f"{where} has no dim order")
    dim_order = tensor.scalars("dim_order")
    _require(len(dim_order) == len(sizes), f"{where} has {len(dim_order)} dim-order entries for rank {len(sizes)}")
    _require(all(size >= 0 for size in sizes), f"{where} has a negative size in {list(sizes)}")
    _require(
        not sizes or sorted(dim_order) == list(range(len(sizes))),
        f"{where} has dim order {list(dim_order)}, not a permutation of 0..{len(sizes) - 1}",
    )
    nbytes = math.prod(sizes) * ELEMENT_SIZES[scalar_type]
    extra = tensor.table("extra_tensor_info")
    if extra is not None and extra.scalar("location") == _EXTERNAL:
        _require(extra.has("fully_qualified_name"), f"{where} is external data without a name")
        if tensor.table("allocation_info") is None:  # a constant in the .ptd the program is loaded with
            external.append(extra.raw_string("fully_qualified_name").split(b"\0", 1)[0])
        return
    allocation = tensor.table("allocation_info")
    data_index = tensor.scalar("data_buffer_idx")
    if allocation is None:
        if data_index > 0:
            constants.check(data_index, nbytes, where)
        return
    if data_index > 0:  # a planned tensor whose initial value is copied from the mutable data segment
        mutable = constants.mutable
        _require(not isinstance(mutable, str), f"{where} has an initial value, but {mutable}")
        assert not isinstance(mutable, str)
        offsets, segment_size = mutable
        _require(data_index < len(offsets), f"{where} has initial value {data_index}, the segment has {len(offsets)}")
        _require(
            offsets[data_index] + nbytes <= segment_size,
            f"{where} has its initial value at bytes {offsets[data_index]}..{offsets[data_index] + nbytes} of a "
            f"{segment_size}-byte segment",
        )
    memory_id = (allocation.scalar("memory_id") - 1) % _U32  # memory id 0 is reserved: it wraps around
    offset = allocation.scalar("memory_offset_low") | allocation.scalar("memory_offset_high") << 32
    _require(
        memory_id < len(planned),
        f"{where} is planned in memory {memory_id + 1}, the method plans {len(planned)} buffers",
    )
    _require(
        offset + nbytes <= planned[memory_id],
        f"{where} is planned at bytes {offset}..{offset + nbytes} of buffer {memory_id + 1}, "
        f"which has {planned[memory_id]} bytes",
    )


def _check_values(
    plan: TableView, planned: tuple[int, ...], constants: _Constants, external: list[bytes]
) -> list[str]:
    """``parse_values``: each EValue, in order. Returns each value's kind."""
    _require(plan.has("values"), "the method has no values")
    values = plan.tables("values")
    kinds: list[str] = []
    for index, value in enumerate(values):
        where = f"value {index}"
        try:
            kind, table = value.union("val")
        except FlatbufferError:
            raise _Refused(f"{where} has a type the runtime does not know") from None
        kinds.append(kind)
        _require(kind != "NONE", f"{where} has no type")
        _require(kind == "Null" or table is not None, f"{where} is a {kind} without its table")
        if table is None:
            continue
        if kind == "Tensor":
            _check_tensor(table, f"tensor {index}", planned, constants, external)
        elif kind == "IntList":
            _require(table.has("items"), f"{where} is a list without items")
            _require(
                all(0 <= item < len(values) for item in table.scalars("items")),
                f"{where} lists a value that does not exist",
            )
        elif kind in ("BoolList", "DoubleList"):
            _require(table.has("items"), f"{where} is a list without items")
        elif kind == "String":
            _require(table.has("string_val"), f"{where} is a string without its text")
        elif kind == "TensorList":
            _require(table.has("items"), f"{where} is a list without items")
            for item in table.scalars("items"):
                # a later value is not parsed yet when the list is: the runtime reads an unset EValue
                _require(
                    0 <= item < index and kinds[item] == "Tensor", f"{where} lists value {item}, not a tensor before it"
                )
        elif kind == "OptionalTensorList":
            _require(table.has("items"), f"{where} is a list without items")
            _require(
                all(-1 <= item < len(values) for item in table.scalars("items")),
                f"{where} lists a value that does not exist",
            )
    return kinds


def _check_delegates(plan: TableView, program: TableView, layout: ProgramLayout) -> None:
    """``BackendDelegate::Init``: an id, the processed data where it says, compile specs with key and value."""
    _require(plan.has("delegates"), "the method has no delegates table")
    for index, delegate in enumerate(plan.tables("delegates")):
        where = f"delegate {index}"
        _require(delegate.has("id"), f"{where} has no backend id")
        processed = delegate.table("processed")
        _require(processed is not None, f"{where} has no processed data: the runtime crashes reading it")
        assert processed is not None
        location, data_index = processed.scalar("location"), processed.scalar("index")
        if location == _INLINE:
            _require(program.has("backend_delegate_data"), f"{where} is inline, the program has no inline data")
            count = program.vector_length("backend_delegate_data")
            _require(data_index < count, f"{where} is inline data {data_index}, the program has {count}")
        elif location == _SEGMENT:
            _require(layout.segment_base != 0, f"{where} is in segment {data_index}, the file has no segments")
        else:
            raise _Refused(f"{where} has data location {location}, which the runtime does not know")
        for spec_index, spec in enumerate(delegate.tables("compile_specs")):
            _require(
                spec.has("key") and spec.has("value"),
                f"{where}'s compile spec {spec_index} has no key or no value: the runtime crashes reading it",
            )


def _check_instructions(plan: TableView, kinds: list[str]) -> None:
    """``Method::init``'s chains: known instructions whose operands are values (and operators); and the one
    check ``execute_instruction`` adds: a delegate call names a delegate (``method.cpp:1512``, at the run)."""
    count = len(kinds)
    delegates = plan.vector_length("delegates")
    operators = plan.tables("operators") if plan.has("operators") else None
    last_operator: TableView | None = None
    chains = plan.tables("chains")
    _require(chains, "the method has no chains")
    for chain_index, chain in enumerate(chains):
        _require(chain.has("instructions"), f"chain {chain_index} has no instructions")
        for index, instruction in enumerate(chain.tables("instructions")):
            where = f"instruction {index} of chain {chain_index}"
            try:
                kind, args = instruction.union("instr_args")
            except FlatbufferError:
                raise _Refused(f"{where} has a type the runtime does not know") from None
            _require(args is not None, f"{where} is empty")
            _require(kind in _INSTRUCTIONS, f"{where} has type {kind}, which the runtime does not run")
            assert args is not None
            if kind in ("KernelCall", "DelegateCall"):
                _require(args.has("args"), f"{where} has no arguments")
                _require(
                    all(0 <= arg < count for arg in args.scalars("args")),
                    f"{where} has an argument that is not a value",
                )
            if kind == "DelegateCall" and args.scalar("delegate_index") >= delegates:
                raise _FailsAtRun(f"{where} calls delegate {args.scalar('delegate_index')}, the method has {delegates}")
            if kind == "KernelCall":
                op_index = args.scalar("op_index")
                _require(
                    operators is not None and 0 <= op_index < len(operators),
                    f"{where} calls operator {op_index}, which does not exist",
                )
                last_operator = operators[op_index] if operators is not None else None
            elif kind == "JumpFalseCall":
                _require(0 <= args.scalar("cond_value_index") < count, f"{where} tests a value that does not exist")
            elif kind == "MoveCall":
                _require(
                    0 <= args.scalar("move_from") < count and 0 <= args.scalar("move_to") < count,
                    f"{where} moves a value that does not exist",
                )
            elif kind == "FreeCall":
                _require(0 <= args.scalar("value_index") < count, f"{where} frees a value that does not exist")
    if last_operator is not None:
        _check_operator_name(last_operator)


def _check_operator_name(operator: TableView) -> None:
    """``populate_operator_name``: a name, and "name.overload" shorter than the runtime's buffer. Only the last
    kernel call's failure counts: ``Method::init`` keeps each call's result in one ``delayed_error``, which the
    next call that resolves overwrites (``method.cpp:1057-1064``)."""
    _require(operator.has("name"), "the last operator called has no name")
    name = operator.raw_string("name").split(b"\0", 1)[0]  # snprintf("%s") stops at a NUL
    overload = operator.raw_string("overload")
    length = len(name) + (1 + len(overload.split(b"\0", 1)[0]) if overload else 0)
    _require(
        length < _OPERATOR_NAME_LIMIT,
        f"the last operator called has a {length}-byte name, beyond the runtime's {_OPERATOR_NAME_LIMIT}-byte buffer",
    )


def _check_plan(
    plan: TableView, program: TableView, layout: ProgramLayout, constants: _Constants, external: list[bytes]
) -> None:
    planned = tuple(plan.scalars("non_const_buffer_sizes"))[1:]
    kinds = _check_values(plan, planned, constants, external)
    for what in ("inputs", "outputs"):
        for index in plan.scalars(what):
            _require(0 <= index < len(kinds), f"{what[:-1]} value {index} does not exist")
            _require(
                kinds[index] in _TAGGED,
                f"{what[:-1]} value {index} is a {kinds[index]}, which a method cannot take or return",
            )
    _check_delegates(plan, program, layout)
    _check_instructions(plan, kinds)


@dataclass(frozen=True)
class MethodLoad:
    """What loading the methods needs and where it fails: per method, the first thing its load fails on (the
    runtime stops there) and the keys of the constants it takes from a ``.ptd`` (``parse_external_constants``,
    ``method.cpp:352-423``: without a data file, or with one that lacks a key, the load fails); and the
    failure that aborts the Python runtime's load of the whole program, if any."""

    failures: dict[str, str] = field(default_factory=dict)
    external: dict[str, tuple[bytes, ...]] = field(default_factory=dict)
    aborts: str | None = None


def method_load_failures(program: TableView, layout: ProgramLayout) -> MethodLoad:
    """``MethodLoad`` of every method. The abort is a method missing a field its meta needs (name, inputs,
    outputs, planned buffers): the Python runtime reads every method's meta when it loads the program and
    aborts the process on that."""
    constants = _Constants(program, layout)
    found = MethodLoad()
    for index, plan in enumerate(program.tables("execution_plan")):
        missing = [name for name in ("name", "non_const_buffer_sizes", "inputs", "outputs") if not plan.has(name)]
        if missing:
            return MethodLoad(
                found.failures,
                found.external,
                f"execution plan {index} has no {' and no '.join(missing)}: the runtime cannot load it, and the "
                "Python runtime aborts the process loading the program",
            )
        name = plan.string("name")
        external: list[bytes] = []
        try:
            _check_plan(plan, program, layout, constants, external)
        except _Refused as refused:
            found.failures[name] = f"{refused}: {refused.consequence}"
        except FlatbufferError as error:
            found.failures[name] = f"{error}: the runtime fails to load the method"
        if external:
            found.external[name] = tuple(dict.fromkeys(external))
    return found
