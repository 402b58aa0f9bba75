"""Damage at the byte level (issue 30): each class the runtime rejects is flagged by ``verify``, on a real
program with one damage, and the same file fails in the real runtime (in a child process, where an abort
costs a worker); and clean programs of every precision pass every structural check.

* structure: the flatbuffers verifier the runtime runs (a vtable past the end of the XNNPACK graph, of the
  Program);
* named data: a constant's key that is not in the named data (one changed character; a byte that is not
  UTF-8, on which the Python runtime aborts); the same keys resolve in a ``.ptd`` given with ``data``;
* allocations: a dim that makes an intermediate tensor larger than anything can allocate; ``max_memory``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.byte_mutation import flatbuffer_spans
from tests.mutation import RuntimeSandbox, edit
from tests.runtime_check_corpus import ON_ONE_WORKER, program
from xnnguard.runtime_check import PteReadError, verify_pte
from xnnguard.runtime_check.flatbuffer_verifier import verify_flatbuffer
from xnnguard.runtime_check.flatbuffer_view import Region, TableView, root_table
from xnnguard.runtime_check.program_structure import PROGRAM_IDENTIFIER, program_layout
from xnnguard.runtime_check.pte_reader import _program_schema, read_program
from xnnguard.runtime_check.xnnpack_blob import _schema, graph_table

pytestmark = ON_ONE_WORKER

PRECISIONS = {
    "float": "stock_float_conv_linear",
    "float_mlp": "stock_mlp",
    "int8_per_channel": "stock_qconv_linear",
    "int8_per_tensor": "stock_qconv_linear_per_tensor",
    "int8_dynamic": "stock_dynamic_linear",
    "int4_weights": "stock_int4_linear",
}
STRUCTURAL_KINDS = {"unreadable", "flatbuffer", "blob_format", "method_load", "named_data", "allocation"}


@pytest.fixture(scope="module")
def sandbox() -> Iterator[RuntimeSandbox]:
    with RuntimeSandbox(timeout=120) as runtime:
        yield runtime


def _graph_span(data: bytes) -> tuple[int, int]:
    (span,) = [span for span in flatbuffer_spans(data) if span.what != "program"]
    return span.start, span.end


def _first_key(data: bytes) -> tuple[int, bytes]:
    """Where the first named constant's key is in the XNNPACK graph, and the key."""
    start, end = _graph_span(data)
    read = read_program(data, "source")
    key = next(key for key in read.named_data if len(key) == 64)
    position = data.index(key.encode(), start, end)
    return position, key.encode()


def _with_bytes(data: bytes, position: int, new: bytes) -> bytes:
    return data[:position] + new + data[position + len(new) :]


@pytest.mark.release_sensitive
@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_clean_program_of_each_precision_passes_every_structural_check(precision: str) -> None:
    data = program(PRECISIONS[precision])
    verify_flatbuffer(data, 0, program_layout(data).program_size, "Program", _program_schema(), PROGRAM_IDENTIFIER)
    for method in read_program(data, precision).methods:
        for delegate in method.delegates:
            region = graph_table(delegate.blob).region
            verify_flatbuffer(region.buffer, region.start, region.end, "XNNGraph", _schema())
    report = verify_pte(data)
    assert not report.kinds() & STRUCTURAL_KINDS, str(report)


def test_a_constant_key_with_one_changed_character_is_named_and_fails_to_load(sandbox: RuntimeSandbox) -> None:
    data = program("stock_qconv_linear")
    position, key = _first_key(data)
    changed = _with_bytes(data, position, b"0" if key[:1] != b"0" else b"1")
    (problem,) = [p for p in verify_pte(changed).problems if p.kind == "named_data"]
    assert f"by key '{changed[position : position + 64].decode()}'" in problem.message
    assert "which is not in the program's named data" in problem.message
    assert (problem.method, problem.delegate) == ("forward", 0)
    assert sandbox.outcome(changed) == "load"
    assert "Failed to get constant data for key" in sandbox.last_message


def test_a_constant_key_that_is_not_utf8_is_named_as_such_and_aborts_the_python_runtime(
    sandbox: RuntimeSandbox,
) -> None:
    data = program("stock_qconv_linear")
    position, _ = _first_key(data)
    changed = _with_bytes(data, position + 5, b"\xff")
    (problem,) = [p for p in verify_pte(changed).problems if p.kind == "named_data"]
    assert "\\xff" in problem.message and "not valid UTF-8 text" in problem.message
    assert sandbox.outcome(changed) == "crash"  # terminate called after throwing pybind11::error_already_set


