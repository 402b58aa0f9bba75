"""Shared test helpers: lower real models with the real ExecuTorch, run them with the real runtime."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from executorch.exir import EdgeProgramManager, to_edge, to_edge_transform_and_lower
from executorch.exir.lowered_backend_module import LoweredBackendModule

from xnnguard.graph.ops import target_name
from xnnguard.report import STOCK_RULES, KeptOut

__all__ = [
    "Lowered",
    "lower",
    "own_records",
    "quant_step",
    "quantize_pt2e",
    "run_pte",
    "xnnpack_quantizer",
]


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
    """Export (unless given an ExportedProgram), lower with ``partitioner`` and serialize."""
    ep = model if isinstance(model, torch.export.ExportedProgram) else torch.export.export(model.eval(), inputs)
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


def own_records(records: Sequence[KeptOut]) -> list[KeptOut]:
    """The records of xnnguard's own rules: without those giving ExecuTorch's reason for the other nodes outside."""
    return [record for record in records if record.rule not in STOCK_RULES]


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


def quant_step(converted: torch.fx.GraphModule, expected: torch.Tensor) -> float:
    """One quantization step of ``converted``: its largest static activation scale.

    A dynamically quantized model has no static scale; there a step is that of an int8 grid over the
    range of the expected output.
    """
    scales = [
        float(node.args[1])
        for node in converted.graph.nodes
        if node.op == "call_function"
        and "quantize_per_tensor" in str(node.target)
        and isinstance(node.args[1], (int, float))
    ]
    if scales:
        return max(scales)
    return float(expected.max() - expected.min()) / 255


def xnnpack_quantizer(*, per_channel: bool = True, dynamic: bool = False, float_output: bool = False) -> Any:
    """ExecuTorch's own XNNPACKQuantizer with a global symmetric config (``float_output``: no output q)."""
    import dataclasses

    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    config = get_symmetric_quantization_config(is_per_channel=per_channel, is_dynamic=dynamic)
    if float_output:
        config = dataclasses.replace(config, output_activation=None)
    return XNNPACKQuantizer().set_global(config)


class ClassToken(torch.nn.Module):
    """A learned class token put in front of the tokens of every image of the batch (ViT, MViT), then a
    linear: nothing a rewrite changes but the token's expand, which a dynamic batch leaves an expand."""

    def __init__(self) -> None:
        super().__init__()
        self.token = torch.nn.Parameter(torch.randn(1, 1, 16))
        self.linear = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.cat((self.token.expand(x.shape[0], -1, -1), x), dim=1))


class SeparableBlock(torch.nn.Module):
    """R(2+1)D's residual block in miniature: spatial then temporal conv, twice, and the skip added."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(  # R(2+1)D's stem: it ends with a temporal conv, as every block does
            torch.nn.Conv3d(3, channels, (1, 3, 3), padding=(0, 1, 1)),
            torch.nn.ReLU(inplace=True),
            torch.nn.Conv3d(channels, channels, (3, 1, 1), padding=(1, 0, 0)),
            torch.nn.ReLU(inplace=True),
        )
        self.body = torch.nn.Sequential(
            torch.nn.Conv3d(channels, channels, (1, 3, 3), padding=(0, 1, 1)),
            torch.nn.ReLU(inplace=True),
            torch.nn.Conv3d(channels, channels, (3, 1, 1), padding=(1, 0, 0)),
        )
        self.relu = torch.nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        out = self.body(x)
        out += x
        return self.relu(out)
