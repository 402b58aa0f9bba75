"""The float16 rewrites (``xnnguard.rewrite.half``): a GELU, and number operands, lowered whole in float16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import xnnguard
from testbed.flow import lower_and_run, rewritten
from xnnguard.rewrite.half import RewriteHalfGeluPass, ScalarOperandsPass

pytestmark = pytest.mark.release_sensitive  # what is refused in float16 is ExecuTorch's configs' decision

X = torch.linspace(-8, 8, 4001).reshape(1, -1)


class Gelu(nn.Module):
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate=self.approximate)


def _float16_step(value: torch.Tensor) -> torch.Tensor:
    """The distance from ``|value|`` (at least 1) to the next float16: one float16 step at its scale."""
    magnitude = value.abs().clamp(min=1).half()
    return (torch.nextafter(magnitude, torch.tensor(float("inf"), dtype=torch.float16)) - magnitude).double()


TANH_FORM_DISTANCE = 4.7e-4  # the most the tanh GELU differs from the erf GELU (at x = -2.7)


def test_a_float16_gelu_runs_on_xnnpack_within_a_float16_step_of_the_exact_gelu_and_the_tanh_forms_distance() -> None:
    run = lower_and_run(Gelu(), X, "fp16")
    assert run.lowered.num_delegates == 1 and not run.lowered.outside_ops()
    exact = F.gelu(X.half().double())
    error = (run.out.double() - exact).abs()
    assert bool((error <= _float16_step(exact) + TANH_FORM_DISTANCE).all()), float(error.max())
    run.assert_matches()


def test_a_float16_tanh_gelu_is_that_form_and_matches_it() -> None:
    run = lower_and_run(Gelu("tanh"), X, "fp16")
    assert run.lowered.num_delegates == 1 and not run.lowered.outside_ops()
    run.assert_matches()


def test_a_float32_gelu_is_left_to_xnnpacks_own_gelu() -> None:
    ep = torch.export.export(Gelu().eval(), (X,))
    assert not RewriteHalfGeluPass().applies_to(ep.module())
    run = lower_and_run(Gelu(), X)
    assert run.lowered.delegated_ops()["gelu"] == 1
    run.assert_matches()


@pytest.mark.parametrize("activation", [nn.SiLU(), nn.Hardsigmoid()], ids=["silu", "hardsigmoid"])
def test_a_float16_activation_decomposed_through_float32_runs_on_xnnpack_with_no_conversion_outside(
    activation: nn.Module,
) -> None:
    run = lower_and_run(nn.Sequential(nn.Linear(8, 8), activation, nn.Linear(8, 8)), torch.randn(4, 8), "fp16")
    assert run.lowered.num_delegates == 1 and not run.lowered.outside_ops(), run.lowered.outside_ops()
    run.assert_matches()


class Arithmetic(nn.Module):
    """Number operands of every kind the pass takes: mul, add (an int), div, sub, rsub."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (x * 0.5 + 1) / 3 - 0.25
        return torch.rsub(y, 2.0)


def test_the_number_operands_of_float16_ops_become_float16_constants_and_nothing_runs_outside() -> None:
    x = torch.randn(4, 8)
    program = rewritten(Arithmetic().half(), x.half(), [ScalarOperandsPass()])
    assert not [n for n in program.graph.nodes if n.op == "call_function" and any(
        isinstance(arg, (int, float)) for arg in n.args)]
    run = lower_and_run(Arithmetic(), x, "fp16")
    assert run.lowered.num_delegates == 1 and not run.lowered.outside_ops(), run.lowered.outside_ops()
    run.assert_matches()


def test_a_float32_programs_number_operands_stay_numbers() -> None:
    ep = torch.export.export(Arithmetic().eval(), (torch.randn(4, 8),))
    assert not ScalarOperandsPass().applies_to(ep.module())
    assert xnnguard.XnnpackRewriter([ScalarOperandsPass()])(ep).graph_module.code == ep.graph_module.code