def test_a_vtable_past_the_end_of_the_xnnpack_graph_is_a_flatbuffer_problem_naming_the_table(
    sandbox: RuntimeSandbox,
) -> None:
    data = program("stock_float_conv_linear")
    (method,) = read_program(data, "source").methods
    value = graph_table(method.delegates[0].blob).tables("xvalues")[2]
    _, end = _graph_span(data)
    changed = bytearray(data)
    struct.pack_into("<i", changed, value.pos, value.pos - end - 64)  # vtable = table - soffset: past the end
    (problem,) = verify_pte(bytes(changed)).problems
    assert (problem.kind, problem.method, problem.delegate) == ("flatbuffer", "forward", 0)
    assert "XNNGraph.xvalues[2]: the vtable of XValue" in problem.message and "lies outside" in problem.message
    assert sandbox.outcome(bytes(changed)) == "load"
    assert "FlatBuffer verification failed" in sandbox.last_message


def test_a_vtable_past_the_end_of_the_program_makes_it_unreadable_and_the_runtime_refuses_it(
    sandbox: RuntimeSandbox,
) -> None:
    data = program("stock_float_conv_linear")
    size = program_layout(data).program_size
    plan_offset = struct.unpack_from("<I", data, 0)[0]  # the root table; its vtable offset is its first word
    changed = bytearray(data)
    struct.pack_into("<i", changed, plan_offset, plan_offset - size - 64)
    with pytest.raises(PteReadError, match=r"flatbuffers verifier rejects it at Program: the vtable of Program"):
        verify_pte(bytes(changed))
    assert sandbox.outcome(bytes(changed)) == "load"
    assert "Verification failed" in sandbox.last_message


def test_a_dim_that_makes_an_allocation_overflow_is_flagged_and_fails_the_first_run(sandbox: RuntimeSandbox) -> None:
    changed = edit(program("stock_move_values"), r"value 4/dims\[1\]$", 0xFFFFFFFF)  # the pad's output
    problems = [p for p in verify_pte(changed).problems if p.kind == "allocation"]
    assert [(p.value, p.dims) for p in problems] == [(4, (1, 0xFFFFFFFF, 5, 7))]
    assert "more than XNNPACK can allocate" in problems[0].message
    assert sandbox.outcome(changed) == "run"
    assert "xnn_status_out_of_memory" in sandbox.last_message


def test_each_report_says_what_each_method_needs_and_max_memory_makes_more_a_problem() -> None:
    data = program("stock_float_conv_linear")
    (memory,) = verify_pte(data).memory
    assert memory.method == "forward" and 0 < memory.largest <= memory.peak
    assert memory.peak == memory.planned + memory.xnnpack + memory.weights
    assert verify_pte(data, max_memory=memory.peak).ok
    (problem,) = verify_pte(data, max_memory=memory.peak - 1).problems
    assert problem.kind == "allocation" and "more than --max-memory" in problem.message


