"""Where a network's time goes, per op type, in xnnguard's program and in a peer's: for closing the gap.

``python -m benchmarks.profile_ops NAME --runtime xnnguard|xnnguard-int8|ort|ort-int8|litert [--size bench]
[--threads 2] [--runs 30] [--top 20] [--events N] [--artifact PATH] [--json PATH]``

The network is converted as ``bench_peers`` converts it (or ``--artifact`` names the program made
already, e.g. one ``bench_peers --keep DIR`` kept), then a fresh process (``benchmarks.timing``'s
environment) runs it ``--runs`` times with the runtime's own profiler on and prints, per op type, the
calls and ms of one forward and their share of it (``--events N``: also the N slowest single ops):

* xnnguard: ExecuTorch's ETDump (``enable_etdump``, reached through ``xnnguard.boundary.runtime``), read
  with ``executorch.devtools.Inspector``; the 1.5.1 wheel's XNNPACK delegate logs every XNNPACK operator
  as an event (``Convolution (NHWC, F32) IGEMM #3``: the type is the name without its number). Each
  event counts at its median over the runs; ops outside the delegate are events of their own.
  ``XNNPACK delegate calls`` is each delegate's whole call: its operators and what XNNPACK and
  ExecuTorch do around them on every run (the share the operators leave is that work).
* ONNX Runtime: ``SessionOptions.enable_profiling``; the ``Node`` events' kernel times by ``op_name``
  (fused nodes by the name of their fusion), the first run left out.
* LiteRT: ai-edge-litert 2.3's Python ``Interpreter`` reaches no profiler (its op profiling lives in the
  C++ benchmark tool, not in the wheel), so only the forward's time and the graph's op types and counts
  are printed (``Interpreter._get_ops_details``, LiteRT's own private call, used here only: this is
  benchmark code, not xnnguard's).

For an int8 program of xnnguard's, the profile also says what of it runs in float (``float_share``):
each op type counts as float when XNNPACK names it with a float datatype (``F32``; ``X32`` for data
movement), as int8 when with an int8 one, and otherwise (``Add (ND)``) in the proportion of the program's
XNNPACK nodes of that kind that write an fp32 value; ``Convert`` operators (a quantize or dequantize at
the edge of a float region) count apart, as conversions.

The forward's time is the median of the runs with the profiler on, which costs a little.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

# ETDump events that are the runtime's own frame, not an op: the forward's total is Method::execute.
FRAME_EVENTS = frozenset({"Method::execute", "Method::init", "Program::load_method", "DELEGATE_CALL"})
RUNTIMES = ("xnnguard", "xnnguard-int8", "ort", "ort-int8", "litert")


class NoEtdumpError(RuntimeError):
    """The runtime recorded no ETDump, so there is no per-op profile of an ExecuTorch program."""


def op_type(event_name: str) -> str:
    """An event's op type: its name without the ``#N`` XNNPACK numbers its operators with."""
    return re.sub(r"\s*#\d+$", "", event_name)


