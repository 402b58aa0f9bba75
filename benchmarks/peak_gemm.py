"""The machine's measured peak: one large GEMM, fp32 and int8, on the benchmark's threads.

So that "close to the physical limit" has a number: a network's GFLOP/s (``testbed.macs``) over the
rate one large matrix product reaches on the same threads. Four ways, each a side of the turn protocol
(``benchmarks.timing``) in a fresh process:

* ``xnnpack-f32``: a one-``Linear`` ExecuTorch program lowered with ``xnnguard.XnnpackPartitioner``
  (XNNPACK's f32 GEMM);
* ``xnnpack-qs8``: the same ``Linear`` statically quantized by ``xnnguard.XNNPACKQuantizer``
  (per-channel): XNNPACK's qs8 GEMM, with the input's quantize and the output's dequantize (two passes
  over M x K and M x N elements, about 0.1 % of the multiply-adds' time);
* ``ort-f32`` / ``ort-u8s8``: the same ``Linear`` converted for ONNX Runtime as ``bench_peers`` converts
  networks (``benchmarks.peer_runtimes.export_ort``; int8: QDQ, u8 activations, s8 per-channel weights):
  MLAS's f32 and int8 GEMMs, the kernels ONNX Runtime's figures in the peer table stand on;
* ``torch-f32``: ``torch.mm`` (oneDNN / MKL);
* ``torch-s8``: ``torch._int_mm`` (int8 in, int32 out).

Where a network's int8 program runs at its kernel's peak, no lowering beats a runtime whose kernel peaks
higher on this CPU: the xnnpack and ort sides side by side say by how much.

An M x K by K x N product is ``2 M N K`` operations (a multiply-add is two).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

M, K, N = 1024, 2048, 2048
OPS = 2 * M * N * K
SIDES = ("xnnpack-f32", "xnnpack-qs8", "ort-f32", "ort-u8s8", "torch-f32", "torch-s8")
CONVERTED = (("xnnpack-f32", False), ("xnnpack-qs8", True), ("ort-f32", False), ("ort-u8s8", True))


class OneLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(K, N, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def _example() -> tuple[OneLinear, tuple[torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    model = OneLinear().eval()
    with torch.no_grad():
        model.linear.weight.copy_(torch.randn(N, K, generator=generator) * K**-0.5)
    return model, (torch.randn(M, K, generator=generator),)


def lower(int8: bool, path: Path) -> None:
    """Write the one-linear program (float, or static int8) to ``path``: a ``.pte``, or for ONNX Runtime an
    ``.onnx`` (its int8 model is written beside it; its path is printed)."""
    if path.suffix == ".onnx":
        from benchmarks.peer_runtimes import export_ort

        model, example = _example()
        print(json.dumps({"artifact": str(export_ort(model, example, path, int8))}))
        return
    from executorch.exir import to_edge_transform_and_lower

    import xnnguard
    from testbed.quantize import quantize_pt2e, xnnguard_quantizer

    model, example = _example()
    program = torch.export.export(model, example)
    if int8:
        program = torch.export.export(quantize_pt2e(program, example, xnnguard_quantizer()), example)
    edge = to_edge_transform_and_lower(program, partitioner=[xnnguard.XnnpackPartitioner()])
    path.write_bytes(edge.to_executorch().buffer)
    print(json.dumps({"artifact": str(path)}))


def runner(side: str, artifact: str | None, threads: int) -> Callable[[], object]:
    torch.set_num_threads(threads)
    _, (x,) = _example()
    if side.startswith("xnnpack"):
        from xnnguard.boundary.runtime import load_module, reset_threadpool

        reset_threadpool(threads)
        assert artifact is not None
        module = load_module(artifact)
        return lambda: module.forward((x,))
    if side.startswith("ort"):
        from benchmarks.peer_runtimes import ort_feeds, ort_session

        assert artifact is not None
        session = ort_session(artifact, threads)
        feeds = ort_feeds(session, (x,))
        return lambda: session.run(None, feeds)
    w = torch.randn(K, N)
    if side == "torch-f32":
        return lambda: torch.mm(x, w)
    if side == "torch-s8":
        a, b = torch.randint(-127, 128, (M, K), dtype=torch.int8), torch.randint(-127, 128, (K, N), dtype=torch.int8)
        return lambda: torch._int_mm(a, b)
    raise ValueError(f"unknown side {side!r}; the sides are {', '.join(SIDES)}")


def measure(directory: Path, threads: int, rounds: int, turn_s: float) -> dict[str, dict[str, object]]:
    """Each side's GFLOP/s (median of ``rounds`` fresh-process turns), or the error that stopped it."""
    from benchmarks.timing import run_in_fresh_process, turn_order

    artifacts: dict[str, Path] = {}
    results: dict[str, dict[str, object]] = {}
    for side, int8 in CONVERTED:
        path = directory / f"peak.{side}.{'onnx' if side.startswith('ort') else 'pte'}"
        try:
            made = run_in_fresh_process("benchmarks.peak_gemm", ["--lower", str(path), *(["--int8"] if int8 else [])],
                                        f"converting the {side} GEMM", timeout=600)
            artifacts[side] = Path(made["artifact"])
        except RuntimeError as error:
            results[side] = {"error": str(error).splitlines()[0]}
    turns: dict[str, list[float]] = {side: [] for side in SIDES}
    for side in turn_order([side for side in SIDES if side not in results], rounds):
        args = ["--time", side, "--threads", str(threads), "--turn-s", str(turn_s)]
        if side in artifacts:
            args += ["--artifact", str(artifacts[side])]
        try:
            turns[side].append(float(run_in_fresh_process("benchmarks.peak_gemm", args, f"the {side} GEMM",
                                                          timeout=600, threads=threads)["ms"]))
        except RuntimeError as error:
            results.setdefault(side, {"error": str(error).splitlines()[0]})
    for side, ms in turns.items():
        if ms and side not in results:
            median = statistics.median(ms)
            results[side] = {"ms": median, "gflops": OPS / (median * 1e-3) / 1e9, "turns_ms": ms}
    return results


def main(argv: list[str]) -> int:
    from benchmarks.timing import turn_ms

    parser = argparse.ArgumentParser(prog="python -m benchmarks.peak_gemm", description=__doc__.splitlines()[0])
    parser.add_argument("--lower", type=Path, help="write the one-linear program here (.pte, or .onnx)")
    parser.add_argument("--int8", action="store_true")
    parser.add_argument("--time", choices=SIDES, help="take one turn of this side")
    parser.add_argument("--artifact", help="the converted program a turn runs (.pte or .onnx)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turn-s", type=float, default=0.5)
    args = parser.parse_args(argv)
    if args.lower:
        lower(args.int8, args.lower)
    elif args.time:
        print(json.dumps(turn_ms(runner(args.time, args.artifact, args.threads), args.turn_s)))
    else:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="xnnguard-peak-") as tmp:
            for side, result in measure(Path(tmp), args.threads, args.rounds, args.turn_s).items():
                print(f"{side:12} " + (f"{result['gflops']:7.1f} GFLOP/s ({result['ms']:.1f} ms)"
                                       if "gflops" in result else f"failed: {result['error']}"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