def _with_external_weights(directory: Path) -> tuple[Path, Path]:
    """An MLP whose XNNPACK weights ExecuTorch writes to a .ptd file (named data tagged external)."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    edge = to_edge(torch.export.export(model, (torch.randn(2, 8),)))
    for node in edge.exported_program().graph.nodes:
        if node.op == "placeholder" and node.name.startswith("p_"):
            node.meta.setdefault("custom", {})["delegate_constant_tag"] = "weights"
    lowered = edge.to_backend(XnnpackPartitioner()).to_executorch()
    (directory / "mlp.pte").write_bytes(lowered.buffer)
    lowered.write_tensor_data_to_file(str(directory))
    return directory / "mlp.pte", directory / "weights.ptd"


def test_constants_in_a_data_file_resolve_with_it_and_crash_the_runtime_without_it(
    tmp_path: Path, sandbox: RuntimeSandbox
) -> None:
    pte, ptd = _with_external_weights(tmp_path)
    (problem,) = verify_pte(pte).problems
    assert problem.kind == "named_data" and "no data file was given (--data)" in problem.message
    assert sandbox.outcome(pte.read_bytes()) == "crash"
    assert verify_pte(pte, data=ptd).ok


def test_a_key_missing_from_the_data_file_is_named_with_the_file(tmp_path: Path) -> None:
    pte, ptd = _with_external_weights(tmp_path)
    data = ptd.read_bytes()
    key = _keys(pte)[0]
    ptd.write_bytes(data.replace(key, key[:-1] + (b"0" if key[-1:] != b"0" else b"1"), 1))
    problems = verify_pte(pte, data=ptd).problems
    assert [p.kind for p in problems] == ["named_data"]
    assert f"which is not in data file {ptd}" in problems[0].message


def _keys(pte: Path) -> list[bytes]:
    from xnnguard.runtime_check.xnnpack_blob import read_xnnpack_blob

    (method,) = read_program(pte.read_bytes(), "mlp").methods
    graph = read_xnnpack_blob(method.delegates[0].blob)
    return [entry.raw_key for entry in graph.constant_data if entry.raw_key]


def test_a_string_without_its_terminator_is_a_flatbuffer_problem_the_runtime_refuses(sandbox: RuntimeSandbox) -> None:
    """Damage only the verifier sees: the bytes read are all inside the graph, but a key's NUL is gone."""
    data = program("stock_qconv_linear")
    position, key = _first_key(data)
    changed = _with_bytes(data, position + len(key), b"x")
    (problem,) = verify_pte(changed).problems
    assert problem.kind == "flatbuffer" and "named_key: the string is not NUL-terminated" in problem.message
    assert sandbox.outcome(changed) == "load"
    assert "FlatBuffer verification failed" in sandbox.last_message


def _plan(data: bytes) -> TableView:
    region = Region(data, 0, program_layout(data).program_size, "program")
    return root_table(region, "Program", _program_schema()).tables("execution_plan")[0]


def test_a_dim_order_that_is_not_a_permutation_is_a_method_load_problem(sandbox: RuntimeSandbox) -> None:
    data = program("stock_float_conv_linear")
    tensor = next(
        table for value in _plan(data).tables("values") for kind, table in [value.union("val")] if kind == "Tensor"
    )
    changed = bytearray(data)
    changed[tensor.element_offsets("dim_order")[0]] = 7  # [7, 1, 2, 3]
    (problem,) = verify_pte(bytes(changed)).problems
    assert (problem.kind, problem.method) == ("method_load", "forward")
    assert "dim order [7, 1, 2, 3], not a permutation of 0..3" in problem.message
    assert sandbox.outcome(bytes(changed)) == "load"
    assert "Invalid dim order" in sandbox.last_message


def test_a_call_of_a_delegate_that_does_not_exist_is_a_method_load_problem_that_fails_the_run(
    sandbox: RuntimeSandbox,
) -> None:
    data = program("stock_two_delegates")
    instructions = [
        instruction.union("instr_args") for instruction in _plan(data).tables("chains")[0].tables("instructions")
    ]
    index = [position for position, (kind, _) in enumerate(instructions) if kind == "DelegateCall"][1]
    changed = bytearray(data)
    struct.pack_into("<I", changed, instructions[index][1].field_offset("delegate_index"), 7)  # was 1
    problems = [p for p in verify_pte(bytes(changed)).problems if p.kind == "method_load"]
    assert [p.message for p in problems] == [
        f"instruction {index} of chain 0 calls delegate 7, the method has 2: the method fails when it runs"
    ]
    assert sandbox.outcome(bytes(changed)) == "run"


@pytest.mark.release_sensitive
def test_verify_agrees_with_the_runtime_on_a_program_schema_version_above_what_it_reads(
    sandbox: RuntimeSandbox,
) -> None:
    """1.5's runtime refuses a Program whose version is above its kMaxSupportedSchemaVersion (0); 1.4's loads it."""
    data = program("stock_float_conv_linear")
    region = Region(data, 0, program_layout(data).program_size, "program")
    root = root_table(region, "Program", _program_schema())
    assert root.field_offset("version") is None  # version 0 is the default: not stored
    changed = bytearray(data)
    # the version's vtable entry (slot 0) made to point at the execution plans' offset: a non-zero uint
    struct.pack_into("<H", changed, root.vtable + 4, root.field_offset("execution_plan") - root.pos)
    runtime_loads = sandbox.outcome(bytes(changed)) == "runs"
    try:
        verify_ok = verify_pte(bytes(changed)).ok
    except PteReadError as error:
        assert "schema version" in error.detail
        verify_ok = False
    assert verify_ok == runtime_loads
