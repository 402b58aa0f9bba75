"""Lower whole networks from ``benchmarks.networks`` to XNNPACK and report what stays outside, and why.

``python -m benchmarks.network_report [NAME...] [--precision float|static|dynamic]... [--size bench|test]
[--time] [--stock]``

For each network and precision, in a fresh process of its own (a crash in the runtime is a result, not
the end of the report): export; ``xnnguard.XnnpackRewriter`` (``rewrite_for_xnnpack``); for int8, pt2e
with ``xnnguard.XNNPACKQuantizer`` (per-channel symmetric, static or dynamic), calibrated on the example
input, after the rewrite; ``to_edge_transform_and_lower`` with ``xnnguard.XnnpackPartitioner``; serialize;
load from the buffer with the ExecuTorch pybindings; run; compare with eager (float: max abs error over
the output's max abs value; int8: the same against the converted pt2e model). ``--stock`` does the same
with ExecuTorch 1.5.1's own partitioner and quantizer and no rewrite, to show what stock does; every
failure is caught and reported with the stage it happened in.

Reported per network: XNNPACK delegates; call_function nodes left in the top-level edge graph (not
``executorch_call_delegate`` / ``getitem``) with their most common kinds; the rewriter's report and the
partitioner's ``kept_out`` (grouped by reason); with ``--time``, eager and ExecuTorch ms on
``--threads`` threads, each side timed in its own fresh process by ``benchmarks.timing``'s protocol,
rounds alternating.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.rounding_floor import rounding_floor
from benchmarks.timing import REPO, median_ms, print_ms, time_in_fresh_process

PRECISIONS = ("float", "static", "dynamic")
ROUNDS = 3  # fresh processes per side, alternating
LOWER_TIMEOUT_S = 1800
TOP_KINDS = 4
# A network "matches" when its max error, relative to the output's scale, is below this (int8: or below its
# rounding floor, benchmarks.rounding_floor).
TOLERANCE = {"float": 1e-3, "static": 0.05, "dynamic": 0.05}
# Dynamic int8 also matches as close to float as its reference: the max error up to this many times the
# reference's, the mean error no larger (see _matches).
MAX_ERR_SLACK = 2.0
# Issue 12's target: at most this many XNNPACK delegates per network, and no compute op outside them.
MAX_DELEGATES = 3
# What a graph outside the delegates may keep without counting as compute left on portable kernels.
NOT_COMPUTE = ("getitem", "executorch_call_delegate", "alloc", "sym_size", "_assert", "dim_order_ops")


@dataclass
class Result:
    """Everything one (network, precision, flow) lowering produced, as plain data (it crosses processes)."""

    network: str
    size: str
    precision: str
    flow: str  # "xnnguard" or "stock"
    batch: str = "static"  # "dynamic": exported with a dynamic batch (see dynamic_batch)
    status: str = "ok"  # "ok", "mismatch", or "<stage> failed"
    error: str = ""
    delegates: int | None = None
    delegated_ops: int | None = None
    outside: int | None = None
    outside_kinds: list[tuple[str, int]] = field(default_factory=list)
    max_err: float | None = None
    float_err: float | None = None  # int8 only: the same measure against the float eager model
    reference_float_err: float | None = None  # int8 only: the converted model's own error against float
    float_mean_err: float | None = None  # int8 only: mean abs error against float, over float's max abs value
    reference_float_mean_err: float | None = None  # int8 only: the converted model's, the same way
    rounding_floor: float | None = None  # int8 only: benchmarks.rounding_floor of the converted model
    rewrite_report: list[str] = field(default_factory=list)
    kept_out: list[str] = field(default_factory=list)
    no_equivalent: list[str] = field(default_factory=list)  # ops of the kept-out nodes no XNNPACK node computes
    left_in_float: list[str] = field(default_factory=list)
    lower_s: float | None = None
    pte: str | None = None
    eager_ms: float | None = None
    et_ms: float | None = None
    stage_s: dict[str, float] = field(default_factory=dict)  # seconds per stage of the flow


class StageError(Exception):
    """A stage of the flow failed; ``stage`` names it, the cause is chained."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage


@contextmanager
def stage(name: str, result: Result, log: Callable[[], str] | None = None) -> Iterator[None]:
    """Time the block into ``result.stage_s``; turn its exception into a ``StageError`` naming the stage.

    The exact message is kept; ``log`` gives the runtime's own failure lines (the pybindings' exceptions
    only carry an error code).
    """
    started = time.perf_counter()
    try:
        yield
    except StageError:
        raise
    except Exception as error:
        message = _describe(error)
        runtime = log() if log is not None else ""
        if runtime:
            message += f" | runtime log: {runtime}"
        if name == "run" and "Init failed" in runtime:  # the pybindings load a method on its first call
            name = "init (first call)"
        raise StageError(name, message) from error
    finally:
        result.stage_s[name] = result.stage_s.get(name, 0.0) + time.perf_counter() - started


def _describe(error: BaseException) -> str:
    """The exception and what caused it: ExecuTorch's pass manager wraps the real error in a generic one."""
    parts, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}".strip())
        current = current.__cause__ or current.__context__
    return " | caused by: ".join(parts)


# ---------------------------------------------------------------------------------------------------------
# One lowering (runs in a worker process)


def _quantizer(precision: str, stock: bool) -> Any:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config

    if stock:
        import executorch.kernels.quantized  # noqa: F401  (q/dq left outside need these kernels, by hand)
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer
    else:
        from xnnguard import XNNPACKQuantizer
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=precision == "dynamic")
    return XNNPACKQuantizer().set_global(config)


def _partitioner(stock: bool) -> Any:
    if stock:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        return XnnpackPartitioner()
    import xnnguard

    return xnnguard.XnnpackPartitioner()


def _first_tensor(output: Any) -> torch.Tensor:
    while isinstance(output, list | tuple):
        output = output[0]
    assert isinstance(output, torch.Tensor), f"the network returned {type(output).__name__}, not a tensor"
    return output


def _op_name(target: Any) -> str:
    """``aten.permute_copy.default`` for an edge op, the function's name for anything else."""
    name = str(target)
    return name if "." in name and " " not in name else getattr(target, "__name__", name)


def count_graph(edge: Any, result: Result) -> None:
    """Delegates, ops inside them, and call_function nodes left outside (by kind) in the top-level graph."""
    gm = edge.exported_program().graph_module
    outside: Counter[str] = Counter()
    delegates = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = _op_name(node.target)
        if "executorch_call_delegate" in name:
            delegates += 1
        elif "getitem" not in name:
            outside[name] += 1
    result.delegates = delegates
    result.delegated_ops = sum(
        1 for _, child in gm.named_children() if hasattr(child, "original_module")
        for node in child.original_module.graph.nodes if node.op == "call_function")
    result.outside = sum(outside.values())
    result.outside_kinds = outside.most_common()


