"""The timing protocol the benchmarks share: each side timed in its own fresh process, same environment.

Why a fresh process per side and this environment is explained, with the measurements behind it, in
``benchmarks/bench_rewrite_conv3d.py``'s docstring: in one shared process torch's spinning OpenMP threads
take the second core from XNNPACK's worker (``OMP_WAIT_POLICY=PASSIVE``), and glibc returning oneDNN's
scratch buffers to the kernel on every free makes a fresh eager process pay page faults on every call
(raised ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``).

A worker is a module run as ``python -m MODULE ARGS...`` that prints ``{"ms": ...}`` as its last line.

Turns (``take_turn``, ``turn_ms``, ``turn_order``), for comparing several runtimes in one run: each side
in a fresh process of its own calls its program back to back for about ``TURN_S`` seconds, and the
calls that start in the turn's first ``WARM_FRACTION`` do not count. A runtime pays on its first
forwards (weight packing, primitive creation, page faults, a thread pool whose threads went to sleep
while another process had the cores), and a sample of a few calls would count that; a long turn
amortizes the machine's ~4 ms scheduler slices too. Turns of the sides alternate, the order rotated
each round, so that no side always runs first or right after the same neighbour.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPEATS = 7
INNER = 5
WARMUP = 2

ENVIRONMENT = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "MALLOC_MMAP_THRESHOLD_": str(1 << 30),  # both, or glibc keeps returning the scratch to the kernel
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
}

REPO = Path(__file__).resolve().parent.parent

TURN_S = 0.5
WARM_FRACTION = 0.1  # of a turn's time: the calls that start in it are not counted
MIN_CALLS = 3  # a turn makes at least this many calls, so that at least two count


def median_ms(run: Callable[[], object], repeats: int = REPEATS, inner: int = INNER) -> float:
    """Median over ``repeats`` samples of the mean time of ``inner`` back-to-back runs, in ms.

    A sample spans several runs because this machine's scheduler hands out CPU in ~4 ms slices.
    """
    for _ in range(WARMUP):
        run()  # warm-up: first-run allocations, XNNPACK weight packing, oneDNN primitive creation
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            run()
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times) * 1e3


def time_in_fresh_process(module: str, args: Sequence[str], what: str = "worker") -> float:
    """Run ``python -m module *args`` in ``ENVIRONMENT`` and return the ``ms`` its last stdout line reports."""
    return float(run_in_fresh_process(module, args, what)["ms"])


def run_in_fresh_process(module: str, args: Sequence[str], what: str = "worker", python: str | None = None,
                         timeout: float | None = None, threads: int | None = None) -> dict[str, Any]:
    """Run ``python -m module *args`` in ``ENVIRONMENT``; the JSON object its last stdout line holds.

    ``python``: another interpreter (a peer runtime's own venv); ``threads``: also cap OpenMP and MKL
    there, for runtimes that size their pools from the environment. A failure, a hang past ``timeout``
    or a last line that is no JSON raises ``RuntimeError`` with the worker's last stderr lines.
    """
    command = [python or sys.executable, "-m", module, *args]
    env = {**os.environ, **ENVIRONMENT, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO),
                                                                                   os.environ.get("PYTHONPATH"))))}
    if threads is not None:
        env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False, cwd=REPO,
                              timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise RuntimeError(f"{what}: no result after {timeout:.0f} s") from error
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError as error:
        raise RuntimeError(f"{what} printed no result: {lines[-1][:200]!r}") from error
    if not isinstance(result, dict):
        raise RuntimeError(f"{what} printed no result: {lines[-1][:200]!r}")
    return result


def print_ms(ms: float) -> None:
    """What a worker prints last, for ``time_in_fresh_process``."""
    print(json.dumps({"ms": ms}))


def take_turn(run: Callable[[], object], seconds: float = TURN_S, min_calls: int = MIN_CALLS,
              clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Call ``run`` back to back for ``seconds`` (at least ``min_calls`` times); each call's duration in s."""
    durations: list[float] = []
    started = clock()
    while True:
        before = clock()
        run()
        after = clock()
        durations.append(after - before)
        if after - started >= seconds and len(durations) >= min_calls:
            return durations


def counted_calls(durations: Sequence[float], warm_fraction: float = WARM_FRACTION) -> list[float]:
    """The calls of a turn that count: those that start after its first ``warm_fraction`` of time.

    The first call always starts at 0, so it never counts when there are more; with one call, it does.
    """
    cutoff = warm_fraction * sum(durations)
    counted, elapsed = [], 0.0
    for duration in durations:
        if elapsed >= cutoff and elapsed > 0:
            counted.append(duration)
        elapsed += duration
    return counted or list(durations[-1:])


def turn_ms(run: Callable[[], object], seconds: float = TURN_S) -> dict[str, float]:
    """One turn in this (fresh) process: the mean ms of its counted calls, and how many counted."""
    counted = counted_calls(take_turn(run, seconds))
    return {"ms": statistics.fmean(counted) * 1e3, "calls": len(counted)}


def turn_order(sides: Sequence[str], rounds: int) -> list[str]:
    """The sides' turns, round after round, each round's order rotated by one from the last."""
    order: list[str] = []
    for index in range(rounds):
        shift = index % len(sides) if sides else 0
        order.extend([*sides[shift:], *sides[:shift]])
    return order
