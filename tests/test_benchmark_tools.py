"""The benchmarks' own tools compute what their tables claim: ceilings, verdicts on targets, details.

These test ``benchmarks/``, not xnnguard: a table whose ceiling counted layout copies, or whose verdict
called a missed target out of reach when it was not, would mislead whoever reads it.
"""

from __future__ import annotations

import pytest
import torch


def test_the_heavy_ops_module_feeds_each_conv_in_xnnpacks_layout_without_a_transpose() -> None:
    """A ceiling counts the convs' time, not layout copies no network pays between two convs.

    Each activation is a stored constant plus the input: stored NCHW, ExecuTorch transposed every conv
    input into NHWC and every output back, and those copies made some ceilings lower than the ratio the
    whole network reached.
    """
    import math

    from executorch.exir import to_edge_transform_and_lower

    import xnnguard
    from benchmarks.gemm_floor import HeavyOps
    from xnnguard.runtime_check.pte_reader import read_methods
    from xnnguard.runtime_check.xnnpack_blob import read_xnnpack_blob

    conv = (torch.ops.aten.conv2d.default, (torch.Size([1, 8, 16, 16]), torch.Size([16, 8, 3, 3]), torch.Size([16]),
                                            [1, 1], [1, 1], [1, 1], 1))
    linear = (torch.ops.aten.linear.default, (torch.Size([4, 32]), torch.Size([8, 32]), torch.Size([8])))
    example = (torch.randn(1, 1, 1, 1),)
    program = torch.export.export(HeavyOps([conv, linear]).eval(), example)
    buffer = to_edge_transform_and_lower(program, partitioner=[xnnguard.XnnpackPartitioner()]).to_executorch().buffer
    (method,) = read_methods(buffer, "heavy")
    (delegate,) = method.delegates
    graph = read_xnnpack_blob(delegate.blob)
    values = graph.value_map()
    ops = [node.op for node in graph.nodes]
    assert ops.count("XNNConv2d") == 1 and ops.count("XNNFullyConnected") == 1
    moved = [math.prod(values[node.outputs[0]].dims) for node in graph.nodes if node.op == "XNNStaticTranspose"]
    assert all(elements <= 1 for elements in moved), moved  # at most the one element each output keeps


def test_a_missed_median_is_out_of_reach_only_when_every_ceiling_bounds_its_network() -> None:
    from benchmarks.bench_networks import COUNTED, Row, misses
    from testbed.network_flow import Result

    def row(name: str, eager_ms: float, et_ms: float, heavy_ms: float) -> Row:
        float_result = Result(name, "bench", "float", "xnnguard", delegates=1, eager_ms=eager_ms, et_ms=et_ms)
        return Row(name, {"float": float_result}, heavy_ms=heavy_ms)

    bounded = [row(name, 30.0, 10.0, 9.0) for name in COUNTED]  # ratio 3.0, ceiling 3.33 each
    (missed,) = misses(bounded)
    assert missed.startswith("median eager/ET 3.00 < 4.0") and "ceiling 3.33" in missed and "out of reach" in missed
    room = [row(name, 30.0, 10.0, 5.0) for name in COUNTED]  # ceiling 6.0: the kernels leave room
    assert "room is left" in misses(room)[0]
    at_floor = [*bounded[:-1], row(COUNTED[-1], 30.0, 10.0, 10.5)]  # ceiling 2.86, 5 % below its ratio
    (missed,) = misses(at_floor)
    assert "out of reach" in missed and f"at their floor: {COUNTED[-1]}" in missed
    not_a_bound = [*bounded[:-1], row(COUNTED[-1], 30.0, 10.0, 12.0)]  # ceiling 2.5, 17 % below its ratio
    (missed,) = misses(not_a_bound)
    assert "no bound" in missed and COUNTED[-1] in missed and "out of reach" not in missed