def _prepare(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], result: Result,
             stock: bool) -> tuple[Any, torch.Tensor]:
    """Export, rewrite (xnnguard flow) and quantize (int8): the program to lower and its reference output.

    The reference is eager for float and the converted pt2e model for int8: it isolates what lowering
    and the runtime change from what quantization itself changes.
    """
    dynamic_shapes = getattr(model, "export_dynamic_shapes", None)  # a network exported with dynamic dims
    export_inputs = inputs
    if result.batch == "dynamic" and dynamic_shapes is None:
        # a network without a batch dim says what varies instead (Qwen2-VL's tower: the patch count)
        dynamic_shapes = getattr(model, "dynamic_batch_shapes", None)
        if dynamic_shapes is None:
            export_inputs, dynamic_shapes = dynamic_batch(inputs)
    with stage("export", result):
        ep = torch.export.export(model, export_inputs, dynamic_shapes=dynamic_shapes)
    if not stock:
        import xnnguard

        rewriter = xnnguard.XnnpackRewriter()
        with stage("rewrite", result):
            ep = rewriter(ep)
        result.rewrite_report = [str(record) for record in rewriter.report]
    if result.precision == "float":
        with torch.no_grad():
            return ep, _first_tensor(model(*inputs))
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = _quantizer(result.precision, stock)
    with stage("quantize", result):
        prepared = prepare_pt2e(ep.module(), quantizer)
        prepared(*inputs)  # calibrate on the example input
        converted = convert_pt2e(prepared)
        expected = _first_tensor(converted(*inputs))
        result.rounding_floor = rounding_floor(converted, inputs)
        ep = torch.export.export(converted, export_inputs, dynamic_shapes=dynamic_shapes)
    result.left_in_float = [str(record) for record in getattr(quantizer, "left_in_float", ())]
    return ep, expected


def dynamic_batch(inputs: tuple[torch.Tensor, ...]) -> tuple[tuple[torch.Tensor, ...], tuple[dict[int, Any], ...]]:
    """Export inputs and dynamic shapes for a dynamic batch, as export pipelines often keep one.

    The example is the input repeated to batch 2 (an example batch of 1 would be specialized away); the
    program is then run and compared at the network's own batch of 1, another batch than it was traced at.
    """
    batch = torch.export.Dim("batch", min=1, max=4)
    return (tuple(x.repeat(2, *[1] * (x.dim() - 1)) for x in inputs),
            tuple({0: batch} for _ in inputs))


def lower_network(name: str, size: str, precision: str, stock: bool, pte_dir: Path,
                  batch: str = "static") -> Result:
    """Build, export, rewrite, quantize, lower, serialize, load, run and compare one network."""
    from executorch.exir import to_edge_transform_and_lower
    from executorch.extension.pybindings import portable_lib

    from benchmarks.networks import NETWORKS
    from xnnguard.report import Rule
    from xnnguard.runtime_check.runtime_load import captured_stderr

    result = Result(name, size, precision, "stock" if stock else "xnnguard", batch=batch)
    try:
        with stage("build", result):
            model, inputs = NETWORKS[name](size)
        started = time.perf_counter()
        ep, expected = _prepare(model, inputs, result, stock)
        partitioner = _partitioner(stock)
        with stage("lower", result):
            edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
        count_graph(edge, result)
        result.kept_out = [str(record) for record in getattr(partitioner, "kept_out", ())]
        result.no_equivalent = [record.op for record in getattr(partitioner, "kept_out", ())
                                if record.rule is Rule.NO_XNNPACK_EQUIVALENT]
        with stage("serialize", result):
            buffer = edge.to_executorch().buffer
        result.lower_s = time.perf_counter() - started
        pte = pte_dir / f"{name}.{size}.{precision}.{batch}.{result.flow}.pte"
        pte.write_bytes(buffer)
        result.pte = str(pte)
        with captured_stderr() as log:

            def failures() -> str:
                return _failure_lines(log.text())

            with stage("load", result, failures):
                module = portable_lib._load_for_executorch_from_buffer(buffer)  # buffer outlives the module
            with stage("run", result, failures):
                got = _first_tensor(module.forward(inputs))
        result.max_err = _relative_error(got, expected)
        if precision != "float":
            with torch.no_grad():
                eager = _first_tensor(model(*inputs))
            result.float_err = _relative_error(got, eager)
            result.reference_float_err = _relative_error(expected, eager)
            result.float_mean_err = _mean_relative_error(got, eager)
            result.reference_float_mean_err = _mean_relative_error(expected, eager)
        # int8: an error below what one-step rounding differences cause is as close as rounding allows
        tolerance = max(TOLERANCE[precision], result.rounding_floor or 0.0)
        if not _matches(result, tolerance):
            result.status = "mismatch"
            result.error = (f"output shape {tuple(got.shape)} vs {tuple(expected.shape)}" if result.max_err is None
                            else f"max error {result.max_err:.3g} of the output scale > {tolerance:.3g}")
    except StageError as error:
        result.status = f"{error.stage} failed"
        result.error = str(error)
    return result


