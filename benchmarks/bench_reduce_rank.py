"""Patchify on XNNPACK after rank reduction vs the same model lowered with tags only (8-D permute on portable).

Both programs are lowered with ``xnnguard.XnnpackPartitioner`` from the same export; one after
``ReduceRankPass`` (the 8-D reshape -> permute -> reshape becomes a 6-D and a 4-D transpose, all in one
XNNPACK delegate), one without (the 8-D permute runs on ExecuTorch's portable kernel). Both run with
the ExecuTorch runtime in the same process, the same thread count (the runtime's threadpool), runs
alternating so machine noise hits both alike; median of ``REPEATS``. Target: rewritten >= 2x faster.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch

TARGET_SPEEDUP = 2.0
REPEATS = 7


class LargePatchify(torch.nn.Module):
    """The seed's patchify at video scale: (8, 6, 64, 64, 128) viewed 8-D, permuted, back to 3-D."""

    shape = (8, 6, 16, 2, 16, 16, 2, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.reshape(self.shape).permute(0, 2, 5, 3, 6, 1, 4, 7)
        return y.reshape(8, 16 * 16 * 2, -1) * 2


def _load(ep: torch.export.ExportedProgram) -> Callable[[tuple[torch.Tensor, ...]], object]:
    """Lower with xnnguard's partitioner, load with the runtime; return its forward."""
    from executorch.exir import to_edge_transform_and_lower

    import xnnguard
    from xnnguard.boundary.runtime import load_module

    program = to_edge_transform_and_lower(ep, partitioner=[xnnguard.XnnpackPartitioner()]).to_executorch()
    buffer = program.buffer  # the loaded program reads this memory: the closure below keeps it alive
    module = load_module(buffer)

    def forward(inputs: tuple[torch.Tensor, ...]) -> object:
        assert buffer is not None
        return module.forward(inputs)

    return forward


def _seconds(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main(threads: int | None = None) -> dict[str, float] | bool:
    """Print the timings and the speed-up; return them, or False when the target is missed."""
    from xnnguard.boundary.runtime import reset_threadpool
    from xnnguard.rewrite.rank.reduce_rank import ReduceRankPass
    from xnnguard.rewrite.rewrite_for_xnnpack import XnnpackRewriter

    threads = threads or int(os.environ.get("XNNGUARD_BENCH_THREADS", min(2, os.cpu_count() or 1)))
    torch.set_num_threads(threads)
    reset_threadpool(threads)
    torch.manual_seed(0)
    model, x = LargePatchify().eval(), torch.randn(8, 6, 64, 64, 128)
    ep = torch.export.export(model, (x,))
    tags_only = _load(ep)
    rewritten = _load(XnnpackRewriter([ReduceRankPass()])(ep))
    expected = model(x)
    for forward in (tags_only, rewritten):  # also the warm-up (first-run allocations, XNNPACK set-up)
        (out,) = forward((x,))  # type: ignore[misc]
        torch.testing.assert_close(out, expected, atol=0, rtol=0)
    portable_times, xnnpack_times = [], []
    for _ in range(REPEATS):
        portable_times.append(_seconds(lambda: tags_only((x,))))
        xnnpack_times.append(_seconds(lambda: rewritten((x,))))
    portable_ms = 1e3 * statistics.median(portable_times)
    xnnpack_ms = 1e3 * statistics.median(xnnpack_times)
    speedup = portable_ms / xnnpack_ms
    verdict = "meets" if speedup >= TARGET_SPEEDUP else "MISSES"
    print(
        f"reduce_rank  patchify 8x6x64x64x128, {threads} thread(s), median of {REPEATS}: tags only (8-D permute "
        f"on portable) {portable_ms:.1f} ms, rank-reduced on XNNPACK {xnnpack_ms:.1f} ms, "
        f"speed-up {speedup:.2f}x ({verdict} target >= {TARGET_SPEEDUP}x)"
    )
    if speedup < TARGET_SPEEDUP:
        return False
    return {"portable_ms": portable_ms, "xnnpack_ms": xnnpack_ms, "speedup": speedup}


if __name__ == "__main__":
    main()