def test_the_details_of_a_lowering_name_its_dynamic_batch() -> None:
    from benchmarks.network_report import details
    from testbed.network_flow import Result

    static, dynamic = (Result("s3d", "bench", "static", "xnnguard", batch=batch) for batch in ("static", "dynamic"))
    assert details([static, dynamic]).splitlines() == [
        "s3d [static, xnnguard]: ok", "s3d [static, dynamic batch, xnnguard]: ok"]


# ---------------------------------------------------------------------------------------------------------
# bench_peers and its tools: the turn protocol, failed conversions, the tables, FLOP counting, op profiles


def _clock(durations: list[float]) -> tuple[list[float], object, object]:
    """A fake clock and a run that advances it by the next duration: a turn's calls without sleeping."""
    now = [0.0]
    pending = list(durations)

    def clock() -> float:
        return now[0]

    def run() -> None:
        now[0] += pending.pop(0)

    return now, clock, run


def test_a_turn_calls_until_its_time_is_up_and_at_least_three_times() -> None:
    from benchmarks.timing import take_turn

    _, clock, run = _clock([0.125] * 10)
    assert take_turn(run, seconds=0.45, clock=clock) == [0.125] * 4  # type: ignore[arg-type]
    _, clock, run = _clock([1.0] * 10)
    assert take_turn(run, seconds=0.5, clock=clock) == [1.0] * 3  # type: ignore[arg-type]


def test_the_calls_that_start_in_a_turns_first_tenth_do_not_count() -> None:
    from benchmarks.timing import counted_calls

    assert counted_calls([4.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]) == [1.0] * 6  # a slow first call: warming up
    assert counted_calls([1.0] * 100) == [1.0] * 90
    assert counted_calls([5.0, 1.0]) == [1.0]  # the first call never counts when there are more
    assert counted_calls([2.0]) == [2.0]


def test_turns_rotate_so_that_no_side_always_goes_first() -> None:
    from benchmarks.timing import turn_order

    assert turn_order(["a", "b", "c"], 3) == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert turn_order([], 2) == []


def test_a_conversion_that_fails_is_an_entry_with_its_first_error_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """litert-torch is not in the suite's venv: converting with this interpreter fails in its worker."""
    import sys

    from benchmarks.bench_peers import Row, convert, report

    cell = convert("litert", "videomae", "test", tmp_path, litert=sys.executable)
    assert (cell.status, cell.artifact) == ("failed", None)
    assert cell.error == "ModuleNotFoundError: No module named 'litert_torch'"
    missing = convert("litert", "videomae", "test", tmp_path, litert=None)
    assert missing.status == "skipped" and "not installed" in missing.error
    text = report([Row("videomae", "test", 1e6, {"litert": cell})], ("litert",), {}, _machine(), "test", 1, 0.5)
    assert "videomae / LiteRT: failed: ModuleNotFoundError: No module named 'litert_torch'" in text
    assert "| videomae | 0.001 | failed" in text


def test_the_first_error_line_of_a_worker_is_its_exception_not_the_traceback() -> None:
    from benchmarks.peer_runtimes import error_line, first_error_line

    log = 'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: shapes differ\n\nsee above'
    assert first_error_line(log) == "RuntimeError: shapes differ"
    assert error_line(ValueError("first\nsecond")) == "ValueError: first"
    try:
        try:
            raise AssertionError("only 4D query, key, and value are supported")
        except AssertionError as cause:
            raise RuntimeError("Failed to convert. \x1b[96mThis is step 3/3\x1b[0m of exporting") from cause
    except RuntimeError as error:
        assert error_line(error) == ("AssertionError: only 4D query, key, and value are supported "
                                     "(in RuntimeError: Failed to convert. This is step 3/3 of exporting)")


def _machine():  # type: ignore[no-untyped-def]
    from benchmarks.bench_peers import Machine

    return Machine("2026-12-04 20:00", "a CPU", 2, 2, {"torch": "2.13.0"})