def _matches(result: Result, tolerance: float) -> bool:
    """Within ``tolerance`` of the reference; in dynamic int8, or as close to float as the reference is.

    XNNPACK's dynamically quantized conv picks quantization parameters per image of the batch, the
    converted model one per tensor (measured: a conv on a batch of four images of ranges 0.01 to 10 is
    1e-4 from float on XNNPACK, 1.6e-2 in the converted model). Where frames are folded into the batch
    (a video VAE) XNNPACK then rounds other elements than the reference it is compared with; that is
    ExecuTorch's dynamic quantization, not a wrong program. "As close": no larger a mean error against
    float than the reference's (the program as a whole), and a max error at most ``MAX_ERR_SLACK`` times
    the reference's (no element far off: a wrong channel or frame would be). The max alone is one
    element: the test-size VAE is 8.7 % from float at its worst element, the reference 7.4 %, while the
    program's mean error is the smaller (0.54 % against 0.57 %).
    """
    if result.max_err is not None and result.max_err <= tolerance:
        return True
    if result.precision != "dynamic":
        return False
    errors = (result.float_err, result.reference_float_err, result.float_mean_err, result.reference_float_mean_err)
    if any(error is None for error in errors):
        return False
    worst, reference_worst, mean, reference_mean = errors
    return mean <= reference_mean and worst <= MAX_ERR_SLACK * reference_worst  # type: ignore[operator]


def compute_outside(result: Result) -> int | None:
    """Compute ops the lowering left outside XNNPACK (on portable kernels) that some XNNPACK node could
    compute: not ``NOT_COMPUTE``, and not what the partitioner names as having no XNNPACK equivalent."""
    if result.outside is None:
        return None
    floor = Counter(result.no_equivalent)
    return sum(max(0, n - floor[kind]) for kind, n in result.outside_kinds
               if not any(word in kind for word in NOT_COMPUTE))


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float | None:
    """Max abs error over the expected output's max abs value (None when the shapes differ)."""
    if got.shape != expected.shape:
        return None
    return (got - expected).abs().max().item() / max(expected.abs().max().item(), 1e-6)


def _mean_relative_error(got: torch.Tensor, expected: torch.Tensor) -> float | None:
    """Mean abs error over the expected output's max abs value (None when the shapes differ)."""
    if got.shape != expected.shape:
        return None
    return (got - expected).abs().mean().item() / max(expected.abs().max().item(), 1e-6)


def _failure_lines(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if "fail" in line.lower() or "error" in line.lower()]
    return "; ".join(line for line in lines if not line.startswith("[cpuinfo"))[-1500:]


# ---------------------------------------------------------------------------------------------------------
# Workers and the driver


def lower_in_fresh_process(name: str, size: str, precision: str, stock: bool, pte_dir: Path,
                            batch: str = "static") -> Result:
    """``lower_network`` in a process of its own; a crash or a hang becomes the result's error."""
    out = pte_dir / f"{name}.{size}.{precision}.{batch}.json"
    command = [sys.executable, "-m", "benchmarks.network_report", "--lower-worker", name, "--size", size,
               "--precision", precision, "--batch", batch, "--pte-dir", str(pte_dir), "--out", str(out)]
    if stock:
        command.append("--stock")
    flow = "stock" if stock else "xnnguard"
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO,
                              timeout=LOWER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Result(name, size, precision, flow, batch, status="timeout",
                      error=f"no result after {LOWER_TIMEOUT_S} s")
    if done.returncode != 0 or not out.exists():
        tail = " | ".join(done.stderr.strip().splitlines()[-6:])
        return Result(name, size, precision, flow, batch, status="crashed",
                      error=f"worker exited with {done.returncode}: {tail}"[-2000:])
    data = json.loads(out.read_text())
    data["outside_kinds"] = [tuple(kind) for kind in data["outside_kinds"]]
    return Result(**data)


