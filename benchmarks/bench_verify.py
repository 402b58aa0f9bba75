"""``verify_pte`` against the stock flow, measured in one run (issue 4).

* a ``.pte`` with 200 MB of weights: ``verify_pte`` at least 20x faster than ExecuTorch's
  ``deserialize_pte_binary`` of the same file, and its time independent of the weight bytes (the same
  graph with 20 MB and with 200 MB);
* a delegate of about 10,000 XNNPACK nodes verifies in under a second.

Programs are lowered with stock ExecuTorch 1.5.1. The 10,000-node delegate is serialized by ExecuTorch's
own XNNPACK serializer and emitted by its own emitter (lowering 10,000 ops through the partitioner
takes many minutes); the runtime loads it, which shows it is a valid XNNPACK program.
"""

from __future__ import annotations

import functools
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

WEIGHT_WIDTHS = {"20 MB": 1000, "200 MB": 3163}  # 5 float Linear(w, w): 5 * 4 * w**2 bytes
LARGE_DELEGATE_NODES = 10_000


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    target: str
    met: bool

    def __str__(self) -> str:
        verdict = "ok  " if self.met else "MISS"
        return f"  {verdict} {self.name:<58} {self.value:>10.4g} {self.unit:<3} (target {self.target})"


class _Mlp(torch.nn.Module):
    def __init__(self, width: int, depth: int = 5) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def _lower(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Any:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    with torch.no_grad():
        return to_edge_transform_and_lower(
            torch.export.export(model.eval(), inputs), partitioner=[XnnpackPartitioner()]
        )


def _median_seconds(action: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _median_cpu_seconds(action: Callable[[], Any], repeat: int) -> float:
    """This process's CPU time per call: what the check costs, whatever else the machine runs."""
    times = []
    for _ in range(repeat):
        started = time.process_time()
        action()
        times.append(time.process_time() - started)
    return statistics.median(times)


def _peak_python_bytes(action: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _read_and_deserialize(path: Path) -> Any:
    """The stock way to look inside a .pte: read it and deserialize the whole program."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    return deserialize_pte_binary(path.read_bytes())


def bench_weights(directory: Path) -> list[Figure]:
    from xnnguard.runtime_check import verify_pte

    verify_seconds: dict[str, float] = {}
    figures = []
    for label, width in WEIGHT_WIDTHS.items():
        path = directory / f"mlp_{width}.pte"
        torch.manual_seed(0)
        path.write_bytes(_lower(_Mlp(width), (torch.randn(1, width),)).to_executorch().buffer)
        size_mb = path.stat().st_size / 1e6
        ours = functools.partial(verify_pte, path)
        theirs = functools.partial(_read_and_deserialize, path)
        ours()  # warm: the kernel registry and schemas are read once per process
        verify_seconds[label] = _median_seconds(ours, repeat=20)
        stock = _median_seconds(theirs, repeat=3)
        print(
            f"  {label} of weights ({size_mb:.1f} MB file): verify_pte {verify_seconds[label] * 1e3:.2f} ms, "
            f"read + deserialize_pte_binary {stock * 1e3:.1f} ms; peak Python memory "
            f"{_peak_python_bytes(ours) / 1e6:.2f} MB vs {_peak_python_bytes(theirs) / 1e6:.0f} MB"
        )
        if label == "200 MB":
            ratio = stock / verify_seconds[label]
            figures.append(
                Figure("200 MB weights: deserialize_pte_binary / verify_pte", ratio, "x", ">= 20x", ratio >= 20)
            )
    growth = verify_seconds["200 MB"] / verify_seconds["20 MB"]
    # "independent": 10x the weight bytes may not cost anything like 10x the time; allow timer noise
    figures.append(Figure("verify_pte time, 200 MB / 20 MB of weights", growth, "x", "< 1.5x", growth < 1.5))
    return figures


def _chain_blob(nodes: int) -> bytes:
    """An XNNPACK graph x -> add -> add -> ... (``nodes`` adds) -> y, serialized by ExecuTorch."""
    from executorch.backends.xnnpack.serialization import xnnpack_graph_schema as xs
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import serialize_xnnpack_binary

    def value(id_out: int, flags: int = 0, external_id: int = 0xFFFFFFFF) -> Any:
        return xs.XValue(xs.XNNTensorValue(xs.XNNDatatype.xnn_datatype_fp32, 2, [1, 8], 0, external_id, flags, id_out))

    values = [value(0, flags=1, external_id=0), *(value(i) for i in range(1, nodes)), value(nodes, 2, 1)]
    xnodes = [
        xs.XNode(xs.XNNAdd(input1_id=i, input2_id=i, output_id=i + 1, flags=0), debug_handle=i) for i in range(nodes)
    ]
    return serialize_xnnpack_binary(xs.XNNGraph("0", xnodes, values, 2, [0], [nodes], []), bytearray())


class _Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x


def bench_large_delegate(directory: Path) -> list[Figure]:
    from executorch.exir.lowered_backend_module import LoweredBackendModule
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    from xnnguard.runtime_check import verify_pte

    edge = _lower(_Double(), (torch.randn(1, 8),))
    (delegate,) = [m for m in edge.exported_program().graph_module.children() if isinstance(m, LoweredBackendModule)]
    delegate._processed_bytes = _chain_blob(LARGE_DELEGATE_NODES)  # same I/O as x + x: one input, one output
    path = directory / "chain.pte"
    path.write_bytes(edge.to_executorch().buffer)
    output = _load_for_executorch(str(path)).forward((torch.ones(1, 8),))[0]
    assert torch.isinf(output).all(), "the runtime should double 1.0 ten thousand times"
    report = verify_pte(path)
    assert report.ok and report.nodes == LARGE_DELEGATE_NODES, report
    seconds = _median_seconds(lambda: verify_pte(path), repeat=5)
    cpu = _median_cpu_seconds(lambda: verify_pte(path), repeat=5)
    print(
        f"  {report.nodes} XNNPACK nodes, {report.values} values: verify_pte {seconds * 1e3:.0f} ms "
        f"({cpu * 1e3:.0f} ms of CPU: on a shared machine the wall time is the other processes' too)"
    )
    return [Figure(f"verify_pte of a {LARGE_DELEGATE_NODES}-node delegate, CPU time", cpu, "s", "< 1 s", cpu < 1)]


def main() -> bool:
    """Print the figures; True when every target is met."""
    print("bench_verify: xnnguard.runtime_check.verify_pte vs the stock flow")
    with tempfile.TemporaryDirectory(prefix="xnnguard-bench-") as directory:
        figures = bench_weights(Path(directory)) + bench_large_delegate(Path(directory))
    for figure in figures:
        print(figure)
    return all(figure.met for figure in figures)


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