def by_type(events: list[tuple[str, float]]) -> dict[str, tuple[int, float]]:
    """(op type, ms of one forward) pairs summed per type: {type: (calls, ms)}."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, ms in events:
        entry = totals[op_type(name)]
        entry[0] += 1
        entry[1] += ms
    return {name: (int(calls), ms) for name, (calls, ms) in totals.items()}


# XNNPACK operator types whose names carry no datatype, and the serialized node kind each one runs
_UNTYPED_OPS = {
    "Add (ND)": "XNNAdd", "Multiply (ND)": "XNNMultiply", "Subtract (ND)": "XNNSubtract", "Divide (ND)": "XNNDiv",
    "Maximum (ND)": "XNNMaximum", "Minimum (ND)": "XNNMinimum", "Square (NC)": "XNNSquare",
    "Square Root (NC)": "XNNSquareRoot", "Reciprocal Square Root (NC)": "XNNReciprocalSquareRoot",
    "Negate (NC)": "XNNNegate", "Cosine (NC)": "XNNCos", "Sine (NC)": "XNNSin", "Clamp (NC)": "XNNClamp",
    "Leaky ReLU (NC)": "XNNLeakyReLU", "Invalid Unary Op": "XNNGelu",  # 1.5.1's XNNPACK names GELU so
}
_FLOAT_TAGS = frozenset({"F32", "X32", "F16", "X16"})
_INT8_TAGS = frozenset({"QS8", "QC8", "QU8", "QD8", "S8", "U8", "X8"})


def node_precisions(pte: str) -> dict[str, dict[str, int]]:
    """Per XNNPACK node kind of the program's delegates, how many write an fp32 value and how many another."""
    from xnnguard.runtime_check.pte_reader import read_methods
    from xnnguard.runtime_check.xnnpack_blob import read_xnnpack_blob

    counts: dict[str, dict[str, int]] = defaultdict(lambda: {"float": 0, "other": 0})
    for method in read_methods(Path(pte).read_bytes(), pte):
        for delegate in method.delegates:
            if delegate.backend != "XnnpackBackend":
                continue
            graph = read_xnnpack_blob(delegate.blob)
            values = graph.value_map()
            for node in graph.nodes:
                kind = "float" if values[node.outputs[0]].datatype == "fp32" else "other"
                counts[node.op][kind] += 1
    return dict(counts)


def float_share(ops: dict[str, tuple[int, float]], precisions: dict[str, dict[str, int]]) -> dict[str, Any]:
    """What of an int8 program's time is float: {"float_ms", "conversions_ms", "float_ops": {type: ms}}."""
    float_ops: dict[str, float] = {}
    conversions = 0.0
    for name, (_, ms) in ops.items():
        tags = set(re.findall(r"[A-Z0-9]+", name))
        if name.startswith("Convert"):
            conversions += ms
            continue
        if tags & _FLOAT_TAGS:
            share = 1.0
        elif tags & _INT8_TAGS:
            share = 0.0
        else:
            counts = precisions.get(_UNTYPED_OPS.get(name, ""), {"float": 0, "other": 0})
            total = counts["float"] + counts["other"]
            share = counts["float"] / total if total else 0.0
        if share and ms:
            float_ops[name] = ms * share
    return {"float_ms": sum(float_ops.values()), "conversions_ms": conversions,
            "float_ops": dict(sorted(float_ops.items(), key=lambda item: -item[1]))}


def slowest(events: list[tuple[str, float]], count: int = 40) -> list[tuple[str, float]]:
    """The ``count`` slowest single events (which conv, which matmul), slowest first."""
    return sorted(events, key=lambda event: -event[1])[:count]


# ---------------------------------------------------------------------------------------------------------
# Workers: run the program with the runtime's profiler on, in this (fresh) process


def _inputs(name: str, size: str) -> tuple[Any, ...]:
    from testbed.networks import NETWORKS

    return NETWORKS[name](size)[1]


def profile_xnnguard(pte: str, inputs: tuple[Any, ...], runs: int, threads: int) -> dict[str, Any]:
    import torch
    from executorch.devtools import Inspector

    from xnnguard.boundary.runtime import load_module, reset_threadpool

    torch.set_num_threads(threads)
    reset_threadpool(threads)
    module = load_module(pte, etdump=True)
    for _ in range(runs):
        module.forward(inputs)
    with tempfile.TemporaryDirectory(prefix="xnnguard-etdump-") as tmp:
        path = str(Path(tmp) / "profile.etdp")
        module.write_etdump_result_to_file(path)
        if not Path(path).exists():
            raise NoEtdumpError("this ExecuTorch's runtime wrote no ETDump (1.4.x takes enable_etdump and writes "
                                "nothing): per-op profiles of xnnguard's programs need 1.5")
        inspector = Inspector(etdump_path=path)
    events, forward, delegate = [], None, 0.0
    for block in inspector.event_blocks:
        for event in block.events:
            if event.perf_data is None:
                continue
            raw = event.perf_data.raw[1:] or event.perf_data.raw  # the first run pays for warming up
            if event.name == "Method::execute":
                forward = statistics.median(raw)
            elif event.name == "DELEGATE_CALL":
                delegate += statistics.median(raw)
            elif event.name not in FRAME_EVENTS:
                events.append((event.name, statistics.median(raw)))
    return {"forward_ms": forward, "delegate_ms": delegate, "ops": by_type(events), "events": slowest(events)}


