"""Lower whole networks from ``testbed.networks`` to XNNPACK and report what stays outside, and why.

``python -m benchmarks.network_report [NAME...] [--precision float|fp16|static|dynamic]... [--size bench|test]
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
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.timing import REPO, median_ms, print_ms, time_in_fresh_process
from testbed.network_flow import PRECISIONS, Result, lower_network

ROUNDS = 3  # fresh processes per side, alternating
LOWER_TIMEOUT_S = 1800
TOP_KINDS = 4


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


def _time_worker(side: str, name: str, size: str, threads: int, pte: str | None, frames: int | None = None) -> float:
    """Time one side of one network in this (fresh) process (``frames``: on a clip of that many frames)."""
    from testbed.networks import NETWORKS

    torch.set_num_threads(threads)
    model, inputs = NETWORKS[name](size)
    if frames is not None:
        inputs = (torch.randn(*inputs[0].shape[:2], frames, *inputs[0].shape[3:]), *inputs[1:])
    if side == "eager":
        with torch.no_grad():
            return median_ms(lambda: model(*inputs))
    from xnnguard.boundary.runtime import load_module, reset_threadpool

    reset_threadpool(threads)  # before loading: delegates keep the pool they saw
    assert pte is not None
    module = load_module(pte)
    return median_ms(lambda: module.forward(inputs))


def time_network(result: Result, threads: int) -> None:
    """Eager vs ExecuTorch medians, each run in its own fresh process, rounds alternating; a program with
    dynamic frames also at its longer clip (``Result.long_frames``)."""
    args = ["--network", result.network, "--size", result.size, "--threads", str(threads)]
    eager, et, long_et = [], [], []
    for _ in range(ROUNDS):
        eager.append(time_in_fresh_process("benchmarks.network_report", ["--time-worker", "eager", *args],
                                           f"eager timing of {result.network}"))
        if result.status == "ok" and result.pte:
            et.append(time_in_fresh_process("benchmarks.network_report",
                                            ["--time-worker", "executorch", *args, "--pte", result.pte],
                                            f"ExecuTorch timing of {result.network}"))
            if result.long_frames:
                long_et.append(time_in_fresh_process(
                    "benchmarks.network_report",
                    ["--time-worker", "executorch", *args, "--pte", result.pte, "--frames", str(result.long_frames)],
                    f"ExecuTorch timing of {result.network} at {result.long_frames} frames"))
    result.eager_ms = statistics.median(eager)
    result.et_ms = statistics.median(et) if et else None
    result.long_et_ms = statistics.median(long_et) if long_et else None


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
    quantized = any(r.precision in ("static", "dynamic") for r in results)
    frames = any(r.batch == "frames" for r in results)  # dynamic frames: also the longer clip's run
    header = ("network", "result", "delegates", "ops outside (top kinds)", "max err",
              *(("err vs float", "reference vs float", "rounding floor") if quantized else ()),
              "eager ms", "ET ms", "eager/ET", *(("longer clip", "ET ms there") if frames else ()))
    rows = []
    for r in results:
        ratio = r.eager_ms / r.et_ms if r.eager_ms and r.et_ms else None
        rows.append((r.network, r.status, _num(r.delegates, "d"), _kinds(r), _num(r.max_err, ".2e"),
                     *((_num(r.float_err, ".2e"), _num(r.reference_float_err, ".2e"), _num(r.rounding_floor, ".2e"))
                       if quantized else ()),
                     _num(r.eager_ms, ".1f"), _num(r.et_ms, ".1f"), _num(ratio, ".2f"),
                     *((f"{r.long_frames} frames" if r.long_frames else "-", _num(r.long_et_ms, ".1f"))
                       if frames else ())))
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
        batch = {"dynamic": ", dynamic batch", "frames": ", dynamic frames"}.get(r.batch, "")
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
    from testbed.networks import NETWORKS, SIZES

    parser = argparse.ArgumentParser(prog="python -m benchmarks.network_report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"networks (default: all): {', '.join(NETWORKS)}")
    parser.add_argument("--precision", action="append", choices=PRECISIONS,
                        help="float (default), fp16 (float16), static or dynamic int8; repeat for several")
    parser.add_argument("--size", choices=SIZES, default="bench")
    parser.add_argument("--time", action="store_true", help="also time eager vs ExecuTorch")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("XNNGUARD_BENCH_THREADS", 2)))
    parser.add_argument("--stock", action="store_true", help="stock ExecuTorch partitioner/quantizer, no rewrite")
    parser.add_argument("--batch", choices=("static", "dynamic", "frames"), default="static",
                        help="dynamic: export with a dynamic batch (traced at 2, run at the network's batch); "
                             "frames: with a dynamic frame count (run at the example's and twice as many)")
    parser.add_argument("--pte-dir", type=Path, default=None, help="keep the .pte files here (default: temporary)")
    parser.add_argument("--json", type=Path, default=None, help="also write every result as JSON here")
    parser.add_argument("--lower-worker", metavar="NAME", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--time-worker", choices=["eager", "executorch"], help=argparse.SUPPRESS)
    parser.add_argument("--network", help=argparse.SUPPRESS)
    parser.add_argument("--pte", help=argparse.SUPPRESS)
    parser.add_argument("--frames", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.time and "fp16" in (args.precision or ()):
        parser.error("--time compares with the float32 eager model: it times float and int8 programs, not fp16")
    unknown = [name for name in args.names if name not in NETWORKS]
    if unknown:
        parser.error(f"unknown network(s) {', '.join(unknown)}; there are: {', '.join(NETWORKS)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    from testbed.networks import NETWORKS

    args = _parse(argv)
    precisions = args.precision or ["float"]
    if args.time_worker:
        print_ms(_time_worker(args.time_worker, args.network, args.size, args.threads, args.pte, args.frames))
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
