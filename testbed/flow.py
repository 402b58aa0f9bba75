"""The one lowering flow of the tests: export -> rewrite -> quantize -> lower -> load -> run -> compare.

``lower_and_run`` takes a model (or an exported program) through xnnguard's flow, or parts of it, and
returns the program, what it computed, its reference and the tolerance ``testbed.tolerance`` gives:

* float: the reference is eager PyTorch;
* fp16: the model cast to half (a copy: the caller's stays float32) and half inputs; the reference is the
  half model run eagerly (``half_reference``), the tolerance what fp16 rounding allows (against the float32
  model as well);
* int8: pt2e after the rewrite (the README's order), calibrated on the inputs; the reference is the
  converted pt2e model, which isolates what lowering and the runtime change from what quantization does.

``dynamic_batch=(1, 3)`` exports with a dynamic batch (``Dim("batch")`` on every input's first dim) and also
runs the program at those batches, on inputs drawn like the given ones. A stage that fails raises
``FlowError`` naming it; ``Run`` carries the rewriter's and the partitioner's reports.

Whole networks go through ``testbed.network_flow``, which runs the same steps and records each stage.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.fx.passes.infra.pass_base import PassBase
from torch.utils._python_dispatch import TorchDispatchMode

from testbed.fp16_kernels import call_in_half, kernel_error_outputs
from testbed.lowered import Lowered, lower
from testbed.quantize import Precision, is_dynamic, quantize_pt2e, xnnguard_quantizer, xnnpack_quantizer
from testbed.rounding_floor import one_step_errors
from testbed.tolerance import dynamic_step, float_tolerance, fp16_tolerance, int8_tolerance

__all__ = ["STAGES", "Each", "FlowError", "Inputs", "Run", "half_reference", "lower_and_run", "rewritten"]

Quantizer = Literal["xnnguard", "stock"]
# What lower_and_run does, in order; a FlowError names one. "eager" and "export" are the model's own
# (PyTorch runs or exports it); "reexport" exports the converted int8 model for lowering.
STAGES = ("eager", "export", "rewrite", "quantize", "reexport", "lower", "load", "run")
# A dynamic batch's range (a batch of 1 would be specialized away as an example, not as a run).
MAX_BATCH = 8


class Each(torch.nn.Module):
    """Each model on its own input: several small programs lowered (and compared) as one."""

    def __init__(self, models: Sequence[torch.nn.Module]) -> None:
        super().__init__()
        self.models = torch.nn.ModuleList(models)

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(model(x) for model, x in zip(self.models, xs))


class FlowError(Exception):
    """A stage of ``lower_and_run`` failed: ``stage`` names it (one of ``STAGES``), the cause is chained.

    ``lowered``: the program, when the failure came after lowering (at load or run).
    """

    def __init__(self, stage: str, cause: BaseException, lowered: Lowered | None = None) -> None:
        super().__init__(f"{stage} failed: {type(cause).__name__}: {cause}")
        self.stage = stage
        self.lowered = lowered


@contextmanager
def _stage(name: str, lowered: Lowered | None = None) -> Iterator[None]:
    try:
        yield
    except FlowError:
        raise
    except Exception as error:
        raise FlowError(name, error, lowered) from error


@dataclass
class Run:
    """A lowered program's outputs on the inputs it was made with, its references and the tolerance.

    Unpacks as ``lowered, out, reference, tolerance`` (the first output and reference). Under a dynamic
    batch ``outputs`` and ``references`` hold those of every batch run, one after another.
    ``rewrite_report``: the rewriter's records (what it left as it was); ``kept_out``: the partitioner's
    ``report`` (every node left outside XNNPACK, and why), when it has one.
    """

    lowered: Lowered
    outputs: list[torch.Tensor]
    references: list[torch.Tensor]
    tolerance: float
    rewrite_report: list[Any] = field(default_factory=list)
    kept_out: list[Any] = field(default_factory=list)

    @property
    def out(self) -> torch.Tensor:
        return self.outputs[0]

    @property
    def reference(self) -> torch.Tensor:
        return self.references[0]

    def __iter__(self) -> Iterator[Any]:
        return iter((self.lowered, self.out, self.reference, self.tolerance))

    def max_error(self) -> float:
        return max(float((out.float() - ref.float()).abs().max()) for out, ref in zip(self.outputs, self.references))

    def mismatch(self) -> str | None:
        """Why the outputs do not match their references (count, shape, dtype, error), or None when they do."""
        if len(self.outputs) != len(self.references):
            return f"{len(self.outputs)} outputs, the reference has {len(self.references)}"
        for i, (out, ref) in enumerate(zip(self.outputs, self.references)):
            if out.shape != ref.shape:
                return f"output {i} has shape {tuple(out.shape)}, the reference {tuple(ref.shape)}"
            if out.dtype != ref.dtype:
                return f"output {i} is {out.dtype}, the reference {ref.dtype}"
        error = self.max_error()
        if not error <= self.tolerance:  # a NaN is a mismatch too
            return f"max error {error:.3g} > tolerance {self.tolerance:.3g}"
        return None

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


def _float64_outputs(eager: torch.nn.Module, runs: list[tuple[torch.Tensor, ...]]) -> list[torch.Tensor] | None:
    """The model's outputs in float64 (a copy of it), or None where it does not run in float64."""
    try:
        model = copy.deepcopy(eager).double()
        with torch.no_grad():
            return [out for run in runs
                    for out in _as_list(model(*(x.double() if x.is_floating_point() else x for x in run)))]
    except Exception:  # an op without a float64 kernel, a float32 constant built in forward: no bound
        return None