def test_the_peer_table_gives_each_runtimes_median_its_gflops_and_the_fastest_peer_over_xnnguard() -> None:
    from benchmarks.bench_peers import Cell, Row, report

    cells = {"eager": Cell("eager", artifact="", turns_ms=[40.0, 50.0, 45.0]),
             "xnnguard": Cell("xnnguard", artifact="p.pte", turns_ms=[10.0, 12.0, 11.0], delegates=1, outside=0),
             "ort": Cell("ort", artifact="p.onnx", turns_ms=[13.0, 14.0, 15.0]),
             "litert": Cell("litert", artifact="p.tflite", turns_ms=[9.0, 8.0, 8.8])}
    row = Row("videomae", "bench", 5e8, cells)
    peaks = {"xnnpack-f32": {"gflops": 200.0, "ms": 1.0}, "xnnpack-qs8": {"error": "no"}}
    text = report([row], ("eager", "xnnguard", "ort", "litert"), peaks, _machine(), "bench", 3, 0.5)
    assert "| videomae | 0.5  | 45.0             | 11.0        | 14.0            | 8.8       | 0.80 (LiteRT)" in text
    assert "| 90.9 (45%) |" in text  # xnnguard: 1 GFLOP in 11 ms, 45 % of the 200 GFLOP/s peak
    assert "xnnpack-f32 200.0, xnnpack-qs8 failed (no)" in text
    assert "| videomae | 1 / 0" in text
    assert row.best_peer() == "litert"


def test_multiply_adds_are_half_the_flops_flop_counter_counts_of_matmuls_and_convs() -> None:
    from testbed.macs import gflops, module_macs

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8, 4))
    macs = module_macs(model, (torch.randn(2, 3, 3, 3),))
    assert macs == 2 * (8 * 27) + 2 * 8 * 4  # the conv's one output pixel per image and channel; the linear
    assert gflops(1e9, 1000.0) == 2.0 and gflops(None, 1.0) is None


def test_an_xnnpack_event_counts_under_its_operator_type() -> None:
    from benchmarks.profile_ops import by_type, op_type

    assert op_type("Convolution (NHWC, F32) IGEMM #12") == "Convolution (NHWC, F32) IGEMM"
    assert by_type([("Add (ND) #1", 0.5), ("Add (ND) #2", 0.25), ("native_call_index.Tensor_out", 1.0)]) == {
        "Add (ND)": (2, 0.75), "native_call_index.Tensor_out": (1, 1.0)}


def test_an_int8_programs_op_type_named_with_a_float_datatype_counts_as_float() -> None:
    from benchmarks.profile_ops import float_share

    ops = {"Batch Matrix Multiply (NC, F32) GEMM": (8, 0.8), "Transpose (ND, X32)": (2, 0.1),
           "Fully Connected (NC, QS8, QC8W) GEMM": (17, 2.8), "Transpose (ND, X8)": (13, 0.2)}
    share = float_share(ops, {})
    assert share["float_ops"] == {"Batch Matrix Multiply (NC, F32) GEMM": 0.8, "Transpose (ND, X32)": 0.1}
    assert share["float_ms"] == pytest.approx(0.9)


def test_an_op_type_named_without_a_datatype_is_float_as_often_as_its_nodes_write_float() -> None:
    from benchmarks.profile_ops import float_share

    share = float_share({"Add (ND)": (4, 0.4)}, {"XNNAdd": {"float": 1, "other": 3}})
    assert share["float_ops"] == {"Add (ND)": pytest.approx(0.1)}


def test_a_conversion_counts_apart_from_the_float_ops() -> None:
    from benchmarks.profile_ops import float_share

    share = float_share({"Convert (NC)": (42, 0.3)}, {"XNNConvert": {"float": 21, "other": 21}})
    assert (share["float_ms"], share["conversions_ms"]) == (0.0, 0.3)


