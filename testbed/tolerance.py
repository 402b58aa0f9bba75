"""How close a lowered program must come to its reference: one policy for float, one for fp16, one for int8.

* **float**: the program against eager PyTorch, within ``FLOAT_RTOL`` of the reference's scale (its largest
  magnitude, at least 1): XNNPACK sums in other orders and fuses, nothing more may differ; or, where eager
  float32 is itself further from the float64 model (an ill-conditioned op: a group norm of one element
  multiplies its rounding by ``1/sqrt(eps)``), within ``FLOAT_SLACK`` times that distance.
* **fp16**: the half program against the half model run eagerly, within what fp16 rounding allows: the
  larger of ``FP16_RTOL`` of the reference's scale and ``FP16_SLACK`` times how far fp16 kernels move
  the model from float32 on the same (half) inputs: PyTorch's (eager fp16 itself) or XNNPACK's
  (``testbed.fp16_kernels``: eager fp16 with each op's result moved by its XNNPACK kernel's measured
  error). Both sides round every op's output to fp16, but PyTorch's CPU kernels accumulate in float32
  and round once, where XNNPACK's GEMMs accumulate in fp16 and its softmax takes a coarse ``exp``: a
  norm or softmax after a softmax amplifies those differences (fuzz seeds 17, 76, 116, 126, 133 were
  2 to 5 times eager's own distance from float32 off). One op's difference is a few roundings at the
  output's scale (``FP16_RTOL`` is eight of them); a program rounding elsewhere than eager is as far
  from float32 again, hence ``FP16_SLACK``. A wrong program (a wrong channel, a missed mask, an op
  computed in the wrong layout) is off by the values' own scale, orders above either bound.
* **int8**: the program against the converted pt2e model, within ``INT8_STEPS`` quantization steps. A
  step is the converted model's largest static activation scale (a rounding at a coarse scale carries
  through views to a finer output scale). Or, where the network amplifies a step (a norm of nearly equal
  values divides it by their spread: fuzz seeds 390, 453), within what one element of each activation
  moved by one step moves the converted model's output (``testbed.rounding_floor.one_step_errors``):
  XNNPACK and pt2e round a value near the middle between two steps to different sides now and then.
  Under dynamic quantization XNNPACK picks activation scales per
  batch row where pt2e picks one per tensor, so a step is also at least the converted model's own largest
  error against float, at least an int8 step over the output's range, and at least the largest scale the
  converted model's dynamic quantization picks on the inputs (``dynamic_step``): the static policy's step
  with the scales chosen at run time. Without it a one-element output (a linear max-pooled to one value,
  fuzz seed 132) has no range, and its reference's distance from float is one rounding's luck.

A whole network (``NetworkVerdict``) is judged by the same two policies, relative to its output's scale,
with the tolerance a deep network needs (``NETWORK_TOLERANCE``) and, in int8, the rounding floor
(``testbed.rounding_floor``): what one-step rounding differences alone move its output by.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "FLOAT_RTOL",
    "FLOAT_SLACK",
    "FP16_RTOL",
    "FP16_SLACK",
    "INT8_STEPS",
    "MASK_SCALE",
    "MAX_ERR_SLACK",
    "NETWORK_TOLERANCE",
    "dynamic_step",
    "float_tolerance",
    "fp16_tolerance",
    "int8_tolerance",
    "mean_relative_error",
    "network_matches",
    "quant_step",
    "relative_error",
]

FLOAT_RTOL = 1e-5
FLOAT_SLACK = 2.0
FP16_RTOL = 2**-8  # eight fp16 unit roundoffs (2**-11) of the output's scale
FP16_SLACK = 2.0
INT8_STEPS = 2
MASK_SCALE = 2.0**64  # no activation a network computes spans 255 * 2^64; a mask's fill value does
# Whole networks, relative to the output's largest magnitude: float through dozens of layers; fp16 the
# same against eager float16 (its own rounding is 2^-11, ten float16 steps over dozens of layers); int8
# also within its rounding floor when that is larger (testbed.rounding_floor).
NETWORK_TOLERANCE = {"float": 1e-3, "fp16": 1e-2, "static": 0.05, "dynamic": 0.05}
# Dynamic int8 also matches as close to float as its reference: the max error up to this many times the
# reference's, the mean error no larger (see network_matches).
MAX_ERR_SLACK = 2.0


def _scale(reference: torch.Tensor) -> float:
    return max(1.0, float(reference.detach().abs().max()))


def float_tolerance(reference: torch.Tensor, exact_reference: torch.Tensor | None = None) -> float:
    """The largest error a float program may have against eager ``reference``.

    ``exact_reference``: the model's output in float64 on the same inputs, when it could be computed.
    """
    if exact_reference is None:
        return FLOAT_RTOL * _scale(reference)
    rounding = float((reference.double() - exact_reference.double()).abs().max())
    return max(FLOAT_RTOL * _scale(reference), FLOAT_SLACK * rounding)


def fp16_tolerance(
    reference: torch.Tensor, float_reference: torch.Tensor | None = None, kernels: Sequence[torch.Tensor] = ()
) -> float:
    """The largest error an fp16 program may have against ``reference``, the half model's eager output.

    ``float_reference``: the float32 model's output on the same inputs (the half inputs, cast to float32);
    without it (one op, whose fp16 rounding is a few steps), ``FP16_RTOL`` of the reference's scale.
    ``kernels``: the half model's outputs with XNNPACK's float16 kernel errors propagated
    (``testbed.fp16_kernels``); the program may be as far from float32 as they are.
    """
    if float_reference is None:
        return FP16_RTOL * _scale(reference)
    rounding = max(float((out.float() - float_reference.float()).abs().max()) for out in (reference, *kernels))
    return max(FP16_RTOL * _scale(reference), FP16_SLACK * rounding)


def quant_step(converted: torch.fx.GraphModule, expected: torch.Tensor) -> float:
    """One quantization step of ``converted``: its largest static activation scale.

    Scales above ``MASK_SCALE`` are left out: they quantize an attention mask's fill value (``finfo.min``,
    a scale near 1e36), whose rounding selects what a softmax drops and never reaches the output; taken
    as a step, it made any error pass (fuzz seed 17).

    A dynamically quantized model has no static scale; there a step is that of an int8 grid over the
    range of the expected output.
    """
    scales = [
        float(node.args[1])
        for node in converted.graph.nodes
        if node.op == "call_function"
        and "quantize_per_tensor" in str(node.target)
        and isinstance(node.args[1], (int, float))
        and float(node.args[1]) <= MASK_SCALE
    ]
    if scales:
        return max(scales)
    return float(expected.max() - expected.min()) / 255


def dynamic_step(converted: torch.fx.GraphModule, runs: Sequence[Sequence[torch.Tensor]]) -> float:
    """The largest activation scale ``converted``'s dynamic quantization (its ``choose_qparams``) picks on ``runs``.

    XNNPACK picks a scale per row no coarser than this one per tensor (a row's range is within the
    tensor's), so each side rounds an activation by at most half of it: the dynamic counterpart of a
    static model's largest activation scale. 0 for a model without dynamic quantization.
    """
    scales: list[float] = []

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            result = super().run_node(n)
            if n.op == "call_function" and "choose_qparams" in str(n.target):
                scales.append(float(result[0].max()))
            return result

    with torch.no_grad():
        for run in runs:
            Recorder(converted).run(*run)
    return max(scales, default=0.0)


def int8_tolerance(
    converted: torch.fx.GraphModule,
    reference: torch.Tensor,
    *,
    dynamic: bool,
    float_reference: torch.Tensor | None = None,
    activation_step: float = 0.0,
    one_step: float = 0.0,
) -> float:
    """The largest error an int8 program may have against ``reference``, the converted model's output.

    ``float_reference``: the float model's output, which a dynamic program's step is measured against.
    ``activation_step``: in dynamic int8, ``dynamic_step`` of the converted model on the inputs.
    ``one_step``: in static int8, how far one-step moves of its activations move this output
    (``testbed.rounding_floor.one_step_errors``).
    """
    step = quant_step(converted, reference)
    if dynamic:
        step = max(step, activation_step)
    if dynamic and float_reference is not None:
        # XNNPACK and the reference each round the activations at scales of their own: a program as close to
        # float as MAX_ERR_SLACK times the reference's distance is, by the triangle inequality, up to
        # 1 + MAX_ERR_SLACK times that distance from the reference (where their errors have opposite signs)
        distance = float((reference - float_reference).detach().abs().max())
        return max(INT8_STEPS * step, (1 + MAX_ERR_SLACK) * distance) + 1e-6
    return max(INT8_STEPS * step, one_step) + 1e-6


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float | None:
    """Max abs error over the expected output's max abs value (None when the shapes differ)."""
    if got.shape != expected.shape:
        return None
    return (got - expected).abs().max().item() / max(expected.abs().max().item(), 1e-6)


def mean_relative_error(got: torch.Tensor, expected: torch.Tensor) -> float | None:
    """Mean abs error over the expected output's max abs value (None when the shapes differ)."""
    if got.shape != expected.shape:
        return None
    return (got - expected).abs().mean().item() / max(expected.abs().max().item(), 1e-6)


def network_matches(
    precision: str,
    max_err: float | None,
    tolerance: float,
    *,
    float_err: float | None = None,
    reference_float_err: float | None = None,
    float_mean_err: float | None = None,
    reference_float_mean_err: float | None = None,
) -> bool:
    """Within ``tolerance`` of the reference; in dynamic int8, or as close to float as the reference is.

    XNNPACK's dynamically quantized conv picks quantization parameters per image of the batch, the
    converted model one per tensor (measured: a conv on a batch of four images of ranges 0.01 to 10 is
    1e-4 from float on XNNPACK, 1.6e-2 in the converted model). Where frames are folded into the batch
    (a video VAE) XNNPACK then rounds other elements than the reference it is compared with; that is
    ExecuTorch's dynamic quantization, not a wrong program. "As close": no larger a mean error against
    float than the reference's (the program as a whole), and a max error at most ``MAX_ERR_SLACK`` times
    the reference's (no element far off: a wrong channel or frame would be). The max alone is one
    element: the test-size VAE is 8.7 % from float at its worst element, the reference 7.4 %, while the
    program's mean error is the smaller (0.54 % against 0.57 %).
    """
    if max_err is not None and max_err <= tolerance:
        return True
    if precision != "dynamic":
        return False
    errors = (float_err, reference_float_err, float_mean_err, reference_float_mean_err)
    if any(error is None for error in errors):
        return False
    worst, reference_worst, mean, reference_mean = errors
    return mean <= reference_mean and worst <= MAX_ERR_SLACK * reference_worst  # type: ignore[operator]
