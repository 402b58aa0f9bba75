"""The one lowering flow of the tests: export -> rewrite -> quantize -> lower -> load -> run -> compare.

``lower_and_run`` takes a model (or an exported program) through xnnguard's flow, or parts of it, and
returns the program, what it computed, its reference and the tolerance ``testbed.tolerance`` gives:

* float: the reference is eager PyTorch;
* int8: pt2e after the rewrite (the README's order), calibrated on the inputs; the reference is the
  converted pt2e model, which isolates what lowering and the runtime change from what quantization does.

Whole networks go through ``testbed.network_flow``, which runs the same steps and records each stage.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.fx.passes.infra.pass_base import PassBase

from testbed.lowered import Lowered, lower, run_pte
from testbed.quantize import Precision, is_dynamic, quantize_pt2e, xnnguard_quantizer, xnnpack_quantizer
from testbed.tolerance import float_tolerance, int8_tolerance

__all__ = ["Inputs", "Run", "lower_and_run", "rewritten"]

Quantizer = Literal["xnnguard", "stock"]


@dataclass
class Run:
    """A lowered program's outputs on the inputs it was made with, its references and the tolerance.

    Unpacks as ``lowered, out, reference, tolerance`` (the first output and reference).
    """

    lowered: Lowered
    outputs: list[torch.Tensor]
    references: list[torch.Tensor]
    tolerance: float

    @property
    def out(self) -> torch.Tensor:
        return self.outputs[0]

    @property
    def reference(self) -> torch.Tensor:
        return self.references[0]

    def __iter__(self) -> Iterator[Any]:
        return iter((self.lowered, self.out, self.reference, self.tolerance))

    def max_error(self) -> float:
        return max(float((out - ref).abs().max()) for out, ref in zip(self.outputs, self.references))

    def assert_matches(self) -> None:
        """Every output within the tolerance of its reference (as many outputs as the reference has)."""
        assert len(self.outputs) == len(self.references), (len(self.outputs), len(self.references))
        for out, ref in zip(self.outputs, self.references):
            torch.testing.assert_close(out, ref, atol=self.tolerance, rtol=0)


Inputs = torch.Tensor | tuple[torch.Tensor, ...]


def _tuple(inputs: Inputs) -> tuple[torch.Tensor, ...]:
    return (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)


def rewritten(
    model: torch.nn.Module | torch.export.ExportedProgram,
    inputs: Inputs,
    passes: Sequence[PassBase] | None = None,
) -> torch.export.ExportedProgram:
    """``model`` exported and rewritten (all of ``rewrite_for_xnnpack``, or ``passes``), strictly: a broken
    postcondition raises instead of becoming a record."""
    import xnnguard

    inputs = _tuple(inputs)
    ep = model if isinstance(model, torch.export.ExportedProgram) else torch.export.export(model.eval(), inputs)
    return xnnguard.XnnpackRewriter(list(passes) if passes is not None else None, strict=True)(ep)


def _as_list(value: Any) -> list[torch.Tensor]:
    return [v.detach() for v in value] if isinstance(value, (tuple, list)) else [value.detach()]


def lower_and_run(
    model: torch.nn.Module | torch.export.ExportedProgram,
    inputs: Inputs,
    precision: Precision = "float",
    *,
    rewrite: bool | Sequence[PassBase] = True,
    quantizer: Quantizer | object = "xnnguard",
    partitioner: Any = None,
    via_to_backend: bool = False,
    transform_passes: Sequence[Any] = (),
) -> Run:
    """Rewrite (``rewrite``: all rewrites, none, or these passes), quantize (with xnnguard's or the stock
    XNNPACK quantizer, per channel, or the quantizer given), lower with ``partitioner`` (default:
    ``xnnguard.XnnpackPartitioner()``), run. ``precision`` also picks the int8 tolerance (static or dynamic).
    """
    import xnnguard

    inputs = _tuple(inputs)
    eager = model.module() if isinstance(model, torch.export.ExportedProgram) else model.eval()
    if rewrite is False:
        ep = model if isinstance(model, torch.export.ExportedProgram) else torch.export.export(eager, inputs)
    else:
        ep = rewritten(model, inputs, None if rewrite is True else rewrite)
    partitioner = partitioner if partitioner is not None else xnnguard.XnnpackPartitioner()
    with torch.no_grad():
        float_outputs = _as_list(eager(*inputs))
    if precision == "float":
        lowered = lower(ep, inputs, partitioner, via_to_backend=via_to_backend, transform_passes=transform_passes)
        tolerance = max(float_tolerance(reference) for reference in float_outputs)
        return Run(lowered, run_pte(lowered.buffer, inputs), float_outputs, tolerance)
    dynamic = is_dynamic(precision)
    if quantizer == "xnnguard":
        chosen = xnnguard_quantizer(dynamic=dynamic)
    elif quantizer == "stock":
        chosen = xnnpack_quantizer(dynamic=dynamic)
    else:
        chosen = quantizer
    converted = quantize_pt2e(ep, inputs, chosen)
    with torch.no_grad():
        references = _as_list(converted(*inputs))
    program = torch.export.export(converted, inputs)
    lowered = lower(program, inputs, partitioner, via_to_backend=via_to_backend, transform_passes=transform_passes)
    tolerance = max(int8_tolerance(converted, ref, dynamic=dynamic, float_reference=flt)
                    for ref, flt in zip(references, float_outputs))
    return Run(lowered, run_pte(lowered.buffer, inputs), references, tolerance)