def _time_worker(side: str, name: str, size: str, threads: int, pte: str | None) -> float:
    """Time one side of one network in this (fresh) process."""
    from benchmarks.networks import NETWORKS

    torch.set_num_threads(threads)
    model, inputs = NETWORKS[name](size)
    if side == "eager":
        with torch.no_grad():
            return median_ms(lambda: model(*inputs))
    from executorch.extension.pybindings import portable_lib

    portable_lib._unsafe_reset_threadpool(threads)  # before loading: delegates keep the pool they saw
    assert pte is not None
    module = portable_lib._load_for_executorch(pte)
    return median_ms(lambda: module.forward(inputs))


def time_network(result: Result, threads: int) -> None:
    """Eager vs ExecuTorch medians, each run in its own fresh process, rounds alternating."""
    args = ["--network", result.network, "--size", result.size, "--threads", str(threads)]
    eager, et = [], []
    for _ in range(ROUNDS):
        eager.append(time_in_fresh_process("benchmarks.network_report", ["--time-worker", "eager", *args],
                                           f"eager timing of {result.network}"))
        if result.status == "ok" and result.pte:
            et.append(time_in_fresh_process("benchmarks.network_report",
                                            ["--time-worker", "executorch", *args, "--pte", result.pte],
                                            f"ExecuTorch timing of {result.network}"))
    result.eager_ms = statistics.median(eager)
    result.et_ms = statistics.median(et) if et else None


# ---------------------------------------------------------------------------------------------------------
# Printing


