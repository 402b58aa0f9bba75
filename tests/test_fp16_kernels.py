"""testbed.fp16_kernels: the float16 error model holds XNNPACK's kernels as they are, and an fp16 program is
judged by how far its kernels move it, not by how far PyTorch's would."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from testbed.flow import half_reference, lower_and_run
from testbed.fp16_kernels import (
    ATTENTION_ULPS,
    NORM_ULPS,
    SOFTMAX_ULPS,
    TRANSCENDENTAL_ULPS,
    accumulation_ulps,
    kernel_error_outputs,
    native_fp16_arithmetic,
)
from testbed.tolerance import FP16_RTOL, fp16_tolerance


class Op(nn.Module):
    def __init__(self, function: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.function = function

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.function(*args)


# One worker: the two kernel tests share each kernel's measurement (``_measured_ulps``).
pytestmark = pytest.mark.xdist_group("fp16_kernels")

_generator = torch.Generator().manual_seed(0)
_WEIGHT = torch.randn(32, 256, generator=_generator) / 16
# name -> (the op, its float32 inputs, the model's average error for it in ulp)
KERNELS = {
    "linear of 256": (lambda x: F.linear(x, _WEIGHT.to(x.dtype)), (torch.randn(64, 256, generator=_generator),),
                      accumulation_ulps(256)),
    "attention weights times values": (lambda a, v: torch.softmax(a, -1) @ v,
                                       (2 * torch.randn(2, 121, 121, generator=_generator),
                                        torch.randn(2, 121, 8, generator=_generator)), accumulation_ulps(121)),
    "softmax": (lambda x: torch.softmax(x, -1), (3 * torch.randn(64, 8, 50, generator=_generator),), SOFTMAX_ULPS),
    "attention": (lambda q: F.scaled_dot_product_attention(q, q * 0.5, q),
                  (torch.randn(2, 4, 40, 16, generator=_generator),), ATTENTION_ULPS),
    "layer norm": (lambda x: F.layer_norm(x, (48,)), (2 * torch.randn(64, 20, 48, generator=_generator) + 1,),
                   NORM_ULPS),
    "tanh": (torch.tanh, (3 * torch.randn(64, 800, generator=_generator),), TRANSCENDENTAL_ULPS),
}


def _ulp(t: torch.Tensor) -> torch.Tensor:
    tiny = torch.finfo(torch.float16).tiny
    return torch.finfo(torch.float16).eps * torch.exp2(torch.floor(torch.log2(t.abs().clamp_min(tiny))))


def _average_ulps(out: torch.Tensor, exact: torch.Tensor) -> float:
    """The root mean square error of ``out`` in ulp of each exact value, over the values within 1/16 of
    the largest (a tiny value's ulp measures the kernel's absolute error, not its relative one)."""
    large = exact.abs() >= exact.abs().max() / 16
    return float((((out.double() - exact) / _ulp(exact))[large] ** 2).mean().sqrt())


@functools.cache
def _measured_ulps(name: str) -> tuple[float, float]:
    """(XNNPACK's average error for kernel ``name`` on this machine, the model's), in ulp; measured once per
    worker for the two tests that read it."""
    function, inputs, modelled = KERNELS[name]
    run = lower_and_run(Op(function), inputs, "fp16")
    assert run.lowered.num_delegates == 1
    with torch.no_grad():
        exact = function(*(x.half().double() for x in inputs))
    return _average_ulps(run.out, exact), modelled


@pytest.mark.skipif(not native_fp16_arithmetic(), reason="the table models native float16 kernels; this CPU "
                    "has F16C conversions only, where XNNPACK computes in float32 (the next test holds there)")
@pytest.mark.parametrize("name", list(KERNELS))
def test_the_model_takes_each_xnnpack_f16_kernels_average_error_within_a_factor_of_2(name: str) -> None:
    measured, modelled = _measured_ulps(name)
    assert measured <= modelled <= 2 * measured, f"{name}: XNNPACK {measured:.2f} ulp, modelled {modelled:.2f}"


@pytest.mark.parametrize("name", list(KERNELS))
def test_the_model_is_an_upper_bound_of_each_xnnpack_f16_kernels_average_error_on_any_cpu(name: str) -> None:
    """What the fp16 tolerance needs to judge no program wrong for its kernels' rounding."""
    measured, modelled = _measured_ulps(name)
    assert measured <= modelled, f"{name}: XNNPACK {measured:.2f} ulp, modelled {modelled:.2f}"


class SoftmaxThenTinyNorm(nn.Module):
    """Fuzz seed 76: a softmax over channels, max-pooled, then a layer norm over two nearly equal values,
    which multiplies the softmax's rounding by up to ``1 / sqrt(eps)``."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.AdaptiveMaxPool2d((5, 2))
        self.norm = nn.LayerNorm(2)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.norm(self.pool(torch.softmax(x, dim=-3))), approximate="tanh")


def test_an_fp16_program_is_judged_by_how_far_its_own_kernels_move_an_ill_conditioned_network() -> None:
    torch.manual_seed(76)
    model, x = SoftmaxThenTinyNorm().eval(), torch.randn(2, 7, 5, 16, generator=torch.Generator().manual_seed(76))
    run = lower_and_run(model, x, "fp16")
    assert run.lowered.num_delegates == 1
    assert run.mismatch() is None, run.mismatch()


class Block(nn.Module):
    """A pre-norm transformer block: well conditioned."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        x = x + self.attention(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.norm(x))


def test_kernel_errors_leave_a_well_conditioned_network_within_a_few_roundings_of_its_scale() -> None:
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(2, 50, 64)
    half, inputs = Block().eval(), (x.half(),)
    half.load_state_dict(model.state_dict())
    half = half.half()
    reference = half_reference(half, inputs)
    with torch.no_grad():
        float_reference = model(x.half().float())
    tolerance = fp16_tolerance(reference, float_reference, kernel_error_outputs(half, inputs))
    scale = max(1.0, float(reference.abs().max()))
    assert tolerance <= 4 * FP16_RTOL * scale, f"{tolerance / scale:.2e} of the output's scale"


def test_a_sum_of_one_term_is_exact_and_longer_sums_grow_like_a_random_walk() -> None:
    assert accumulation_ulps(1) < accumulation_ulps(4)
    assert math.isclose(accumulation_ulps(400) / accumulation_ulps(100), 2.0)
