"""Shared test helpers: lower real models with the real ExecuTorch, run them with the real runtime."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from executorch.exir import EdgeProgramManager, to_edge, to_edge_transform_and_lower
from executorch.exir.lowered_backend_module import LoweredBackendModule

from xnnguard.passes.do_not_delegate import op_name

__all__ = [
    "Lowered",
    "lower",
    "quantize_pt2e",
    "run_pte",
]


def _short(name: str) -> str:
    """``aten.permute_copy.default`` -> ``permute_copy``; q/dq keep their full op name."""
    parts = name.split(".")
    return parts[-2] if len(parts) >= 2 else name


@dataclass
class Lowered:
    """A lowered program and where its ops went."""

    edge: EdgeProgramManager
    buffer: bytes

    def _top_graph(self) -> torch.fx.Graph:
        return self.edge.exported_program().graph_module.graph

    def delegates(self) -> list[LoweredBackendModule]:
        gm = self.edge.exported_program().graph_module
        return [m for _, m in gm.named_children() if isinstance(m, LoweredBackendModule)]

    def delegated_ops(self) -> Counter[str]:
        """Ops inside XNNPACK delegates, by short name."""
        ops: Counter[str] = Counter()
        for delegate in self.delegates():
            for node in delegate.original_module.graph.nodes:
                if node.op == "call_function":
                    ops[_short(op_name(node))] += 1
        return ops

    def outside_ops(self) -> Counter[str]:
        """Ops of the top-level graph, outside any delegate (getitem and delegate calls excluded)."""
        ops: Counter[str] = Counter()
        for node in self._top_graph().nodes:
            if node.op != "call_function":
                continue
            name = op_name(node)
            if "executorch_call_delegate" in name or name == "getitem":
                continue
            ops[_short(name)] += 1
        return ops


def lower(
    model: torch.nn.Module | torch.export.ExportedProgram,
    inputs: tuple[torch.Tensor, ...],
    partitioner: Any,
    *,
    via_to_backend: bool = False,
    transform_passes: Sequence[Any] = (),
) -> Lowered:
    """Export (unless given an ExportedProgram), lower with ``partitioner`` and serialize."""
    ep = model if isinstance(model, torch.export.ExportedProgram) else torch.export.export(model.eval(), inputs)
    if via_to_backend:
        edge = to_edge(ep)
        if transform_passes:
            edge = edge.transform(list(transform_passes))
        edge = edge.to_backend(partitioner)
    else:
        edge = to_edge_transform_and_lower(ep, partitioner=[partitioner], transform_passes=list(transform_passes))
    buffer = edge.to_executorch().buffer
    return Lowered(edge, buffer)


def run_pte(buffer: bytes, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """Load ``buffer`` with the real ExecuTorch runtime and run ``forward`` once."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    module = _load_for_executorch_from_buffer(buffer)
    return list(module.forward(inputs))


def quantize_pt2e(
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    quantizer: Any,
) -> torch.fx.GraphModule:
    """Export for quantization, prepare, calibrate on ``inputs``, convert (torchao pt2e)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    exported = torch.export.export(model.eval(), inputs).module()
    prepared = prepare_pt2e(exported, quantizer)
    prepared(*inputs)
    return convert_pt2e(prepared)