def profile_ort(path: str, inputs: tuple[Any, ...], runs: int, threads: int) -> dict[str, Any]:
    from benchmarks.peer_runtimes import ort_feeds, ort_session

    with tempfile.TemporaryDirectory(prefix="xnnguard-ortprof-") as tmp:
        session = ort_session(path, threads, profile_prefix=str(Path(tmp) / "ort"))
        feeds = ort_feeds(session, inputs)
        for _ in range(runs):
            session.run(None, feeds)
        trace = json.loads(Path(session.end_profiling()).read_text())
    return ort_ops(trace)


def ort_ops(trace: list[dict[str, Any]]) -> dict[str, Any]:
    """Per op type, the kernel time of one forward from an ONNX Runtime profile (first run left out)."""
    run_events = sorted((e for e in trace if e.get("name") == "model_run"), key=lambda e: e["ts"])
    counted = run_events[1:] or run_events
    if not counted:
        return {"forward_ms": None, "ops": {}}
    since = counted[0]["ts"]
    per_node: dict[str, list[float]] = defaultdict(list)
    types: dict[str, str] = {}
    for event in trace:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= since:
            node = event["name"].removesuffix("_kernel_time")
            per_node[node].append(event["dur"] / 1e3)
            types[node] = event.get("args", {}).get("op_name", node)
    events = [(types[node], statistics.median(ms)) for node, ms in per_node.items()]
    named = [(f"{node} ({types[node]})", statistics.median(ms)) for node, ms in per_node.items()]
    return {"forward_ms": statistics.median(e["dur"] / 1e3 for e in counted), "ops": by_type(events),
            "events": slowest(named)}


def profile_litert(path: str, inputs: tuple[Any, ...], runs: int, threads: int) -> dict[str, Any]:
    from benchmarks.peer_runtimes import _litert_interpreter, _run_litert

    interpreter = _litert_interpreter(path, threads)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        _run_litert(interpreter, inputs)
        times.append((time.perf_counter() - started) * 1e3)
    counts: dict[str, int] = defaultdict(int)
    for op in interpreter._get_ops_details():
        counts[op["op_name"]] += 1
    return {"forward_ms": statistics.median(times[1:] or times),
            "ops": {name: (n, None) for name, n in counts.items()},
            "note": "LiteRT's Python API reaches no op profiler: the graph's op types and counts only"}


# ---------------------------------------------------------------------------------------------------------
# Printing and the driver


def table(profile: dict[str, Any], top: int) -> str:
    """The op types by time (or by count where there are no times), with calls and share of the forward."""
    from benchmarks.bench_peers import render_table

    forward = profile.get("forward_ms")
    ops = profile["ops"]
    timed = all(ms is not None for _, ms in ops.values())
    ordered = sorted(ops.items(), key=lambda item: -(item[1][1] if timed else item[1][0]))
    lines = []
    for name, (calls, ms) in ordered[:top]:
        share = f"{ms / forward:.1%}" if timed and forward else "-"
        lines.append((name, str(calls), "-" if ms is None else f"{ms:.3f}", share))
    rest = ordered[top:]
    if rest:
        rest_ms = sum(ms or 0.0 for _, (_, ms) in rest) if timed else None
        lines.append((f"({len(rest)} more types)", str(sum(calls for _, (calls, _) in rest)),
                      "-" if rest_ms is None else f"{rest_ms:.3f}",
                      f"{rest_ms / forward:.1%}" if rest_ms is not None and forward else "-"))
    summed = sum(ms for _, ms in ops.values()) if timed else None
    lines.append(("all ops (sum)", str(sum(calls for calls, _ in ops.values())),
                  "-" if summed is None else f"{summed:.3f}",
                  f"{summed / forward:.1%}" if summed is not None and forward else "-"))
    if profile.get("delegate_ms"):  # the delegates' calls whole: their operators and XNNPACK's work between them
        delegate = profile["delegate_ms"]
        lines.append(("XNNPACK delegate calls", "", f"{delegate:.3f}", f"{delegate / forward:.1%}" if forward else "-"))
    lines.append(("forward", "", "-" if forward is None else f"{forward:.3f}", ""))
    return render_table(("op type", "calls / forward", "ms / forward", "share"), lines)


