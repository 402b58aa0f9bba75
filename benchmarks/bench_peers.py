"""xnnguard's programs against the runtimes users pick between: eager PyTorch, ONNX Runtime and LiteRT.

Every network of ``testbed.networks`` (or those named) at one size is converted for each runtime
(``benchmarks.peer_runtimes``: xnnguard float and static int8 through ``testbed.network_flow.lower_network``,
ONNX Runtime float and QDQ int8, LiteRT with its XNNPACK delegate), each conversion in a fresh process;
one that fails is a table entry with its first error line. Then every runtime takes turns
(``benchmarks.timing``: a fresh process per turn, ~0.5 s of back-to-back forwards, the first tenth not
counted, the order rotated each round, ``OMP_WAIT_POLICY=PASSIVE``, raised malloc thresholds, the
same thread count everywhere); a runtime's figure is the median of its turns. Beside the ms: each
network's multiply-adds (``testbed.macs``), the GFLOP/s each runtime reaches, and the machine's
measured peak (``benchmarks.peak_gemm``: one large fp32 and int8 GEMM through XNNPACK, ONNX Runtime and
torch).

``python -m benchmarks.bench_peers [NAME...] [--size bench|full|test] [--threads 2] [--rounds 3]
[--runtime R]... [--json PATH] [--keep DIR [--reuse]] [--no-peak] [--render JSON]``; ``make bench`` runs it
at bench size (``XNNGUARD_PEERS_SIZE=full`` for the published sizes: long). LiteRT runs in the interpreter
``--litert-python`` names (default ``$XNNGUARD_LITERT_PYTHON``, else ``.venv-litert/bin/python``, which
``make bench`` builds); ONNX Runtime in this one (the ``bench`` extra). A runtime that is not installed
is a table entry saying so. No targets: the table is the figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.peer_runtimes import FLOAT_RUNTIMES, LABELS, PEERS, RUNTIMES, first_error_line
from benchmarks.timing import REPO, TURN_S, run_in_fresh_process, turn_order
from testbed.macs import gflops

ROUNDS = 3
CONVERT_TIMEOUT_S = 3600
TURN_TIMEOUT_S = 1800


@dataclass
class Cell:
    """One runtime on one network: its conversion, its error against eager, its turns."""

    runtime: str
    status: str = "ok"  # "ok", "failed" (conversion or run), "mismatch" (xnnguard's own verdict), "skipped"
    error: str = ""  # the first error line of what failed
    artifact: str | None = None
    max_err: float | None = None  # max abs error over eager's max abs output
    convert_s: float | None = None
    turns_ms: list[float] = field(default_factory=list)
    delegates: int | None = None  # xnnguard only
    outside: int | None = None  # xnnguard only: compute ops outside the delegates

    @property
    def ms(self) -> float | None:
        return statistics.median(self.turns_ms) if self.turns_ms else None

    @property
    def timed(self) -> bool:
        return self.status in ("ok", "mismatch") and self.artifact is not None


@dataclass
class Row:
    network: str
    size: str
    macs: float | None
    cells: dict[str, Cell]

    def ms(self, runtime: str) -> float | None:
        cell = self.cells.get(runtime)
        return cell.ms if cell else None

    def best_peer(self, runtimes: tuple[str, ...] = PEERS) -> str | None:
        """The fastest peer runtime that ran (float and int8 alike), or None."""
        timed = [(ms, runtime) for runtime in runtimes if (ms := self.ms(runtime)) is not None]
        return min(timed)[1] if timed else None


@dataclass
class Machine:
    date: str
    cpu: str
    cores: int
    threads: int
    versions: dict[str, str]


def failed(runtime: str, error: str, status: str = "failed") -> Cell:
    """A cell for a runtime that could not be converted or run: its first error line."""
    return Cell(runtime, status=status, error=first_error_line(error) if "\n" in error else error[:300])


# ---------------------------------------------------------------------------------------------------------
# Converting


def litert_python(given: str | None = None) -> str | None:
    """The interpreter that has LiteRT: ``given``, ``$XNNGUARD_LITERT_PYTHON``, or the repo's .venv-litert."""
    for candidate in (given, os.environ.get("XNNGUARD_LITERT_PYTHON"), str(REPO / ".venv-litert/bin/python")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def python_for(runtime: str, litert: str | None) -> str | None:
    return litert if runtime == "litert" else sys.executable


def _missing_runtime(runtime: str, litert: str | None) -> str | None:
    """Why ``runtime`` cannot run here, or None."""
    if runtime == "litert" and litert is None:
        return "LiteRT is not installed: `make .venv-litert/.litert-installed` (or --litert-python)"
    if runtime.startswith("ort"):
        import importlib.util

        if importlib.util.find_spec("onnxruntime") is None:
            return "onnxruntime is not installed: pip install -e '.[bench]'"
    return None


def convert(runtime: str, name: str, size: str, directory: Path, litert: str | None) -> Cell:
    """Convert ``name`` for ``runtime`` in a fresh process; a failure is the cell's first error line."""
    if runtime == "eager":
        return Cell(runtime, artifact="", max_err=0.0)
    if missing := _missing_runtime(runtime, litert):
        return failed(runtime, missing, "skipped")
    if runtime.startswith("xnnguard"):
        return _convert_xnnguard(runtime, name, size, directory)
    try:
        made = run_in_fresh_process("benchmarks.peer_runtimes",
                                    ["--convert", runtime, "--network", name, "--size", size, "--out-dir",
                                     str(directory)], f"{LABELS[runtime]} conversion of {name}",
                                    python=python_for(runtime, litert), timeout=CONVERT_TIMEOUT_S)
    except RuntimeError as error:
        return failed(runtime, str(error))
    if "error" in made:
        return failed(runtime, made["error"])
    return Cell(runtime, artifact=made["artifact"], max_err=made["max_err"], convert_s=made["convert_s"])


def reused(runtime: str, name: str, size: str, directory: Path) -> Cell | None:
    """The program an earlier run kept in ``directory`` (``--keep``) for ``runtime``, or None.

    For repeating the timing of a few networks without converting them again; the error against eager
    is then known for xnnguard's programs only (their lowering's record is kept beside them).
    """
    if runtime == "eager":
        return None
    if runtime.startswith("xnnguard"):
        from testbed.network_flow import Result

        record = directory / f"{name}.{size}.{_precision(runtime)}.static.json"
        if not record.exists():
            return None
        data = json.loads(record.read_text())
        data["outside_kinds"] = [tuple(kind) for kind in data["outside_kinds"]]
        return _xnnguard_cell(runtime, Result(**data))
    artifact = directory / {"ort": f"{name}.{size}.onnx", "ort-int8": f"{name}.{size}.int8.onnx",
                            "litert": f"{name}.{size}.tflite"}[runtime]
    return Cell(runtime, artifact=str(artifact)) if artifact.exists() else None


def _precision(runtime: str) -> str:
    return "static" if runtime.endswith("int8") else "float"


def _convert_xnnguard(runtime: str, name: str, size: str, directory: Path) -> Cell:
    from benchmarks.network_report import lower_in_fresh_process

    return _xnnguard_cell(runtime, lower_in_fresh_process(name, size, _precision(runtime), False, directory))


def _xnnguard_cell(runtime: str, result: Any) -> Cell:
    from testbed.network_flow import compute_outside

    precision = _precision(runtime)
    if result.status not in ("ok", "mismatch") or not result.pte:
        return failed(runtime, f"{result.status}: {result.error}")
    # float: against eager; int8: against float eager too, as for the ONNX Runtime int8 program
    max_err = result.max_err if precision == "float" else result.float_err
    return Cell(runtime, status=result.status, error=result.error.splitlines()[0] if result.error else "",
                artifact=result.pte, max_err=max_err, convert_s=result.lower_s, delegates=result.delegates,
                outside=compute_outside(result))


# ---------------------------------------------------------------------------------------------------------
# Timing


def take_turns(row: Row, threads: int, rounds: int, turn_s: float, litert: str | None) -> None:
    """Every timed cell of ``row`` takes ``rounds`` turns, each in a fresh process, in rotating order."""
    sides = [runtime for runtime, cell in row.cells.items() if cell.timed]
    for runtime in turn_order(sides, rounds):
        cell = row.cells[runtime]
        if not cell.timed:  # a turn failed before
            continue
        args = ["--time", runtime, "--network", row.network, "--size", row.size, "--threads", str(threads),
                "--turn-s", str(turn_s)]
        if cell.artifact:
            args += ["--artifact", cell.artifact]
        print(f"  {row.network}: a turn of {LABELS[runtime]}", file=sys.stderr, flush=True)
        try:
            turn = run_in_fresh_process("benchmarks.peer_runtimes", args, f"a {LABELS[runtime]} turn on {row.network}",
                                        python=python_for(runtime, litert), timeout=TURN_TIMEOUT_S, threads=threads)
        except RuntimeError as error:
            cell.status, cell.error, cell.turns_ms = "failed", f"run: {first_error_line(str(error))}", []
            continue
        cell.turns_ms.append(float(turn["ms"]))


# ---------------------------------------------------------------------------------------------------------
# Printing


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _ms_cell(cell: Cell | None) -> str:
    if cell is None:
        return "-"
    if cell.ms is None:
        return cell.status
    return f"{cell.ms:.1f}" + ("*" if cell.status == "mismatch" else "")


def render_table(header: tuple[str, ...], lines: list[tuple[str, ...]]) -> str:
    """A markdown table, columns padded to their widest cell."""
    widths = [max(len(str(line[i])) for line in (header, *lines)) for i in range(len(header))]
    out = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(line, widths)) + " |" for line in (header, *lines)]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def ms_table(rows: list[Row], runtimes: tuple[str, ...]) -> str:
    """ms per runtime and network, and xnnguard's float program over the fastest float peer."""
    header = ("network", "GMAC", *(f"{LABELS[r]} ms" for r in runtimes), "fastest float peer ÷ xnnguard")
    lines = []
    for row in rows:
        best = row.best_peer(tuple(r for r in ("ort", "litert") if r in runtimes))
        ours, theirs = row.ms("xnnguard"), row.ms(best) if best else None
        ratio = f"{theirs / ours:.2f} ({LABELS[best]})" if best and ours and theirs else "-"
        lines.append((row.network, _num(row.macs and row.macs / 1e9, ".3g"),
                      *(_ms_cell(row.cells.get(r)) for r in runtimes), ratio))
    return render_table(header, lines)


