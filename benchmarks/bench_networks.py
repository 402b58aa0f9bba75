"""Whole networks on XNNPACK: delegates, ops left outside, eager vs ExecuTorch, against the issue-12 targets.

Every network of ``testbed.networks`` at its bench size goes through xnnguard's flow
(``rewrite_for_xnnpack``, for int8 ``xnnguard.XNNPACKQuantizer``, ``xnnguard.XnnpackPartitioner``), each
lowering in a fresh process of its own (``benchmarks.network_report``), in seven variants: float, static and
dynamic int8, each at a static batch and exported with a dynamic batch, and float exported with a dynamic
frame count (``testbed.network_flow.dynamic_frames``). Float is timed against eager
PyTorch, both sides in fresh processes with the same thread count and environment (``benchmarks.timing``,
the protocol of ``bench_rewrite_conv3d``). Targets:

* float: every network at least ``MIN_RATIO`` times faster than eager, the median at least ``MEDIAN_RATIO`` times;
* at most ``MAX_DELEGATES`` XNNPACK delegates per network, and no compute op outside them;
* static and dynamic int8, a dynamic batch, and (video networks) a dynamic frame count: as many delegates
  as float. The dynamic-frames cell also has the program's ms at the example's frames and at twice as
  many, beside the static float program's ``ET ms``.

Each float row also has its ceiling (``benchmarks.gemm_floor``): eager ms over XNNPACK's time for the
network's convolutions and matmuls alone, the most any lowering can reach with XNNPACK's kernels; a
missed speed target is printed with it. A miss is printed as such (``main`` returns False); the
per-network details say what stayed outside and why (the rewriter's and the partitioner's reports).
``python -m benchmarks.bench_networks [NAME...]`` runs some networks only; ``--variant`` picks variants.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.gemm_floor import heavy_ops_ms
from benchmarks.network_report import details, lower_in_fresh_process, time_network
from testbed.network_flow import MAX_DELEGATES, Result, compute_outside

MIN_RATIO = 1.5
MEDIAN_RATIO = 4.0
# A ceiling down to this fraction of its network's ratio is that network at its floor: the whole program
# and its heavy ops alone are timed in different processes (bench size, one run: within 2-6 %).
AT_FLOOR = 0.9

VARIANTS = {  # name: (precision, batch)
    "float": ("float", "static"),
    "static": ("static", "static"),
    "dynamic": ("dynamic", "static"),
    "float-dyn-batch": ("float", "dynamic"),
    "static-dyn-batch": ("static", "dynamic"),
    "dynamic-dyn-batch": ("dynamic", "dynamic"),
    "float-dyn-frames": ("float", "frames"),
}
# The networks the targets are about: one per kind the issue names (duplicates of a kind are reported,
# not counted twice in the median).
COUNTED = ("mvit", "s3d", "r2plus1d", "swin3d", "unet3d", "unet3d_gn", "video_vae", "videomae", "hiera",
           "qwen_vision")


@dataclass
class Row:
    network: str
    results: dict[str, Result]

    heavy_ms: float | None = None  # ExecuTorch ms of the network's convs and matmuls alone (gemm_floor)

    def ratio(self) -> float | None:
        r = self.results.get("float")
        return r.eager_ms / r.et_ms if r and r.eager_ms and r.et_ms else None

    def ceiling(self) -> float | None:
        """Eager ms over the heavy ops' ExecuTorch ms: the most any lowering can reach with XNNPACK's kernels."""
        r = self.results.get("float")
        return r.eager_ms / self.heavy_ms if r and r.eager_ms and self.heavy_ms else None


def _cell(result: Result | None) -> str:
    if result is None:
        return "-"
    if result.status != "ok":
        return result.status
    cell = f"{result.delegates} / {compute_outside(result)}"
    if result.batch == "frames" and result.et_ms:  # ms at the example's frames, and at twice as many
        cell += f", {result.et_ms:.1f} ms" + (f", {result.long_et_ms:.1f} @{result.long_frames}f"
                                                if result.long_et_ms else ", -")
    return cell


def misses(rows: list[Row]) -> list[str]:
    """Each target a row misses, in words."""
    found = []
    ratios = [ratio for row in rows if row.network in COUNTED and (ratio := row.ratio()) is not None]
    for row in rows:
        base = row.results.get("float")
        ratio = row.ratio()
        if ratio is not None and ratio < MIN_RATIO:
            found.append(f"{row.network}: eager/ET {ratio:.2f} < {MIN_RATIO}" + _bound(row.ceiling(), MIN_RATIO))
        for variant, result in row.results.items():
            if result.status == "n/a":  # dynamic frames of a network without frames
                continue
            if result.status != "ok":
                found.append(f"{row.network} [{variant}]: {result.status}")
                continue
            if result.delegates is not None and result.delegates > MAX_DELEGATES:
                found.append(f"{row.network} [{variant}]: {result.delegates} delegates > {MAX_DELEGATES}")
            outside = compute_outside(result)
            if outside:
                found.append(f"{row.network} [{variant}]: {outside} compute ops outside XNNPACK")
            if variant != "float" and base and base.status == "ok" and result.delegates != base.delegates:
                found.append(f"{row.network} [{variant}]: {result.delegates} delegates, float has {base.delegates}")
    if ratios and statistics.median(ratios) < MEDIAN_RATIO:
        found.append(f"median eager/ET {statistics.median(ratios):.2f} < {MEDIAN_RATIO}" + _median_bound(rows))
    return found


def _median_bound(rows: list[Row]) -> str:
    """What the ceilings say about a missed median: the median of the networks' ceilings bounds it.

    The median grows with each network's ratio, so no lowering reaches a median above the median of
    the networks' ceilings, if each is a bound. A ceiling timed a little below its network's own ratio
    (within ``AT_FLOOR``) says that network already runs at the speed of its convs and matmuls alone:
    it counts at its ratio, and is named. One further below is no measurement of a bound: then nothing
    is concluded.
    """
    counted = [row for row in rows if row.network in COUNTED and row.ratio() is not None]
    bounds, at_floor, unbounded = [], [], []
    for row in counted:
        ratio, ceiling = row.ratio() or 0.0, row.ceiling()
        if ceiling is None or ceiling < AT_FLOOR * ratio:
            unbounded.append(row.network)
            continue
        if ceiling < ratio:
            at_floor.append(row.network)
        bounds.append(max(ceiling, ratio))
    if unbounded:
        return f" (no bound: the ceiling of {', '.join(unbounded)} is missing or far below its ratio)"
    text = _bound(statistics.median(bounds), MEDIAN_RATIO)
    if at_floor:
        text = text[:-1] + f"; at their ratio, as at their floor: {', '.join(at_floor)})"
    return text


def _bound(ceiling: float | None, target: float) -> str:
    """What the floor says about a missed speed target."""
    if ceiling is None:
        return ""
    return (f" (ceiling {ceiling:.2f}: XNNPACK's convs and matmuls alone take that long, "
            f"{'so the target is out of reach with its kernels' if ceiling < target else 'room is left'})")


def table(rows: list[Row], variants: list[str]) -> str:
    header = ("network", *(f"{v} (deleg / outside)" for v in variants), "eager ms", "ET ms", "eager/ET",
              "heavy ops ET ms", "ceiling")
    lines = []
    for row in rows:
        base = row.results.get("float")
        ratio = row.ratio()
        lines.append((row.network, *(_cell(row.results.get(v)) for v in variants),
                      f"{base.eager_ms:.1f}" if base and base.eager_ms else "-",
                      f"{base.et_ms:.1f}" if base and base.et_ms else "-",
                      f"{ratio:.2f}" if ratio else "-",
                      f"{row.heavy_ms:.1f}" if row.heavy_ms else "-",
                      f"{ceiling:.2f}" if (ceiling := row.ceiling()) else "-"))
    widths = [max(len(str(line[i])) for line in (header, *lines)) for i in range(len(header))]
    out = [" | ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in (header, *lines)]
    out.insert(1, "-|-".join("-" * w for w in widths))
    return "\n".join(out)


def main(names: list[str] | None = None, variants: list[str] | None = None, threads: int | None = None) -> bool:
    """Lower, run and time the networks; print the table, the details and the misses. True: every target met."""
    from testbed.networks import NETWORKS

    threads = threads or int(os.environ.get("XNNGUARD_BENCH_THREADS", min(2, os.cpu_count() or 1)))
    variants = variants or list(VARIANTS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="xnnguard-networks-") as tmp:
        for name in names or list(NETWORKS):
            results = {}
            for variant in variants:
                precision, batch = VARIANTS[variant]
                print(f"{name} [{variant}] ...", file=sys.stderr, flush=True)
                result = lower_in_fresh_process(name, "bench", precision, False, Path(tmp), batch)
                if variant in ("float", "float-dyn-frames"):
                    time_network(result, threads)
                results[variant] = result
            row = Row(name, results)
            if "float" in results and results["float"].status == "ok":
                row.heavy_ms = heavy_ops_ms(name, threads, Path(tmp))
            rows.append(row)
    print(f"Whole networks, xnnguard flow, bench size, {threads} threads; each cell: XNNPACK delegates / compute "
          f"ops outside them; eager/ET of float (target >= {MIN_RATIO} each, median >= {MEDIAN_RATIO})")
    print(table(rows, variants))
    print()
    print(details([result for row in rows for result in row.results.values()]))
    found = misses(rows)
    print("\nmisses:" if found else "\nevery target met")
    for line in found:
        print(f"  {line}")
    return not found


if __name__ == "__main__":
    from testbed.networks import NETWORKS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"networks (default: all): {', '.join(NETWORKS)}")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS))
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if unknown := [name for name in args.names if name not in NETWORKS]:
        parser.error(f"unknown network(s) {', '.join(unknown)}; there are: {', '.join(NETWORKS)}")
    sys.exit(0 if main(args.names or None, args.variant, args.threads) else 1)
