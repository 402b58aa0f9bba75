"""Conv3d rewritten as Conv2d on XNNPACK against eager PyTorch's conv3d, on R3D-18-sized layers.

Each layer is rewritten (``rewrite_for_xnnpack``, both general forms: depth taps folded into channels,
and per-tap convs summed), lowered with ``xnnguard.XnnpackPartitioner``, loaded with the ExecuTorch
runtime and timed against ``torch.nn.functional.conv3d`` in the same process, with the same thread count
for both (``torch.set_num_threads`` and the runtime's threadpool). Runs alternate so machine noise hits
both alike; the ratio is eager median / ExecuTorch median (> 1: the rewrite is faster). Target: >= 1.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch
from executorch.exir import to_edge_transform_and_lower
from executorch.extension.pybindings import portable_lib

import xnnguard
from xnnguard.passes.rewrite_conv3d import RewriteConv3dPass
from xnnguard.passes.rewrite_for_xnnpack import XnnpackRewriter

TARGET_RATIO = 1.0
REPEATS = 5

# name, Conv3d(in, out, kernel, stride, padding), input shape
LAYERS = [
    ("stem 3->64 k(3,7,7) s(1,2,2)", (3, 64, (3, 7, 7), (1, 2, 2), (1, 3, 3)), (1, 3, 8, 112, 112)),
    ("64->64 k3 p1", (64, 64, 3, 1, 1), (1, 64, 8, 28, 28)),
    ("64->128 k3 s2 p1", (64, 128, 3, 2, 1), (1, 64, 8, 28, 28)),
]


def _median_seconds(run: Callable[[], object], repeats: int = REPEATS, inner: int = 3) -> float:
    """Median over ``repeats`` samples of the mean time of ``inner`` back-to-back runs.

    A sample spans several runs because this machine's scheduler hands out CPU in ~4 ms slices: single
    runs come out as multiples of 4 ms.
    """
    run()  # warm-up: first-run allocations, XNNPACK weight packing
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            run()
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times)


def _lowered_forward(conv: torch.nn.Conv3d, x: torch.Tensor, depth_taps: str) -> Callable[[], object]:
    ep = torch.export.export(conv, (x,))
    ep = XnnpackRewriter([RewriteConv3dPass(depth_taps)])(ep)  # type: ignore[arg-type]
    program = to_edge_transform_and_lower(ep, partitioner=[xnnguard.XnnpackPartitioner()]).to_executorch()
    buffer = program.buffer  # the loaded program reads this memory: keep it alive with the closure below
    module = portable_lib._load_for_executorch_from_buffer(buffer)
    expected = conv(x)
    (got,) = module.forward((x,))
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-3)
    return lambda: (buffer, module.forward((x,)))


def main(threads: int | None = None) -> bool:
    """Time every layer and print a table; True when the default form (``fold``) meets the target on each."""
    threads = threads or int(os.environ.get("XNNGUARD_BENCH_THREADS", min(2, os.cpu_count() or 1)))
    torch.set_num_threads(threads)
    portable_lib._unsafe_reset_threadpool(threads)
    rows = []
    torch.manual_seed(0)
    with torch.no_grad():
        for name, (c_in, c_out, kernel, stride, padding), shape in LAYERS:
            conv = torch.nn.Conv3d(c_in, c_out, kernel, stride, padding).eval()  # type: ignore[arg-type]
            x = torch.randn(shape)
            for depth_taps in ("fold", "sum"):
                run_pte = _lowered_forward(conv, x, depth_taps)
                eager, pte = [], []
                for _ in range(3):  # alternate so noise hits both alike
                    eager.append(_median_seconds(lambda: conv(x)))
                    pte.append(_median_seconds(run_pte))
                eager_s, pte_s = statistics.median(eager), statistics.median(pte)
                rows.append((name, depth_taps, eager_s * 1e3, pte_s * 1e3, eager_s / pte_s))
    print(f"Conv3d rewritten on XNNPACK vs eager conv3d, {threads} thread(s); ratio = eager / ExecuTorch "
          f"(target >= {TARGET_RATIO})")
    print(f"{'layer':<30} {'form':<5} {'eager ms':>9} {'xnnpack ms':>11} {'ratio':>6}")
    for name, form, eager_ms, pte_ms, ratio in rows:
        flag = "" if ratio >= TARGET_RATIO else "  < target"
        print(f"{name:<30} {form:<5} {eager_ms:>9.2f} {pte_ms:>11.2f} {ratio:>6.2f}{flag}")
    return all(ratio >= TARGET_RATIO for _, form, _, _, ratio in rows if form == "fold")


if __name__ == "__main__":
    main()