def gflops_table(rows: list[Row], runtimes: tuple[str, ...], peaks: dict[str, dict[str, Any]]) -> str:
    """GFLOP/s per runtime and network; float runtimes also as a share of the fp32 GEMM peak."""
    peak = max((float(p["gflops"]) for side, p in peaks.items() if side.endswith("f32") and "gflops" in p),
               default=None)
    header = ("network", *(f"{LABELS[r]}" for r in runtimes))
    lines = []
    for row in rows:
        cells = []
        for runtime in runtimes:
            rate = gflops(row.macs, row.ms(runtime))
            share = f" ({rate / peak:.0%})" if rate and peak and runtime in FLOAT_RUNTIMES else ""
            cells.append(_num(rate, ".1f") + share)
        lines.append((row.network, *cells))
    return render_table(header, lines)


def programs_table(rows: list[Row]) -> str:
    """Delegates and compute ops outside them, per xnnguard program; every conversion's error against eager."""
    header = ("network", "xnnguard: delegates / outside", "xnnguard int8: delegates / outside",
              *(f"{LABELS[r]} err" for r in RUNTIMES if r != "eager"))
    lines = []
    for row in rows:
        programs = []
        for runtime in ("xnnguard", "xnnguard-int8"):
            cell = row.cells.get(runtime)
            programs.append(f"{cell.delegates} / {cell.outside}" if cell and cell.delegates is not None else "-")
        errors = [_num(cell.max_err, ".1e") if (cell := row.cells.get(r)) else "-" for r in RUNTIMES if r != "eager"]
        lines.append((row.network, *programs, *errors))
    return render_table(header, lines)