def _as_list(value: Any) -> list[torch.Tensor]:
    return [v.detach() for v in value] if isinstance(value, (tuple, list)) else [value.detach()]


class _HalfOpsInFloat32(TorchDispatchMode):
    """Runs an op PyTorch has no float16 CPU kernel for (``avg_pool3d``) on float32 copies, rounded back."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return call_in_half(func, args, kwargs or {})


def half_reference(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Any:
    """``model(*inputs)`` in eager float16: the reference of a float16 program.

    PyTorch computes its float16 CPU ops in float32 and rounds each result once; an op it has no float16
    CPU kernel for (``avg_pool3d``) is computed the same way here: on float32 copies, rounded to float16.
    """
    with torch.no_grad(), _HalfOpsInFloat32():
        return model(*inputs)


def _half(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(x.half() if x.is_floating_point() else x for x in inputs)


def _at_batch(inputs: tuple[torch.Tensor, ...], batch: int) -> tuple[torch.Tensor, ...]:
    """Inputs like ``inputs`` at another batch: float ones drawn anew (seeded), others their rows repeated."""
    generator = torch.Generator().manual_seed(batch)
    drawn = []
    for x in inputs:
        if x.is_floating_point():
            drawn.append(torch.randn(batch, *x.shape[1:], generator=generator).to(x.dtype))
        else:
            drawn.append(x[torch.arange(batch) % x.shape[0]])
    return tuple(drawn)


def _rewriter(rewrite: bool | Sequence[PassBase] | Callable[..., Any]) -> Any:
    """The rewriter ``rewrite`` asks for: a strict one of its own (every rewrite or the passes given), or that one."""
    import xnnguard

    if callable(rewrite) and not isinstance(rewrite, PassBase):
        return rewrite
    passes = None if rewrite is True else list(rewrite)  # type: ignore[arg-type]
    return xnnguard.XnnpackRewriter(passes, strict=True)


def lower_and_run(
    model: torch.nn.Module | torch.export.ExportedProgram,
    inputs: Inputs,
    precision: Precision = "float",
    *,
    rewrite: bool | Sequence[PassBase] | Callable[..., Any] = True,
    quantizer: Quantizer | object = "xnnguard",
    partitioner: Any = None,
    via_to_backend: bool = False,
    transform_passes: Sequence[Any] = (),
    dynamic_batch: Sequence[int] = (),
) -> Run:
    """Rewrite (``rewrite``: all rewrites, none, these passes, or this ``XnnpackRewriter``, whose ``report``
    the caller can read even when a later stage fails), quantize (with xnnguard's or the stock XNNPACK
    quantizer, per channel, or the quantizer given), lower with ``partitioner`` (default:
    ``xnnguard.XnnpackPartitioner()``), run. ``precision`` also picks the tolerance (float, fp16, static or
    dynamic int8). ``dynamic_batch``: export with a dynamic batch, run at these batches too.
    """
    import xnnguard

    inputs = _tuple(inputs)
    if precision == "fp16":
        if isinstance(model, torch.export.ExportedProgram):
            raise ValueError("lower_and_run casts the model to fp16 itself: give it the float32 module, not a program")
        float_model = model.eval()
        model, inputs = copy.deepcopy(float_model).half(), _half(inputs)
    eager = model.module() if isinstance(model, torch.export.ExportedProgram) else model.eval()
    runs = [inputs, *(_at_batch(inputs, batch) for batch in dynamic_batch)]
    dynamic_shapes = None
    if dynamic_batch:
        batch = torch.export.Dim("batch", min=1, max=max(MAX_BATCH, *dynamic_batch))
        dynamic_shapes = tuple({0: batch} for _ in inputs)
    with _stage("eager"), torch.no_grad():
        forward = (lambda *run: half_reference(eager, run)) if precision == "fp16" else eager
        float_outputs = [out for run in runs for out in _as_list(forward(*run))]
    with _stage("export"):
        ep = (model if isinstance(model, torch.export.ExportedProgram)
              else torch.export.export(eager, inputs, dynamic_shapes=dynamic_shapes))
    rewriter = _rewriter(rewrite) if rewrite is not False else None
    if rewriter is not None:
        with _stage("rewrite"):
            ep = rewriter(ep)
    partitioner = partitioner if partitioner is not None else xnnguard.XnnpackPartitioner()
    if precision in ("float", "fp16"):
        references = float_outputs
        with _stage("lower"):
            lowered = lower(ep, inputs, partitioner, via_to_backend=via_to_backend, transform_passes=transform_passes)
        if precision == "fp16":
            with _stage("eager"), torch.no_grad():
                float32 = [out for run in runs for out in _as_list(float_model(*(x.float() for x in run)))]
                moved = [_as_list(out) for run in runs for out in zip(*(
                    _as_list(trial) for trial in kernel_error_outputs(eager, run)))]
            tolerance = max(fp16_tolerance(ref, flt, kernels) for ref, flt, kernels in zip(references, float32, moved))
        else:
            exact = _float64_outputs(eager, runs)
            tolerance = max(float_tolerance(ref, ex) for ref, ex in zip(references, exact or [None] * len(references)))
    else:
        dynamic = is_dynamic(precision)
        if quantizer == "xnnguard":
            chosen = xnnguard_quantizer(dynamic=dynamic)
        elif quantizer == "stock":
            chosen = xnnpack_quantizer(dynamic=dynamic)
        else:
            chosen = quantizer
        with _stage("quantize"):
            converted = quantize_pt2e(ep, inputs, chosen)
            with torch.no_grad():
                references = [out for run in runs for out in _as_list(converted(*run))]
            activation_step = dynamic_step(converted, runs) if dynamic else 0.0
            one_step = [] if dynamic else [error for run in runs for error in one_step_errors(converted, run)]
        with _stage("reexport"):
            program = torch.export.export(converted, inputs, dynamic_shapes=dynamic_shapes)
        with _stage("lower"):
            lowered = lower(program, inputs, partitioner, via_to_backend=via_to_backend,
                            transform_passes=transform_passes)
        tolerance = max(int8_tolerance(converted, ref, dynamic=dynamic, float_reference=flt,
                                       activation_step=activation_step, one_step=moved)
                        for ref, flt, moved in zip(references, float_outputs, one_step or [0.0] * len(references)))
    outputs = _load_and_run(lowered, runs)
    return Run(lowered, outputs, references, tolerance,
               rewrite_report=list(getattr(rewriter, "report", [])),
               kept_out=list(getattr(partitioner, "report", [])))


def _load_and_run(lowered: Lowered, runs: list[tuple[torch.Tensor, ...]]) -> list[torch.Tensor]:
    """Load the program with the real runtime (every method: XNNPACK builds its graphs here), run it on each input."""
    from xnnguard.boundary.runtime import load_module

    with _stage("load", lowered):
        module = load_module(lowered.buffer)  # lowered keeps the bytes alive as long as the module
    with _stage("run", lowered):
        return [out for run in runs for out in module.forward(run)[lowered.user_outputs]]
