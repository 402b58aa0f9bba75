"""How far xnnguard's int8 program is from the ideal int8 result of the original, un-rewritten ops.

The ideal: the original model quantized the stock way (ExecuTorch's own XNNPACKQuantizer, which annotates
3-D convolutions too) and run as the converted pt2e model in PyTorch. xnnguard's side: the README's
flow, ``rewrite_for_xnnpack`` -> ``xnnguard.XNNPACKQuantizer`` -> pt2e -> ``xnnguard.XnnpackPartitioner``
-> the real runtime. The distance is measured in quantization steps of the output: the scale of the
ideal program's output quantization (static), or an int8 step over its output range (dynamic, where
quantization is per call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer as StockQuantizer,
    get_symmetric_quantization_config,
)
from torch.fx.passes.infra.pass_base import PassBase
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

import xnnguard
from testbed.lowered import Lowered, lower, run_pte
from xnnguard.quantizer.batch_norm_patterns import only_patterns_that_can_match

Int8 = Literal["static", "dynamic"]

__all__ = [
    "ConvertedPair",
    "Int8",
    "Int8Result",
    "activation_scales",
    "both_converted",
    "converted_pt2e",
    "int8_against_the_original",
    "no_new_scales",
]


@dataclass(frozen=True)
class Int8Result:
    steps: float  # the program's largest distance from the ideal, in output quantization steps
    lowered: Lowered
    quantizer: xnnguard.XNNPACKQuantizer
    scales: frozenset[float]  # the activation quantizations of xnnguard's converted model
    ideal_scales: frozenset[float]  # those of the original model quantized the stock way


def activation_scales(converted: torch.fx.GraphModule) -> frozenset[float]:
    """The scales of every static per-tensor activation quantization: one per rounding point the model has."""
    return frozenset(
        float(f"{n.args[1]:.6g}")
        for n in converted.graph.nodes
        if n.op == "call_function" and "quantize_per_tensor" in str(n.target) and isinstance(n.args[1], float)
    )


def converted_pt2e(module: torch.nn.Module, x: torch.Tensor, quantizer: object) -> torch.fx.GraphModule:
    """``module`` (a graph module from an ExportedProgram) prepared, calibrated on ``x`` and converted."""
    prepared = prepare_pt2e(module, quantizer)  # type: ignore[arg-type]
    prepared(x)
    return convert_pt2e(prepared)


def _output_scale(converted: torch.fx.GraphModule) -> float | None:
    """The scale of the dequantize the output is computed from (through ops after it), if it is static."""
    (output,) = [n for n in converted.graph.nodes if n.op == "output"]
    node = output.args[0][0] if isinstance(output.args[0], (tuple, list)) else output.args[0]
    while node.op == "call_function" and "dequantize" not in str(node.target) and node.all_input_nodes:
        node = node.all_input_nodes[0]
    scale = node.args[1] if "dequantize_per_tensor" in str(node.target) else None
    return float(scale) if isinstance(scale, float) else None


@dataclass(frozen=True)
class ConvertedPair:
    """The original quantized the stock way (``ideal``), and xnnguard's rewritten program quantized by its
    quantizer (``converted``), both calibrated on the same input: what a comparison of the two starts from."""

    ideal: torch.fx.GraphModule
    converted: torch.fx.GraphModule
    quantizer: xnnguard.XNNPACKQuantizer
    shapes: object = None  # the dynamic shapes both were exported with

    def scales(self) -> tuple[frozenset[float], frozenset[float]]:
        """The activation scales of xnnguard's int8 model and of the original's."""
        return activation_scales(self.converted), activation_scales(self.ideal)


def both_converted(
    model: torch.nn.Module, x: torch.Tensor, mode: Int8, rewrites: list[PassBase] | None = None,
    *, dynamic_batch: bool = False,
) -> ConvertedPair:
    """The original quantized the stock way, and xnnguard's rewritten program quantized by its quantizer.

    ``dynamic_batch``: both exported with a dynamic batch (``x``'s, at least 2).
    """
    shapes = ({0: torch.export.Dim("batch", min=1, max=8)},) if dynamic_batch else None
    model = model.eval()
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=mode == "dynamic")
    original = torch.export.export(model, (x,), dynamic_shapes=shapes).module()
    stock = StockQuantizer().set_global(config)
    # The stock annotation without tracing conv + batch norm patterns that cannot match a graph without
    # a batch norm (3 s a prepare); tests/test_quantizer.py checks that this leaves the annotation as is.
    with only_patterns_that_can_match(stock, original):
        ideal_model = converted_pt2e(original, x, stock)
    quantizer = xnnguard.XNNPACKQuantizer().set_global(config)
    rewritten = xnnguard.XnnpackRewriter(rewrites, strict=True)(torch.export.export(model, (x,), dynamic_shapes=shapes))
    return ConvertedPair(ideal_model, converted_pt2e(rewritten.module(), x, quantizer), quantizer, shapes)


def int8_against_the_original(
    model: torch.nn.Module,
    x: torch.Tensor,
    mode: Int8,
    rewrites: list[PassBase] | None = None,
    *,
    dynamic_batch: bool = False,
    pair: ConvertedPair | None = None,
) -> Int8Result:
    """``rewrites``: the passes xnnguard's side runs (default: all of ``rewrite_for_xnnpack``'s).

    ``dynamic_batch``: both sides are exported with a dynamic batch (``x``'s, at least 2) and compared at
    ``x``, at batch 1 and at one more than ``x``'s; ``steps`` is the largest distance of the three.
    ``pair``: ``both_converted`` of the same arguments, made once for several comparisons.
    """
    pair = pair or both_converted(model, x, mode, rewrites, dynamic_batch=dynamic_batch)
    program = torch.export.export(pair.converted, (x,), dynamic_shapes=pair.shapes)
    lowered = lower(program, (x,), xnnguard.XnnpackPartitioner())
    steps = 0.0
    for inputs in [x, x[:1], torch.cat([x, x[:1]])] if dynamic_batch else [x]:
        with torch.no_grad():
            ideal = pair.ideal(inputs)
        scale = _output_scale(pair.ideal) if mode == "static" else None
        step = scale if scale is not None else float(ideal.max() - ideal.min()) / 255
        (out,) = run_pte(lowered.buffer, (inputs,))
        steps = max(steps, float((out - ideal).abs().max()) / step)
    ideal_scales, scales = activation_scales(pair.ideal), activation_scales(pair.converted)
    return Int8Result(steps, lowered, pair.quantizer, scales, ideal_scales)


def no_new_scales(result: Int8Result, rel: float = 1e-4) -> bool:
    """True when xnnguard's converted model quantizes activations only at scales the original's has.

    Equal up to ``rel``: a rewritten op computes its output with other float roundings (a Conv3d as
    conv2d over frames), so an observer's min/max, and the scale, can differ in the last digits. Fewer
    scales are fine: a rewrite may drop a requantization the original has.
    """
    return all(any(abs(a - b) <= rel * max(a, b) for b in result.ideal_scales) for a in result.scales)


def steps_allowed(
    model: torch.nn.Module, x: torch.Tensor, mode: Int8, family: str, *, dynamic_batch: bool = False
) -> float:
    """How many quantization steps a rewrite family may be off the original quantized: 2, or the floor.

    Dynamic int8: XNNPACK quantizes a linear's input per row where pt2e quantizes it per tensor, so even
    the program with ``family``'s ops left as they were (``family``: its module prefix, such as
    ``xnnguard.rewrite.norm.``) is off the converted pt2e model by a few steps; the rewrite may add float
    rounding to that (a twentieth of a step), nothing more. Static int8: two steps.
    """
    if mode == "static":
        return 2.0
    from xnnguard.rewrite.rewrite_for_xnnpack import default_rewrites

    others = [p for p in default_rewrites(strict=True) if not type(p).__module__.startswith(family)]
    return max(2.0, int8_against_the_original(model, x, mode, others, dynamic_batch=dynamic_batch).steps + 0.05)
