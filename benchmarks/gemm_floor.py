"""The ceiling of eager ÷ ExecuTorch for a whole network: its convolutions and matmuls alone, on XNNPACK.

A network's ExecuTorch time is at least the time XNNPACK takes for its convolutions and matrix products
(everything else, norms, softmax and data movement, comes on top). So eager's time for the whole network
over XNNPACK's time for those ops alone bounds the ratio any lowering can reach:

    ceiling = eager ms (whole network) / ExecuTorch ms (its conv2d / linear / matmul ops only, same shapes)

The ops are read from the program ``rewrite_for_xnnpack`` makes (so a Conv3d counts as the conv2d it
becomes), rebuilt with random operands of the same shapes in one module, lowered fully onto XNNPACK and
timed by ``benchmarks.timing``'s protocol. A network whose ratio sits near its ceiling is bound by
XNNPACK's kernels on this CPU, not by what xnnguard leaves around them.

``python -m benchmarks.gemm_floor [NAME...]`` prints, per network: eager ms, ExecuTorch ms, the heavy ops'
ExecuTorch ms, the ratio and the ceiling.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.timing import median_ms, print_ms, time_in_fresh_process

_HEAVY = frozenset({"linear", "conv2d", "convolution", "conv_transpose2d", "matmul", "bmm", "mm", "addmm", "baddbmm"})
ROUNDS = 3


_WEIGHT_POSITIONS = {"linear": (1, 2), "conv2d": (1, 2), "convolution": (1, 2), "conv_transpose2d": (1, 2),
                     "addmm": (0, 2)}


_CONVS = frozenset({"conv2d", "convolution", "conv_transpose2d"})


def _kind(target: Any) -> str:
    return str(target.__name__).split(".")[0]  # an OpOverload: "conv2d.default"


class HeavyOps(torch.nn.Module):
    """The conv / matmul calls of a program, each on seeded random operands of its recorded shapes.

    Weights are constants, as in the network. Activations are constants plus the input (one element),
    so that they are values the program computes: that add (one pass over each activation) is counted
    in the heavy ops' time, which makes the ceiling a little lower than the true one, never higher.
    A conv's activation is stored channels-last and its output read by a slice, which XNNPACK runs in
    its NHWC layout as it does between a network's convs; stored NCHW, ExecuTorch transposed each
    activation in and each output out, and those copies, counted as heavy-op time, put the ceiling of
    some conv networks below what their whole program reached.
    """

    def __init__(self, calls: list[tuple[Any, tuple[Any, ...]]]) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.calls: list[tuple[Any, list[tuple[str, Any]]]] = []
        for index, (target, args) in enumerate(calls):
            weights = _WEIGHT_POSITIONS.get(_kind(target), ())
            built: list[tuple[str, Any]] = []
            for position, arg in enumerate(args):
                if isinstance(arg, torch.Size):
                    name = f"operand_{index}_{position}"
                    value = torch.randn(tuple(arg), generator=generator) * 0.1
                    if _kind(target) in _CONVS and position == 0 and len(arg) == 4:
                        value = value.contiguous(memory_format=torch.channels_last)
                    self.register_buffer(name, value)
                    built.append(("weight" if position in weights else "activation", name))
                else:
                    built.append(("value", arg))
            self.calls.append((target, built))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = []
        scalar = x.reshape(1)  # (1, 1, 1, 1) for the convs' activations, which must stay 4-D to stay NHWC
        for target, args in self.calls:
            added = x if _kind(target) in _CONVS else scalar
            values = [getattr(self, arg) + added if kind == "activation" else getattr(self, arg) if kind == "weight"
                      else arg for kind, arg in args]
            out = target(*values)
            # one element out (the rest is memory the plan reuses), read without a layout change
            outputs.append(out[:, :1, :1, :1] if _kind(target) in _CONVS and out.dim() == 4 else out.flatten()[:1])
        return tuple(outputs)


def heavy_calls(name: str, size: str = "bench") -> list[tuple[Any, tuple[Any, ...]]]:
    """The conv / matmul calls of network ``name`` after ``rewrite_for_xnnpack``, tensors as their shapes."""
    import xnnguard
    from testbed.networks import NETWORKS
    from xnnguard.graph.ops import is_op

    model, inputs = NETWORKS[name](size)
    ep = xnnguard.XnnpackRewriter()(torch.export.export(model, inputs))
    return [(node.target, tuple(arg.meta["val"].shape if isinstance(arg, torch.fx.Node) else arg for arg in node.args))
            for node in ep.graph.nodes if is_op(node, _HEAVY)]


def _lower(name: str, pte: Path) -> None:
    from executorch.exir import to_edge_transform_and_lower

    import xnnguard

    module = HeavyOps(heavy_calls(name)).eval()
    example = (torch.randn(1, 1, 1, 1),)
    edge = to_edge_transform_and_lower(torch.export.export(module, example),
                                       partitioner=[xnnguard.XnnpackPartitioner()])
    pte.write_bytes(edge.to_executorch().buffer)


def _time_worker(pte: str, threads: int) -> float:
    from xnnguard.boundary.runtime import load_module, reset_threadpool

    torch.set_num_threads(threads)
    reset_threadpool(threads)
    module = load_module(pte)
    example = (torch.randn(1, 1, 1, 1),)
    return median_ms(lambda: module.forward(example))


def heavy_ops_ms(name: str, threads: int, directory: Path) -> float:
    """ExecuTorch ms of network ``name``'s conv / matmul ops alone (bench size), median of fresh processes."""
    pte = directory / f"{name}.heavy.pte"
    _lower(name, pte)
    return statistics.median(
        time_in_fresh_process("benchmarks.gemm_floor", ["--time-worker", str(pte), "--threads", str(threads)])
        for _ in range(ROUNDS))


def main(names: list[str], threads: int) -> None:
    from benchmarks.network_report import lower_in_fresh_process, time_network

    print(f"{'network':12} {'eager ms':>9} {'ET ms':>7} {'heavy ops ET ms':>16} {'eager/ET':>9} {'ceiling':>8}")
    with tempfile.TemporaryDirectory(prefix="xnnguard-floor-") as tmp:
        for name in names:
            result = lower_in_fresh_process(name, "bench", "float", False, Path(tmp))
            time_network(result, threads)
            heavy = heavy_ops_ms(name, threads, Path(tmp))
            assert result.eager_ms and result.et_ms
            print(f"{name:12} {result.eager_ms:9.1f} {result.et_ms:7.1f} {heavy:16.1f} "
                  f"{result.eager_ms / result.et_ms:9.2f} {result.eager_ms / heavy:8.2f}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--time-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.time_worker:
        print_ms(_time_worker(args.time_worker, args.threads))
        sys.exit(0)
    from testbed.networks import NETWORKS

    main(args.names or list(NETWORKS), args.threads)