def test_an_onnx_runtime_profile_counts_kernel_time_per_op_type_without_the_first_run() -> None:
    from benchmarks.profile_ops import ort_ops

    def node(name: str, op: str, ts: int, dur: int) -> dict[str, object]:
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}

    trace = [{"cat": "Session", "name": "model_run", "ts": 0, "dur": 900},
             node("conv_1", "Conv", 10, 800),  # the first run: warming up
             {"cat": "Session", "name": "model_run", "ts": 1000, "dur": 300},
             node("conv_1", "Conv", 1010, 200), node("mm_1", "MatMul", 1210, 50), node("mm_2", "MatMul", 1260, 30),
             {"cat": "Node", "name": "conv_1_fence_before", "ts": 1005, "dur": 1}]
    profile = ort_ops(trace)
    assert (profile["forward_ms"], profile["ops"]) == (0.3, {"Conv": (1, 0.2), "MatMul": (2, 0.08)})
    assert profile["events"] == [("conv_1 (Conv)", 0.2), ("mm_1 (MatMul)", 0.05), ("mm_2 (MatMul)", 0.03)]


@pytest.mark.slow  # executorch.devtools takes 10-30 s to import
@pytest.mark.release_sensitive
def test_an_etdump_of_xnnguards_program_times_each_xnnpack_operator(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The per-op profile rests on the runtime's ETDump holding one event per XNNPACK operator.

    ExecuTorch 1.4's runtime takes ``enable_etdump`` but writes no ETDump: the profile says so.
    """
    from executorch.exir import to_edge_transform_and_lower

    import xnnguard
    from benchmarks.profile_ops import NoEtdumpError, profile_xnnguard

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 14 * 14, 4))
    inputs = (torch.randn(1, 3, 16, 16),)
    program = torch.export.export(model.eval(), inputs)
    pte = tmp_path / "small.pte"
    pte.write_bytes(to_edge_transform_and_lower(program, partitioner=[xnnguard.XnnpackPartitioner()])
                    .to_executorch().buffer)
    try:
        profile = profile_xnnguard(str(pte), inputs, runs=3, threads=1)
    except NoEtdumpError as error:
        pytest.skip(str(error))
    ops = profile["ops"]
    assert ops["Convolution (NHWC, F32) IGEMM"][0] == 1 and ops["Fully Connected (NC, F32) GEMM"][0] == 1
    assert 0 < sum(ms for _, ms in ops.values()) <= profile["forward_ms"]


def test_a_repeat_reuses_the_programs_an_earlier_run_kept_and_converts_the_rest(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    from dataclasses import asdict

    from benchmarks.bench_peers import reused
    from testbed.network_flow import Result

    (tmp_path / "unet3d.bench.onnx").write_bytes(b"")
    record = Result("unet3d", "bench", "float", "xnnguard", delegates=1, outside=0, pte=str(tmp_path / "u.pte"),
                    max_err=1e-6)
    (tmp_path / "unet3d.bench.float.static.json").write_text(json.dumps(asdict(record)))
    ort = reused("ort", "unet3d", "bench", tmp_path)
    assert ort is not None and ort.artifact == str(tmp_path / "unet3d.bench.onnx")
    ours = reused("xnnguard", "unet3d", "bench", tmp_path)
    assert ours is not None and (ours.artifact, ours.delegates, ours.outside, ours.max_err) == (record.pte, 1, 0, 1e-6)
    assert reused("litert", "unet3d", "bench", tmp_path) is None  # not kept: converted again
    assert reused("xnnguard-int8", "unet3d", "bench", tmp_path) is None


def test_the_network_report_shows_a_dynamic_frames_programs_longer_clip_and_its_ms() -> None:
    from benchmarks.network_report import table
    from testbed.network_flow import Result

    result = Result("unet3d", "bench", "float", "xnnguard", batch="frames", delegates=1, eager_ms=25.0, et_ms=6.4,
                    long_frames=16, long_et_ms=12.3)
    header, _, row = table([result]).splitlines()
    assert "longer clip" in header and "ET ms there" in header
    assert [cell.strip() for cell in row.split(" | ")[-2:]] == ["16 frames", "12.3"]
