"""pt2e quantization with ExecuTorch's XNNPACK quantizer or xnnguard's drop-in."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch

__all__ = ["PRECISIONS", "Precision", "is_dynamic", "quantize_pt2e", "xnnguard_quantizer", "xnnpack_quantizer"]

# "fp16": the float model cast to half (testbed.flow); PRECISIONS are those every op test runs in.
Precision = Literal["float", "fp16", "static int8", "dynamic int8"]
PRECISIONS: tuple[Precision, ...] = ("float", "static int8", "dynamic int8")


def is_dynamic(precision: str) -> bool:
    return precision in ("dynamic int8", "dynamic")


def _config(per_channel: bool, dynamic: bool, float_output: bool) -> Any:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config

    config = get_symmetric_quantization_config(is_per_channel=per_channel, is_dynamic=dynamic)
    return dataclasses.replace(config, output_activation=None) if float_output else config


def xnnpack_quantizer(*, per_channel: bool = True, dynamic: bool = False, float_output: bool = False) -> Any:
    """ExecuTorch's own XNNPACKQuantizer with a global symmetric config (``float_output``: no output q)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer

    return XNNPACKQuantizer().set_global(_config(per_channel, dynamic, float_output))


def xnnguard_quantizer(*, per_channel: bool = True, dynamic: bool = False) -> Any:
    """``xnnguard.XNNPACKQuantizer`` with the same global config: the README's flow."""
    import xnnguard

    return xnnguard.XNNPACKQuantizer().set_global(_config(per_channel, dynamic, False))


def quantize_pt2e(
    model: torch.nn.Module | torch.export.ExportedProgram,
    inputs: tuple[torch.Tensor, ...],
    quantizer: Any,
) -> torch.fx.GraphModule:
    """Export for quantization (unless given a program), prepare, calibrate on ``inputs``, convert (torchao pt2e)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if isinstance(model, torch.export.ExportedProgram):
        exported = model.module()
    else:
        exported = torch.export.export(model.eval(), inputs).module()
    prepared = prepare_pt2e(exported, quantizer)
    prepared(*inputs)
    return convert_pt2e(prepared)
