"""Lower a program to XNNPACK and serialize it; load and run the ``.pte`` with the real runtime."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from executorch.exir import EdgeProgramManager, to_edge, to_edge_transform_and_lower
from executorch.exir.lowered_backend_module import LoweredBackendModule

import xnnguard
from xnnguard.boundary.runtime import load_module
from xnnguard.compat import load_quantized_kernels
from xnnguard.graph.ops import target_name

__all__ = ["Lowered", "lower", "run_pte"]


def _short(name: str) -> str:
    """``aten.permute_copy.default`` -> ``permute_copy``; q/dq keep their full op name."""
    parts = name.split(".")
    return parts[-2] if len(parts) >= 2 else name


@dataclass
class Lowered:
    """A lowered program, its serialized bytes, and where its ops went (read before serialization)."""

    edge: EdgeProgramManager
    buffer: bytes
    _delegated: Counter[str]
    _outside: Counter[str]
    delegated_nodes: list[torch.fx.Node]

    def delegated_ops(self) -> Counter[str]:
        """Ops inside XNNPACK delegates, by short name (``permute_copy``, ``dequantize_per_tensor``)."""
        return self._delegated

    def outside_ops(self) -> Counter[str]:
        """Ops left to ExecuTorch's own kernels, by short name."""
        return self._outside

    @property
    def user_outputs(self) -> slice:
        """Which of the program's outputs are the model's own: ExecuTorch returns the graph inputs the model
        mutates in place (an in-place ReLU on a view of its input) first, then the model's outputs."""
        from torch.export.graph_signature import OutputKind

        specs = self.edge.exported_program().graph_signature.output_specs
        return slice(sum(1 for spec in specs if spec.kind == OutputKind.USER_INPUT_MUTATION), None)

    @property
    def num_delegates(self) -> int:
        return sum(1 for node in self._top_nodes() if "executorch_call_delegate" in target_name(node))

    def _top_nodes(self) -> list[torch.fx.Node]:
        return list(self.edge.exported_program().graph_module.graph.nodes)


def _placements(edge: EdgeProgramManager) -> tuple[Counter[str], Counter[str], list[torch.fx.Node]]:
    """Ops inside XNNPACK delegates and ops outside them (delegate calls and getitem excluded)."""
    gm = edge.exported_program().graph_module
    delegated: Counter[str] = Counter()
    delegated_nodes: list[torch.fx.Node] = []
    for _, child in gm.named_children():
        if isinstance(child, LoweredBackendModule):
            for node in child.original_module.graph.nodes:
                if node.op == "call_function":
                    delegated[_short(target_name(node))] += 1
                    delegated_nodes.append(node)
    outside: Counter[str] = Counter()
    for node in gm.graph.nodes:
        name = target_name(node)
        if node.op == "call_function" and "executorch_call_delegate" not in name and "getitem" not in name:
            outside[_short(name)] += 1
    return delegated, outside, delegated_nodes


def lower(
    model: torch.nn.Module | torch.export.ExportedProgram,
    inputs: tuple[torch.Tensor, ...],
    partitioner: Any,
    *,
    via_to_backend: bool = False,
    transform_passes: Sequence[Any] = (),
) -> Lowered:
    """Export (unless given an ExportedProgram), lower with ``partitioner`` and serialize.

    The quantized out-variants are registered first, whatever the process loaded before: q/dq a partitioner
    leaves outside XNNPACK need them at ``to_executorch()``, and on 1.4.0 importing their module is not enough.
    """
    load_quantized_kernels()
    ep = model if isinstance(model, torch.export.ExportedProgram) else torch.export.export(model.eval(), inputs)
    with xnnguard.keep_dynamic_ranges():  # as the README says to lower a program with dynamic sizes
        if via_to_backend:
            edge = to_edge(ep)
            if transform_passes:
                edge = edge.transform(list(transform_passes))
            edge = edge.to_backend(partitioner)
        else:
            edge = to_edge_transform_and_lower(ep, partitioner=[partitioner], transform_passes=list(transform_passes))
        delegated, outside, delegated_nodes = _placements(edge)
        buffer = edge.to_executorch().buffer
    return Lowered(edge, buffer, delegated, outside, delegated_nodes)


def run_pte(buffer: bytes, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """Load ``buffer`` with the real ExecuTorch runtime and run ``forward`` once (``buffer`` outlives the module)."""
    module = load_module(buffer)
    return list(module.forward(inputs))
