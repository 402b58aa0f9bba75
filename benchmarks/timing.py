"""The timing protocol the benchmarks share: each side timed in its own fresh process, same environment.

Why a fresh process per side and this environment is explained, with the measurements behind it, in
``benchmarks/bench_rewrite_conv3d.py``'s docstring: in one shared process torch's spinning OpenMP threads
take the second core from XNNPACK's worker (``OMP_WAIT_POLICY=PASSIVE``), and glibc returning oneDNN's
scratch buffers to the kernel on every free makes a fresh eager process pay page faults on every call
(raised ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``).

A worker is a module run as ``python -m MODULE ARGS...`` that prints ``{"ms": ...}`` as its last line.
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

REPEATS = 7
INNER = 5
WARMUP = 2

ENVIRONMENT = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "MALLOC_MMAP_THRESHOLD_": str(1 << 30),  # both, or glibc keeps returning the scratch to the kernel
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
}

REPO = Path(__file__).resolve().parent.parent


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
    command = [sys.executable, "-m", module, *args]
    done = subprocess.run(command, env={**os.environ, **ENVIRONMENT}, capture_output=True, text=True,
                          check=False, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["ms"])


def print_ms(ms: float) -> None:
    """What a worker prints last, for ``time_in_fresh_process``."""
    print(json.dumps({"ms": ms}))