def _kinds(result: Result) -> str:
    if result.outside is None:
        return "-"
    top = ", ".join(f"{n} {kind.removeprefix('aten.').removesuffix('.default')}"
                    for kind, n in result.outside_kinds[:TOP_KINDS])
    return f"{result.outside}" + (f" ({top})" if top else "")


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(results: Sequence[Result]) -> str:
    quantized = any(r.precision != "float" for r in results)
    header = ("network", "result", "delegates", "ops outside (top kinds)", "max err",
              *(("err vs float", "reference vs float", "rounding floor") if quantized else ()),
              "eager ms", "ET ms", "eager/ET")
    rows = []
    for r in results:
        ratio = r.eager_ms / r.et_ms if r.eager_ms and r.et_ms else None
        rows.append((r.network, r.status, _num(r.delegates, "d"), _kinds(r), _num(r.max_err, ".2e"),
                     *((_num(r.float_err, ".2e"), _num(r.reference_float_err, ".2e"), _num(r.rounding_floor, ".2e"))
                       if quantized else ()),
                     _num(r.eager_ms, ".1f"), _num(r.et_ms, ".1f"), _num(ratio, ".2f")))
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(len(header))]
    lines = [" | ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in (header, *rows)]
    lines.insert(1, "-|-".join("-" * w for w in widths))
    return "\n".join(lines)


def _grouped(records: Sequence[str]) -> list[str]:
    """``node (op): reason`` records grouped by ``(op): reason``, most frequent first, with counts."""
    groups = Counter(record.split(" ", 1)[1] if " " in record else record for record in records)
    return [f"{n} x {text}" for text, n in groups.most_common()]


def details(results: Sequence[Result]) -> str:
    lines = []
    for r in results:
        stages = ", ".join(f"{name} {seconds:.1f}" for name, seconds in r.stage_s.items())
        batch = ", dynamic batch" if r.batch == "dynamic" else ""
        timing = f" (s: {stages})" if stages else ""
        lines.append(f"{r.network} [{r.precision}{batch}, {r.flow}]: {r.status}{timing}")
        if r.error:
            lines.append(f"  error: {r.error[:1500]}")
        if r.outside_kinds:
            lines.append("  outside XNNPACK: " + ", ".join(f"{n} {k}" for k, n in r.outside_kinds))
        for title, records in (("rewriter report", r.rewrite_report), ("partitioner kept_out", r.kept_out),
                               ("quantizer left in float", r.left_in_float)):
            if records:
                lines.append(f"  {title} ({len(records)}):")
                lines.extend(f"    {line}"[:300] for line in _grouped(records)[:12])
    return "\n".join(lines)


def run_report(names: Sequence[str], precisions: Sequence[str], size: str, stock: bool, timing: bool,
               threads: int, pte_dir: Path, batch: str = "static") -> list[Result]:
    results = []
    for precision in precisions:
        group = []
        for name in names:
            print(f"lowering {name} ({size}, {precision}, {batch} batch, {'stock' if stock else 'xnnguard'}) ...",
                  file=sys.stderr, flush=True)
            result = lower_in_fresh_process(name, size, precision, stock, pte_dir, batch)
            if timing:
                time_network(result, threads)
            group.append(result)
        print(f"\n## {precision}, {batch} batch ({size} size, {'stock ExecuTorch' if stock else 'xnnguard'}"
              + (f", {threads} threads" if timing else "") + ")\n")
        print(table(group))
        print()
        print(details(group))
        results.extend(group)
    return results


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    from benchmarks.networks import NETWORKS, SIZES

    parser = argparse.ArgumentParser(prog="python -m benchmarks.network_report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"networks (default: all): {', '.join(NETWORKS)}")
    parser.add_argument("--precision", action="append", choices=PRECISIONS,
                        help="float (default), static or dynamic int8; repeat for several")
    parser.add_argument("--size", choices=SIZES, default="bench")
    parser.add_argument("--time", action="store_true", help="also time eager vs ExecuTorch")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("XNNGUARD_BENCH_THREADS", 2)))
    parser.add_argument("--stock", action="store_true", help="stock ExecuTorch partitioner/quantizer, no rewrite")
    parser.add_argument("--batch", choices=("static", "dynamic"), default="static",
                        help="dynamic: export with a dynamic batch (traced at 2, run at the network's batch)")
    parser.add_argument("--pte-dir", type=Path, default=None, help="keep the .pte files here (default: temporary)")
    parser.add_argument("--json", type=Path, default=None, help="also write every result as JSON here")
    parser.add_argument("--lower-worker", metavar="NAME", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--time-worker", choices=["eager", "executorch"], help=argparse.SUPPRESS)
    parser.add_argument("--network", help=argparse.SUPPRESS)
    parser.add_argument("--pte", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in NETWORKS]
    if unknown:
        parser.error(f"unknown network(s) {', '.join(unknown)}; there are: {', '.join(NETWORKS)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.networks import NETWORKS

    args = _parse(argv)
    precisions = args.precision or ["float"]
    if args.time_worker:
        print_ms(_time_worker(args.time_worker, args.network, args.size, args.threads, args.pte))
        return 0
    if args.lower_worker:
        try:
            result = lower_network(args.lower_worker, args.size, precisions[0], args.stock, args.pte_dir,
                                   args.batch)
        except Exception:  # a bug of this script, not of the flow: say so plainly
            traceback.print_exc()
            return 1
        args.out.write_text(json.dumps(asdict(result)))
        return 0
    with tempfile.TemporaryDirectory(prefix="xnnguard-networks-") as tmp:
        pte_dir = args.pte_dir or Path(tmp)
        pte_dir.mkdir(parents=True, exist_ok=True)
        results = run_report(args.names or list(NETWORKS), precisions, args.size, args.stock, args.time,
                             args.threads, pte_dir, args.batch)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    if args.time:
        print("\nTimings: medians of fresh-process rounds; taken on whatever machine ran this (a shared one "
              "makes them noisy).")
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
