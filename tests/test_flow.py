"""testbed.flow: fp16 programs against the half model, a dynamic batch run at other batches, failures named by stage."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from testbed.flow import FlowError, lower_and_run
from testbed.tolerance import (
    FLOAT_RTOL,
    FLOAT_SLACK,
    FP16_RTOL,
    FP16_SLACK,
    MASK_SCALE,
    MAX_ERR_SLACK,
    float_tolerance,
    fp16_tolerance,
    quant_step,
)


class ConvHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(8 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def test_an_fp16_program_runs_in_half_and_matches_the_half_model() -> None:
    model, x = ConvHead().eval(), torch.randn(2, 3, 8, 8)
    run = lower_and_run(model, x, "fp16")
    assert run.out.dtype == torch.float16 and run.reference.dtype == torch.float16
    assert run.lowered.num_delegates == 1 and run.mismatch() is None
    with torch.no_grad():
        expected = model.half()(x.half())  # the caller's model was left float32 by the flow; cast it now
    assert torch.equal(run.reference, expected)


def test_the_fp16_flow_leaves_the_callers_model_in_float32() -> None:
    model = ConvHead().eval()
    lower_and_run(model, torch.randn(1, 3, 8, 8), "fp16")
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_the_fp16_tolerance_is_a_few_roundings_of_the_output_scale_at_least() -> None:
    reference = torch.tensor([4.0, -2.0], dtype=torch.float16)
    assert fp16_tolerance(reference, reference.float()) == FP16_RTOL * 4.0


def test_the_fp16_tolerance_grows_with_how_far_fp16_moves_the_model() -> None:
    reference = torch.tensor([1.0, 0.0], dtype=torch.float16)
    float_reference = torch.tensor([1.0, 0.125])
    assert fp16_tolerance(reference, float_reference) == FP16_SLACK * 0.125


def test_the_float_tolerance_is_a_relative_1e5_of_the_output_scale_at_least() -> None:
    reference = torch.tensor([4.0, -2.0])
    assert float_tolerance(reference, reference.double()) == FLOAT_RTOL * 4.0


def test_the_float_tolerance_grows_with_how_far_float32_eager_is_from_float64() -> None:
    reference = torch.tensor([1.0, 0.5])
    exact = torch.tensor([1.0, 0.5 + 2**-10], dtype=torch.float64)
    assert float_tolerance(reference, exact) == FLOAT_SLACK * 2**-10


def test_a_float_program_of_an_ill_conditioned_op_matches_within_eagers_own_rounding() -> None:
    """A group norm of one element per group is its bias; eager float32 misses it by its rounding times
    ``1/sqrt(eps)`` (about 3e-5, above ``FLOAT_RTOL``): the program is held to the float64 model's bound."""
    torch.manual_seed(0)
    norm = nn.GroupNorm(8, 8).eval()
    nn.init.uniform_(norm.bias, -0.5, 0.5)
    x = torch.randn(2, 8, 1) * 4
    run = lower_and_run(norm, x, "float")
    assert run.tolerance > FLOAT_RTOL
    run.assert_matches()


class AmaxRmsNorm(nn.Module):
    """Fuzz seed 52: a transposed Conv3d, frames folded into the batch, an amax, an RMS norm over 13 values."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose3d(4, 7, kernel_size=(2, 3, 3), stride=(1, 2, 1), padding=(0, 2, 1))
        self.bn = nn.BatchNorm3d(7)
        nn.init.uniform_(self.bn.weight, 0.5, 1.5)
        nn.init.uniform_(self.bn.bias, -0.5, 0.5)
        nn.init.uniform_(self.bn.running_mean, -0.5, 0.5)
        nn.init.uniform_(self.bn.running_var, 0.5, 2.0)
        self.norm = nn.RMSNorm(13, eps=1e-6)
        nn.init.uniform_(self.norm.weight, 0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x))).permute(0, 2, 1, 3, 4).reshape(-1, 7, 13, 2)
        return self.norm(y.amax(dim=3))


# Slow (25 s): the rewrite families' dynamic-int8 rows make the same comparison, and the step it allows is
# checked by test_a_dynamic_int8_step_is_at_least_the_activation_scale_its_quantization_picks.
@pytest.mark.slow
def test_a_dynamic_int8_program_as_close_to_float_as_its_reference_matches_it() -> None:
    """The RMS norm magnifies each side's activation rounding: program and reference land on opposite sides
    of float at one element, each within the dynamic rule's distance of it."""
    torch.manual_seed(52)
    model = AmaxRmsNorm().eval()
    x = torch.randn(2, 4, 3, 8, 2, generator=torch.Generator().manual_seed(52))
    run = lower_and_run(model, x, "dynamic int8")
    with torch.no_grad():
        float_out = model(x)
    program, reference = (float((t - float_out).abs().max()) for t in (run.out, run.reference))
    assert program <= MAX_ERR_SLACK * reference
    run.assert_matches()


