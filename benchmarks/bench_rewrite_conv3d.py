"""Conv3d rewritten as Conv2d on XNNPACK against eager PyTorch's conv3d, on R3D-18-sized layers.

Each layer is rewritten (``rewrite_for_xnnpack``, both general forms: depth taps folded into channels,
and per-tap convs summed), lowered with ``xnnguard.XnnpackPartitioner`` and checked against eager once.
Then each side is timed **in its own fresh process**, with the same thread count (``torch.set_num_threads``
for eager, the runtime's threadpool for ExecuTorch) and the same environment, rounds alternating so that
machine noise hits both alike. The ratio is eager median / ExecuTorch median (> 1: the rewrite is
faster). Target: >= 1.

Why separate processes and that environment (each measured on this machine, 2 threads, stem layer; the
protocol itself lives in ``benchmarks.timing`` and the other benchmarks use it too):

* ``OMP_WAIT_POLICY=PASSIVE``. After any parallel torch op (eager conv3d, but also the copies the
  pybindings make of a program's inputs and outputs) torch's OpenMP threads spin for a while, taking the
  second core from XNNPACK's worker: the same program ran in 6.3 ms with spinning neighbours and 3.3 ms
  without. A deployed program has no torch threads next to it. Eager is not slowed by it (2.7 ms both).
* ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_``. oneDNN's conv3d allocates a large
  scratch buffer per call; glibc hands such blocks back to the kernel on free, so a fresh process pays
  page faults on every call (6.2 ms instead of 2.7 ms). A long-running eager program usually reaches the
  fast steady state; raising the thresholds puts eager there from the start, so the baseline is eager at
  its best. ExecuTorch plans its memory once at load and does not care.

The ``floor`` column is what no rewrite into XNNPACK ops can beat: one XNNPACK conv2d doing the folded
form's multiply-adds (depth taps folded into channels, all output frames in the batch) on a
channels-last input with a channels-last output, so with no layout work at all.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.timing import median_ms, print_ms, time_in_fresh_process

TARGET_RATIO = 1.0
ROUNDS = 3  # fresh processes per side and form, alternating

# name, Conv3d(in, out, kernel, stride, padding), input shape
LAYERS = [
    ("stem 3->64 k(3,7,7) s(1,2,2)", (3, 64, (3, 7, 7), (1, 2, 2), (1, 3, 3)), (1, 3, 8, 112, 112)),
    ("64->64 k3 p1", (64, 64, 3, 1, 1), (1, 64, 8, 28, 28)),
    ("64->128 k3 s2 p1", (64, 128, 3, 2, 1), (1, 64, 8, 28, 28)),
]
FORMS = ("fold", "sum")


def _layer(index: int) -> tuple[torch.nn.Conv3d, torch.Tensor]:
    """The layer's module and input, identical in every process (fixed seed)."""
    _, (c_in, c_out, kernel, stride, padding), shape = LAYERS[index]
    torch.manual_seed(index)
    conv = torch.nn.Conv3d(c_in, c_out, kernel, stride, padding).eval()  # type: ignore[arg-type]
    return conv, torch.randn(shape)


def _floor_layer(index: int) -> tuple[torch.nn.Conv2d, torch.Tensor]:
    """The folded form's conv2d alone, channels-last in and out: the layer's cost without layout work."""
    conv, x = _layer(index)
    (kd, kh, kw), (sd, sh, sw), (_, ph, pw) = conv.kernel_size, conv.stride, conv.padding
    n, c, d, h, w = x.shape
    frames = (d + 2 * conv.padding[0] - kd) // sd + 1  # type: ignore[operator]
    torch.manual_seed(index)
    conv2d = torch.nn.Conv2d(c * kd, conv.out_channels, (kh, kw), (sh, sw), (ph, pw)).eval()  # type: ignore[arg-type]
    return conv2d, torch.randn(n * frames, c * kd, h, w).to(memory_format=torch.channels_last)