def failures(rows: list[Row]) -> list[str]:
    """Every cell that did not run, with its first error line."""
    return [f"{row.network} / {LABELS[runtime]}: {cell.status}: {cell.error}"
            for row in rows for runtime, cell in row.cells.items() if cell.status not in ("ok",) and cell.error]


def peaks_text(peaks: dict[str, dict[str, Any]]) -> str:
    from benchmarks.peak_gemm import K, M, N

    if not peaks:
        return "machine peak: not measured in this run (python -m benchmarks.peak_gemm)"
    parts = [f"{side} {p['gflops']:.1f}" if "gflops" in p else f"{side} failed ({p['error']})"
             for side, p in peaks.items()]
    return f"machine peak, one {M}x{K} by {K}x{N} GEMM, GFLOP/s (GOP/s for int8): " + ", ".join(parts)


def report(rows: list[Row], runtimes: tuple[str, ...], peaks: dict[str, dict[str, Any]], machine: Machine,
           size: str, rounds: int, turn_s: float) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in machine.versions.items())
    lines = [f"Peers, {size} size, {machine.date}, {machine.cpu}, {machine.cores} cores, {machine.threads} threads "
             f"everywhere; median of {rounds} turns of {turn_s:g} s each, fresh processes ({versions})",
             "", ms_table(rows, runtimes), "",
             "GFLOP/s (2 x the multiply-adds FlopCounterMode counts, over the ms; float: % of the fp32 GEMM peak)",
             "", gflops_table(rows, runtimes, peaks), "", peaks_text(peaks), "",
             "What each program is: xnnguard's delegates / compute ops outside them, and each runtime's max abs "
             "error over eager's max abs output (int8: against float eager)", "", programs_table(rows)]
    if any(cell.status == "mismatch" for row in rows for cell in row.cells.values()):
        lines += ["", "* the program does not match its reference by network_report's verdict"]
    if found := failures(rows):
        lines += ["", "not run:", *(f"  {line}" for line in found)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# The run


def machine_info(threads: int, litert: str | None) -> Machine:
    from importlib.metadata import PackageNotFoundError, version

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for package in ("torch", "executorch", "onnxruntime", "onnxscript"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "not installed"
    if litert:
        try:
            versions |= run_in_fresh_process("benchmarks.peer_runtimes", ["--versions"], "LiteRT's versions",
                                             python=litert, timeout=120)
        except RuntimeError:
            versions["litert-torch"] = "unreadable"
    return Machine(datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), cpu, os.cpu_count() or 0, threads, versions)


def load_json(path: Path) -> tuple[list[Row], dict[str, dict[str, Any]], Machine, dict[str, Any]]:
    """The rows, peaks, machine and settings a ``--json`` file holds (a run that stopped has no peaks)."""
    data = json.loads(path.read_text())
    rows = [Row(row["network"], row["size"], row["macs"],
                {runtime: Cell(**cell) for runtime, cell in row["cells"].items()}) for row in data["rows"]]
    settings = {key: data[key] for key in ("size", "rounds", "turn_s")}
    return rows, data.get("peaks") or {}, Machine(**data["machine"]), settings


def run(names: list[str], size: str, runtimes: tuple[str, ...], threads: int, rounds: int, turn_s: float,
        litert: str | None, directory: Path, done: Callable[[list[Row]], None] = lambda rows: None,
        reuse: bool = False, peak: bool = True) -> tuple[list[Row], dict[str, dict[str, Any]]]:
    """Convert and time every network, then the machine's peak; ``done`` sees the rows after each network."""
    from benchmarks.peak_gemm import measure
    from testbed.macs import count_macs

    rows = []
    for name in names:
        print(f"{name} ({size}): converting for {', '.join(runtimes)}", file=sys.stderr, flush=True)
        try:
            macs: float | None = count_macs(name, size)
        except Exception as error:  # a network the meta device cannot run: no GFLOP/s, still timed
            print(f"  {name}: multiply-adds not counted: {error}", file=sys.stderr)
            macs = None
        row = Row(name, size, macs, {runtime: (reuse and reused(runtime, name, size, directory))
                                     or convert(runtime, name, size, directory, litert) for runtime in runtimes})
        take_turns(row, threads, rounds, turn_s, litert)
        rows.append(row)
        print(f"  {name}: " + ", ".join(f"{LABELS[r]} {_ms_cell(c)}" for r, c in row.cells.items()), file=sys.stderr,
              flush=True)
        done(rows)
    if not peak:
        return rows, {}
    print("the machine's peak GEMM", file=sys.stderr, flush=True)
    return rows, measure(directory, threads, rounds, turn_s)


def main(argv: list[str] | None = None) -> None:
    """Convert, time and print the peer table (``make bench``: bench size, or ``$XNNGUARD_PEERS_SIZE``)."""
    from testbed.networks import NETWORKS, SIZES

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_peers", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"networks (default: all): {', '.join(NETWORKS)}")
    parser.add_argument("--size", choices=SIZES, default=os.environ.get("XNNGUARD_PEERS_SIZE", "bench"))
    parser.add_argument("--threads", type=int, default=int(os.environ.get("XNNGUARD_BENCH_THREADS", 2)))
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="turns per runtime and network")
    parser.add_argument("--turn-s", type=float, default=TURN_S, help="seconds a turn lasts")
    parser.add_argument("--runtime", action="append", choices=RUNTIMES, help="only these (repeat); default: all")
    parser.add_argument("--litert-python", help="the interpreter of LiteRT's venv (default: .venv-litert)")
    parser.add_argument("--json", type=Path, help="also write every figure as JSON here")
    parser.add_argument("--keep", type=Path, help="keep the converted programs in this folder")
    parser.add_argument("--reuse", action="store_true", help="time the programs --keep holds from an earlier run")
    parser.add_argument("--no-peak", action="store_true", help="leave out the machine's peak GEMM")
    parser.add_argument("--render", type=Path, metavar="JSON", help="print the report a --json file holds, and stop")
    args = parser.parse_args([] if argv is None else argv)
    if args.render:
        rows, peaks, machine, settings = load_json(args.render)
        present = tuple(r for r in RUNTIMES if any(r in row.cells for row in rows))
        print(report(rows, present, peaks, machine, settings["size"], settings["rounds"], settings["turn_s"]))
        return
    if unknown := [name for name in args.names if name not in NETWORKS]:
        parser.error(f"unknown network(s) {', '.join(unknown)}; there are: {', '.join(NETWORKS)}")
    if args.reuse and not args.keep:
        parser.error("--reuse times what --keep DIR holds: name the folder")
    if args.size not in SIZES:
        parser.error(f"unknown size {args.size!r} (XNNGUARD_PEERS_SIZE?); the sizes are {', '.join(SIZES)}")
    runtimes = tuple(r for r in RUNTIMES if r in (args.runtime or RUNTIMES))
    litert = litert_python(args.litert_python)
    with tempfile.TemporaryDirectory(prefix="xnnguard-peers-") as tmp:
        directory = args.keep or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        machine = machine_info(args.threads, litert if "litert" in runtimes else None)
        def write_json(rows: list[Row], peaks: dict[str, dict[str, Any]] | None = None) -> None:
            if args.json:  # after every network too: a long run that stops keeps what it measured
                args.json.write_text(json.dumps({"machine": asdict(machine), "size": args.size, "rounds": args.rounds,
                                                 "turn_s": args.turn_s, "peaks": peaks,
                                                 "rows": [{**asdict(row), "ms": {r: row.ms(r) for r in row.cells}}
                                                          for row in rows]}, indent=1))

        rows, peaks = run(args.names or list(NETWORKS), args.size, runtimes, args.threads, args.rounds, args.turn_s,
                          litert, directory, write_json, args.reuse, not args.no_peak)
        write_json(rows, peaks)
    print(report(rows, runtimes, peaks, machine, args.size, args.rounds, args.turn_s))
    print("\nTaken on whatever machine ran this: on a shared one, other processes' load moves every figure.")


if __name__ == "__main__":
    main(sys.argv[1:])