def main(argv: list[str]) -> int:
    from testbed.networks import NETWORKS, SIZES

    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_ops", description=__doc__.splitlines()[0])
    parser.add_argument("name", metavar="NAME", choices=list(NETWORKS))
    parser.add_argument("--runtime", choices=RUNTIMES, default="xnnguard")
    parser.add_argument("--size", choices=SIZES, default="bench")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--artifact", help="the converted program (default: convert now)")
    parser.add_argument("--litert-python", help="the interpreter of LiteRT's venv (default: .venv-litert)")
    parser.add_argument("--events", type=int, default=0, help="also list this many slowest single ops")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        profile = {"xnnguard": profile_xnnguard, "xnnguard-int8": profile_xnnguard, "ort": profile_ort,
                   "ort-int8": profile_ort, "litert": profile_litert}[args.runtime]
        found = profile(args.artifact, _inputs(args.name, args.size), args.runs, args.threads)
        if args.runtime == "xnnguard-int8":
            found["float_share"] = float_share(found["ops"], node_precisions(args.artifact))
        print(json.dumps(found))
        return 0
    from benchmarks.bench_peers import convert, litert_python, python_for
    from benchmarks.timing import run_in_fresh_process

    litert = litert_python(args.litert_python)
    with tempfile.TemporaryDirectory(prefix="xnnguard-profile-") as tmp:
        artifact = args.artifact
        if artifact is None:
            print(f"converting {args.name} for {args.runtime} ...", file=sys.stderr, flush=True)
            cell = convert(args.runtime, args.name, args.size, Path(tmp), litert)
            if cell.artifact is None:
                print(f"{args.name} / {args.runtime}: {cell.status}: {cell.error}", file=sys.stderr)
                return 1
            artifact = cell.artifact
        try:
            profile = run_in_fresh_process(
                "benchmarks.profile_ops", [args.name, "--runtime", args.runtime, "--size", args.size, "--threads",
                                           str(args.threads), "--runs", str(args.runs), "--artifact", artifact,
                                           "--worker"],
                f"profiling {args.name} on {args.runtime}", python=python_for(args.runtime, litert),
                threads=args.threads)
        except RuntimeError as error:
            print(str(error), file=sys.stderr)
            return 1
    print(f"{args.name} ({args.size}) on {args.runtime}, {args.threads} threads, {args.runs} runs"
          + (f"; {profile['note']}" if "note" in profile else ""))
    print(table(profile, args.top))
    if profile.get("float_share") and profile.get("forward_ms"):
        share, forward = profile["float_share"], profile["forward_ms"]
        ops = ", ".join(f"{name} {ms:.3f}" for name, ms in list(share["float_ops"].items())[:8])
        print(f"\nin float: {share['float_ms']:.3f} ms ({share['float_ms'] / forward:.0%}): {ops or 'nothing'}; "
              f"conversions: {share['conversions_ms']:.3f} ms ({share['conversions_ms'] / forward:.0%})")
    if args.events and profile.get("events"):
        print(f"\nslowest {args.events} single ops (ms / forward):")
        for name, ms in profile["events"][:args.events]:
            print(f"  {ms:9.3f}  {name}")
    if args.json:
        args.json.write_text(json.dumps(profile, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
