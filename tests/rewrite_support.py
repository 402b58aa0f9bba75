"""Helpers shared by the rewrite tests: rewrite, quantize (pt2e, after the rewrite), lower, run, compare."""

from __future__ import annotations

from typing import Literal

import torch
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

import xnnguard
from tests.support import Lowered, lower, quant_step, run_pte
from xnnguard.rewrite.rewrite_for_xnnpack import rewrite_for_xnnpack
from xnnguard.rules.rank_limit import exceeds_rank_limit

Precision = Literal["float", "static int8", "dynamic int8"]
PRECISIONS: tuple[Precision, ...] = ("float", "static int8", "dynamic int8")


def rewritten(model: torch.nn.Module, x: torch.Tensor) -> torch.export.ExportedProgram:
    return rewrite_for_xnnpack(torch.export.export(model.eval(), (x,)), strict=True)


def ops(ep: torch.export.ExportedProgram) -> set[str]:
    """Short names of the ATen ops of ``ep`` (``conv3d``, ``max_pool2d``...)."""
    return {str(n.target).split(".")[-2] for n in ep.graph.nodes if n.op == "call_function" and "." in str(n.target)}


def max_rank(ep: torch.export.ExportedProgram) -> int:
    ranks = [n.meta["val"].dim() for n in ep.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    return max(ranks)


def assert_within_rank_limit(ep: torch.export.ExportedProgram) -> None:
    assert not exceeds_rank_limit(max_rank(ep)), f"a tensor of {max_rank(ep)} dims"


def quantized_reference(
    ep: torch.export.ExportedProgram, x: torch.Tensor, precision: Precision
) -> torch.fx.GraphModule:
    """pt2e with xnnguard's XNNPACKQuantizer (per channel), applied to the rewritten program: the README's flow."""
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=precision == "dynamic int8")
    quantizer = xnnguard.XNNPACKQuantizer().set_global(config)
    prepared = prepare_pt2e(ep.module(), quantizer)
    prepared(x)
    return convert_pt2e(prepared)


def lower_and_run(
    model: torch.nn.Module, x: torch.Tensor, precision: Precision
) -> tuple[Lowered, torch.Tensor, torch.Tensor, float]:
    """Rewrite, quantize, lower with ``xnnguard.XnnpackPartitioner``, run the .pte.

    Returns (lowered, .pte output, reference, tolerance): the reference is eager float, or the converted
    pt2e model; the tolerance is fp32 rounding, or two quantization steps. A static step is the largest
    activation scale of the converted model (a rounding at a coarse intermediate scale carries through
    views to a finer output scale). Under dynamic quantization XNNPACK picks activation scales per batch row where pt2e
    picks one per tensor, so there a step is the converted model's own largest error against float.
    """
    ep = rewritten(model, x)
    if precision == "float":
        lowered = lower(ep, (x,), xnnguard.XnnpackPartitioner())
        reference = model(x)
        tolerance = 1e-4 * max(1.0, float(reference.abs().max()))
    else:
        converted = quantized_reference(ep, x, precision)
        lowered = lower(torch.export.export(converted, (x,)), (x,), xnnguard.XnnpackPartitioner())
        reference = converted(x)
        if precision == "static int8":
            step = quant_step(converted, reference)
        else:
            step = float((reference - model(x)).abs().max())
        tolerance = 2 * step + 1e-6
    (out,) = run_pte(lowered.buffer, (x,))
    return lowered, out, reference.detach(), tolerance