class LinearPooledToOneValue(nn.Module):
    """Fuzz seed 132: a linear over four rows of six, max-pooled to the first row's one output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 1)
        self.pool = nn.MaxPool3d(kernel_size=(1, 2, 1), stride=(2, 1, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.fc(x))


def test_a_dynamic_int8_step_is_at_least_the_activation_scale_its_quantization_picks() -> None:
    """XNNPACK rounds the row at its own scale (0.0120), the reference at the tensor's (0.0142): 0.6694 and
    0.6652 against float's 0.6664. One output has no range, and the reference's 0.0012 from float is one
    rounding's luck (its worst row before the pool is 0.0038 off), so only the tensor's scale bounds it."""
    torch.manual_seed(132)
    x = torch.randn(1, 1, 2, 2, 6, generator=torch.Generator().manual_seed(132))
    run = lower_and_run(LinearPooledToOneValue().eval(), x, "dynamic int8")
    tensor_scale = float(x.max() - x.min()) / 255  # x spans zero: choose_qparams' range is its own
    assert run.mismatch() is None
    assert run.tolerance >= 2 * tensor_scale * (1 - 1e-3)


def test_an_fp16_program_computing_the_wrong_thing_does_not_match() -> None:
    """The tolerance is rounding's, not a program's mistake: the same conv fed another input is far off."""
    model, x = ConvHead().eval(), torch.randn(2, 3, 8, 8)
    run = lower_and_run(model, x, "fp16")
    from testbed.lowered import run_pte

    run.outputs = run_pte(run.lowered.buffer, (x.flip(0).half(),))
    assert run.mismatch() is not None and run.mismatch().startswith("max error")  # type: ignore[union-attr]


def test_the_int8_step_leaves_out_the_scale_of_a_masks_fill_value() -> None:
    """Fuzz seed 17: a mask filled with finfo.min quantized at a scale near 1e36 made any error pass."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    for scale in (0.05, torch.finfo(torch.float32).max / 255):
        x = graph.call_function(torch.ops.quantized_decomposed.quantize_per_tensor.default,
                                (x, scale, 0, -128, 127, torch.int8))
    graph.output(x)
    assert torch.finfo(torch.float32).max / 255 > MASK_SCALE
    assert quant_step(torch.fx.GraphModule(torch.nn.Module(), graph), torch.zeros(1)) == 0.05


class MutatesAView(nn.Module):
    """Fuzz seed 220: an in-place ReLU on a view of the input; ExecuTorch returns the mutated input first."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu_(x.flatten(1)).sum(dim=1, keepdim=True)


def test_a_program_mutating_its_input_is_compared_on_the_models_own_outputs() -> None:
    run = lower_and_run(MutatesAView(), torch.randn(2, 3, 4), "float")
    assert len(run.outputs) == 1 and run.mismatch() is None, run.mismatch()


def test_the_fp16_flow_takes_a_module_not_a_program() -> None:
    model, x = ConvHead().eval(), torch.randn(1, 3, 8, 8)
    with pytest.raises(ValueError, match="float32 module"):
        lower_and_run(torch.export.export(model, (x,)), x, "fp16")


def test_a_dynamic_batch_program_runs_at_each_batch_asked() -> None:
    run = lower_and_run(ConvHead().eval(), torch.randn(2, 3, 8, 8), dynamic_batch=(1, 3))
    assert [out.shape[0] for out in run.outputs] == [2, 1, 3]
    assert run.mismatch() is None


def test_a_model_export_rejects_fails_at_the_export_stage() -> None:
    class DataDependent(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x  # control flow on a value: export cannot trace it

    with pytest.raises(FlowError) as failure:
        lower_and_run(DataDependent(), torch.randn(4, 4))
    assert failure.value.stage == "export" and failure.value.lowered is None


def test_the_rewriter_given_is_the_one_that_runs_and_keeps_its_report() -> None:
    import xnnguard

    rewriter = xnnguard.XnnpackRewriter(strict=True)
    model = nn.Sequential(nn.Conv3d(2, 4, 3), nn.ReLU()).eval()
    run = lower_and_run(model, torch.randn(1, 2, 3, 6, 6), rewrite=rewriter)
    assert rewriter.report == run.rewrite_report == []
    assert run.lowered.num_delegates == 1 and run.mismatch() is None