def _write_program(index: int, form: str, path: Path) -> None:
    """Rewrite (``form``: a depth-taps form, or ``floor``), lower, check against eager and save the .pte."""
    from executorch.exir import to_edge_transform_and_lower

    import xnnguard
    from xnnguard.boundary.runtime import load_module
    from xnnguard.rewrite.conv3d.conv3d import RewriteConv3dPass
    from xnnguard.rewrite.rewrite_for_xnnpack import XnnpackRewriter

    conv, x = _floor_layer(index) if form == "floor" else _layer(index)
    ep = torch.export.export(conv, (x,))
    if form != "floor":
        ep = XnnpackRewriter([RewriteConv3dPass(form)])(ep)  # type: ignore[arg-type]
    program = to_edge_transform_and_lower(ep, partitioner=[xnnguard.XnnpackPartitioner()]).to_executorch()
    (got,) = load_module(program.buffer).forward((x,))
    torch.testing.assert_close(got, conv(x), atol=1e-3, rtol=1e-3)
    path.write_bytes(program.buffer)


def _worker(side: str, index: int, threads: int, pte: str | None, floor: bool) -> float:
    """Time one side of one layer in this (fresh) process."""
    torch.set_num_threads(threads)
    conv, x = _floor_layer(index) if floor else _layer(index)
    if side == "eager":
        with torch.no_grad():
            return median_ms(lambda: conv(x))
    from xnnguard.boundary.runtime import load_module, reset_threadpool

    reset_threadpool(threads)  # before loading: delegates keep the pool they saw
    assert pte is not None
    module = load_module(pte)
    return median_ms(lambda: module.forward((x,)))


def _time_in_fresh_process(side: str, index: int, threads: int, pte: Path | None = None, floor: bool = False) -> float:
    args = ["--worker", side, "--layer", str(index), "--threads", str(threads)]
    if pte is not None:
        args += ["--pte", str(pte)]
    if floor:
        args.append("--floor")
    return time_in_fresh_process("benchmarks.bench_rewrite_conv3d", args, f"{side} worker for layer {index}")


def main(threads: int | None = None) -> bool:
    """Time every layer and print a table; True when the default form (``fold``) meets the target on each."""
    threads = threads or int(os.environ.get("XNNGUARD_BENCH_THREADS", min(2, os.cpu_count() or 1)))
    rows = []
    with tempfile.TemporaryDirectory(prefix="xnnguard-bench-") as tmp, torch.no_grad():
        for index, (name, _, _) in enumerate(LAYERS):
            ptes = {form: Path(tmp) / f"layer{index}-{form}.pte" for form in (*FORMS, "floor")}
            for form, path in ptes.items():
                _write_program(index, form, path)
            times: dict[str, list[float]] = {form: [] for form in ("eager", *ptes)}
            for _ in range(ROUNDS):
                times["eager"].append(_time_in_fresh_process("eager", index, threads))
                for form, path in ptes.items():
                    times[form].append(_time_in_fresh_process("executorch", index, threads, path, form == "floor"))
            eager_ms, floor_ms = statistics.median(times["eager"]), statistics.median(times["floor"])
            for form in FORMS:
                pte_ms = statistics.median(times[form])
                rows.append((name, form, eager_ms, pte_ms, eager_ms / pte_ms, floor_ms))
    print(f"Conv3d rewritten on XNNPACK vs eager conv3d, {threads} thread(s), each side in its own process; "
          f"ratio = eager / ExecuTorch (target >= {TARGET_RATIO})")
    print(f"{'layer':<30} {'form':<5} {'eager ms':>9} {'xnnpack ms':>11} {'ratio':>6} {'floor ms':>9}")
    for name, form, eager_ms, pte_ms, ratio, floor_ms in rows:
        flag = "" if ratio >= TARGET_RATIO else "  < target"
        print(f"{name:<30} {form:<5} {eager_ms:>9.2f} {pte_ms:>11.2f} {ratio:>6.2f} {floor_ms:>9.2f}{flag}")
    return all(row[4] >= TARGET_RATIO for row in rows if row[1] == "fold")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=["eager", "executorch"], help="time one side in this process")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--pte", default=None)
    parser.add_argument("--floor", action="store_true", help="the worker's input is the floor conv2d's")
    args = parser.parse_args()
    if args.worker:
        print_ms(_worker(args.worker, args.layer, args.threads or 1, args.pte, args.floor))
    else:
        sys.exit(0 if main(args.threads) else 1)
