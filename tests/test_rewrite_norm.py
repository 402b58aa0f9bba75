"""Layer, RMS, group and instance norms and batch norms with batch statistics: delegated, same numbers."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings, strategies as st
from torch import nn
from torch.export import Dim
from torch.fx.passes.infra.pass_base import PassBase

import xnnguard
from testbed.flow import Each, lower_and_run, rewritten
from testbed.int8_reference import Int8, int8_against_the_original, steps_allowed
from testbed.lowered import lower, run_pte
from testbed.networks._common import reinit_norms
from testbed.tolerance import fp16_tolerance
from tests.support import assert_within_rank_limit, ops, rows_in_slow_tier
from xnnguard.report import Rule
from xnnguard.rewrite.norm import (
    RewriteGroupNormPass,
    RewriteInstanceNormPass,
    RewriteLayerNormPass,
    RewriteRmsNormPass,
)
from xnnguard.rewrite.rewrite_for_xnnpack import XnnpackRewriter
from xnnguard.rewrite.runner import run_passes

NORM_OPS = {"layer_norm", "native_layer_norm", "group_norm", "native_group_norm", "instance_norm", "batch_norm",
            "_native_batch_norm_legit", "rms_norm"}


class Norm(nn.Module):
    """``norm(x, weight, bias)`` with the affine parameters as the module's own (None when absent)."""

    def __init__(
        self, norm: Callable[..., torch.Tensor], shape: tuple[int, ...] | None, affine: tuple[bool, bool]
    ) -> None:
        super().__init__()
        self.norm = norm
        self.weight = nn.Parameter(torch.rand(shape) + 0.5) if shape is not None and affine[0] else None
        self.bias = nn.Parameter(torch.randn(shape) * 0.2) if shape is not None and affine[1] else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x, self.weight, self.bias)


def _rewrites_to_the_same_numbers(rewrite: PassBase, model: nn.Module, x: torch.Tensor) -> None:
    graph_module = torch.export.export(model.eval(), (x,)).module()
    result = run_passes([rewrite], graph_module, strict=True)
    assert result.report == () and result.modified
    left = {str(n.target).split(".")[-2] for n in graph_module.graph.nodes if n.op == "call_function"}
    assert not left & NORM_OPS
    with torch.no_grad():
        got, eager = graph_module(x), model(x)
        exact = copy.deepcopy(model).double()(x.double())
    # As close to the exact result as float32 allows: a few ulps, and where the statistics cancel (a group of
    # nearly equal values) as far as PyTorch's own float32 kernel is off it, twice.
    allowed = 2 * (eager.double() - exact).abs() + 2e-5 + 1e-5 * exact.abs()
    assert ((got.double() - exact).abs() <= allowed).all(), (got, eager, exact)


def _input(draw: st.DrawFn, shape: tuple[int, ...]) -> torch.Tensor:
    torch.manual_seed(draw(st.integers(0, 2**16)))
    return torch.randn(shape) * draw(st.sampled_from([1.0, 10.0])) + draw(st.sampled_from([0.0, 3.0]))


_EPS = st.sampled_from([1e-5, 1e-6, 0.1])
_AFFINE = st.tuples(st.booleans(), st.booleans())


@st.composite
def layer_norms(draw: st.DrawFn) -> tuple[nn.Module, torch.Tensor]:
    rank = draw(st.integers(1, 5))
    shape = tuple(draw(st.integers(1, 6)) for _ in range(rank))
    normalized = shape[rank - draw(st.integers(1, min(rank, 3))) :]
    eps = draw(_EPS)
    model = Norm(lambda x, w, b: F.layer_norm(x, normalized, w, b, eps), normalized, draw(_AFFINE))
    return model, _input(draw, shape)


@settings(derandomize=True, max_examples=25, deadline=None)
@given(layer_norms())
def test_layer_norm_form_equals_layer_norm_for_any_shape_affine_and_eps(case: tuple[nn.Module, torch.Tensor]) -> None:
    _rewrites_to_the_same_numbers(RewriteLayerNormPass(), *case)


@st.composite
def rms_norms(draw: st.DrawFn) -> tuple[nn.Module, torch.Tensor]:
    rank = draw(st.integers(1, 5))
    shape = tuple(draw(st.integers(1, 6)) for _ in range(rank))
    normalized = shape[rank - draw(st.integers(1, min(rank, 3))) :]
    assume(math.prod(normalized) > 1)
    eps = draw(st.sampled_from([None, 1e-6, 0.1]))
    model = Norm(lambda x, w, b: F.rms_norm(x, normalized, w, eps), normalized, (draw(st.booleans()), False))
    return model, _input(draw, shape)


@settings(derandomize=True, max_examples=20, deadline=None)
@given(rms_norms())
def test_rms_norm_form_equals_rms_norm_for_any_shape_and_eps(case: tuple[nn.Module, torch.Tensor]) -> None:
    _rewrites_to_the_same_numbers(RewriteRmsNormPass(), *case)


@st.composite
def group_norms(draw: st.DrawFn) -> tuple[nn.Module, torch.Tensor]:
    groups, per_group = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    channels = groups * per_group
    positions = tuple(draw(st.integers(1, 5)) for _ in range(draw(st.integers(0, 3))))
    shape = (draw(st.integers(1, 3)), channels, *positions)
    if per_group * (positions[0] if positions else 1) == 1 and len(positions) <= 1:
        shape = (shape[0], channels, *positions, 2)  # at least two elements per group
    eps = draw(_EPS)
    model = Norm(lambda x, w, b: F.group_norm(x, groups, w, b, eps), (channels,), draw(_AFFINE))
    return model, _input(draw, shape)


@settings(derandomize=True, max_examples=25, deadline=None)
@given(group_norms())
def test_group_norm_form_equals_group_norm_for_any_groups_rank_affine_and_eps(
    case: tuple[nn.Module, torch.Tensor],
) -> None:
    _rewrites_to_the_same_numbers(RewriteGroupNormPass(), *case)


@st.composite
def batch_statistics_norms(draw: st.DrawFn) -> tuple[nn.Module, torch.Tensor]:
    channels = draw(st.integers(1, 5))
    positions = tuple(draw(st.integers(1, 5)) for _ in range(draw(st.integers(0, 3))))
    shape = (draw(st.integers(2, 3)) if math.prod(positions) == 1 else draw(st.integers(1, 3)), channels, *positions)
    eps = draw(_EPS)
    if math.prod(positions) > 1 and draw(st.booleans()):  # instance norm: statistics per sample and channel

        def norm(x: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor:
            return F.instance_norm(x, weight=w, bias=b, eps=eps)
    else:  # batch norm in training mode without running statistics: per channel, over the batch too

        def norm(x: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor:
            return F.batch_norm(x, None, None, w, b, training=True, eps=eps)

    return Norm(norm, (channels,), draw(_AFFINE)), _input(draw, shape)


@settings(derandomize=True, max_examples=25, deadline=None)
@given(batch_statistics_norms())
def test_instance_norm_and_batch_statistics_forms_equal_the_norms_for_any_shape_affine_and_eps(
    case: tuple[nn.Module, torch.Tensor],
) -> None:
    _rewrites_to_the_same_numbers(RewriteInstanceNormPass(), *case)


# ---------------------------------------------------------------- end to end: delegated, loads, runs, matches


def _instance_norm_with_running_stats() -> nn.Module:
    norm = nn.InstanceNorm3d(8, affine=True, track_running_stats=True)
    with torch.no_grad():
        norm.running_mean.uniform_(-0.5, 0.5)
        norm.running_var.uniform_(0.5, 2.0)
    return nn.Sequential(nn.Conv3d(4, 8, 1), norm)


E2E: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "layer norm (a transformer block)": (
        lambda: nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 8)),
        (2, 10, 8),
    ),
    "layer norm over two dims": (lambda: nn.Sequential(nn.Linear(8, 8), nn.LayerNorm((3, 8))), (2, 3, 8)),
    "RMS norm": (lambda: nn.Sequential(nn.Linear(8, 16), nn.RMSNorm(16), nn.Linear(16, 8)), (2, 10, 8)),
    "group norm (a MONAI-style 3-D UNet block)": (
        lambda: nn.Sequential(nn.Conv3d(4, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.ReLU()),
        (1, 4, 4, 6, 6),
    ),
    "instance norm 3-D (nnU-Net)": (
        lambda: nn.Sequential(nn.Conv3d(4, 8, 3, padding=1), nn.InstanceNorm3d(8, affine=True), nn.LeakyReLU(0.01)),
        (1, 4, 4, 6, 6),
    ),
    "instance norm with running statistics": (_instance_norm_with_running_stats, (1, 4, 4, 6, 6)),
    "batch norm with batch statistics": (  # a ReLU between: pt2e would fold a conv's batch norm, statistics or not
        lambda: nn.Sequential(nn.Conv2d(4, 8, 3), nn.ReLU(),
                              Norm(lambda x, w, b: F.batch_norm(x, None, None, w, b, True), (8,), (True, True))),
        (2, 4, 8, 8),
    ),
}


def _trained(name: str) -> tuple[nn.Module, torch.Tensor]:
    build, shape = E2E[name]
    torch.manual_seed(0)
    model = build().eval()
    for parameter in model.parameters():  # weights and biases as a trained model has them
        parameter.data += 0.1 * torch.randn_like(parameter)
    return model, torch.randn(shape)


@pytest.mark.parametrize("name", list(E2E))
def test_each_norm_lowers_fully_to_xnnpack_and_matches_eager(name: str) -> None:
    lowered, out, reference, tolerance = lower_and_run(*_trained(name), "float")
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


def test_every_norm_in_float16_lowers_fully_to_xnnpack_and_matches_eager_float16() -> None:
    models, inputs = zip(*(_trained(name) for name in E2E))
    run = lower_and_run(Each(list(models)), tuple(inputs), "fp16")
    assert run.lowered.outside_ops() == {} and run.lowered.num_delegates == 1, run.lowered.outside_ops()
    for name, out, reference in zip(E2E, run.outputs, run.references):
        torch.testing.assert_close(out, reference, atol=fp16_tolerance(reference), rtol=0, msg=name)


class _Last(nn.Module):
    """``norm`` over the channels of ``(N, C, L)``, moved last: the same 64 channels a group norm normalizes."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.transpose(1, 2))


OVERFLOWING: dict[str, Callable[[], nn.Module]] = {
    "layer": lambda: _Last(nn.LayerNorm(64)),
    "rms": lambda: _Last(nn.RMSNorm(64)),
    "group": lambda: nn.GroupNorm(4, 64),
}


@pytest.mark.parametrize("name", list(OVERFLOWING))
def test_a_float16_norm_of_deviations_whose_squares_overflow_matches_eager_float16(name: str) -> None:
    """``d * d`` overflows float16 from |d| = 256 (a residual stream's outlier channels reach that); PyTorch's
    float16 norms compute their statistics in float32. The form squares ``d / s`` instead."""
    run = lower_and_run(OVERFLOWING[name](), 600 * torch.randn(2, 64, 5), "fp16")
    assert run.lowered.outside_ops() == {}
    run.assert_matches()


def test_a_float16_group_norm_of_equal_values_is_its_bias_as_in_pytorch() -> None:
    """A group with no spread (a padded region) gives ``rstd = 1/sqrt(eps)``, and so exactly its bias: not
    ``rstd`` times the rounding of its float16 mean (the mean of 18 values of 0.71 in float16 stages is
    0.7095), nor a bias lost to the rounding of ``x * rstd``."""
    norm = nn.GroupNorm(2, 4)
    with torch.no_grad():
        norm.bias.copy_(torch.tensor([0.1, -0.2, 0.3, 0.5]))
    x = torch.full((1, 4, 3, 3), 0.71)
    x[:, 2:] = torch.randn(1, 2, 3, 3)
    run = lower_and_run(norm, x, "fp16")
    assert bool(torch.isfinite(run.out).all())
    run.assert_matches()


# A batch norm in the original graph makes torchao's convert trace its QAT conv-bn patterns (about a minute
# a convert). The batch norm's pieces stay float in both modes (the stock quantizer annotates no batch norm
# without a conv before it), so one mode is enough for it.
# Each norm's dynamic-int8 row is in the slow tier too (tests.support.dynamic_int8_in_slow_tier says why).
# In the default tier: a layer norm and a group norm, static. The other norms' pieces stay float as theirs do
# (one code path, xnnguard.quantizer.rewritten_ops): slow, with every dynamic row.
INT8_DEFAULT = ("layer norm (a transformer block)", "group norm (a MONAI-style 3-D UNet block)")
INT8 = rows_in_slow_tier(
    [(name, mode) for name in E2E for mode in ("static", "dynamic")
     if not (name == "batch norm with batch statistics" and mode == "dynamic")],
    lambda name, mode: name not in INT8_DEFAULT or mode == "dynamic",
    ids=lambda name, mode: f"{name}-{mode}",
)


@pytest.mark.parametrize("name, mode", INT8)
def test_each_norm_in_int8_is_delegated_within_two_steps_of_the_original_quantized(name: str, mode: Int8) -> None:
    """Against the un-rewritten model quantized the stock way: the norm's pieces add no rounding of their own."""
    model, x = _trained(name)
    result = int8_against_the_original(model, x, mode)
    assert result.lowered.outside_ops() == {} and result.lowered.num_delegates == 1
    allowed = 2.0 if result.steps <= 2 else steps_allowed(model, x, mode, "xnnguard.rewrite.norm.")
    assert result.steps <= allowed, f"{result.steps:.2f} steps off"


@pytest.mark.parametrize("name", ["layer norm (a transformer block)", "group norm (a MONAI-style 3-D UNet block)",
                                  "instance norm 3-D (nnU-Net)"])
def test_a_decomposed_norm_is_rewritten_too(name: str) -> None:
    """``run_decompositions`` leaves ``native_layer_norm``, ``native_group_norm``, a view and a batch norm."""
    build, shape = E2E[name]
    model, x = build().eval(), torch.randn(shape)
    ep = xnnguard.rewrite_for_xnnpack(torch.export.export(model, (x,)).run_decompositions(), strict=True)
    assert not ops(ep) & NORM_OPS
    lowered = lower(ep, (x,), xnnguard.XnnpackPartitioner())
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
    (out,) = run_pte(lowered.buffer, (x,))
    torch.testing.assert_close(out, model(x), atol=1e-4, rtol=1e-4)


def test_a_layer_norm_above_six_dims_is_merged_by_the_rank_reduction_then_rewritten() -> None:
    norm = nn.LayerNorm(4)
    model = nn.Sequential(nn.Unflatten(1, (2, 2, 3, 2, 2, 3)), norm, nn.Flatten(1)).eval()  # 8-D, Swin3D's windows
    x = torch.randn(2, 144, 4)
    rewriter = XnnpackRewriter(strict=True)
    ep = rewriter(torch.export.export(model, (x,)))
    assert rewriter.report == [] and not ops(ep) & NORM_OPS
    assert_within_rank_limit(ep)
    lowered = lower(ep, (x,), xnnguard.XnnpackPartitioner())
    assert lowered.outside_ops() == {}
    (out,) = run_pte(lowered.buffer, (x,))
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)


def test_a_layer_norm_with_a_dynamic_sequence_stays_on_xnnpack_and_runs_another_length() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 8)).eval()
    x = torch.randn(12, 8)  # Qwen2-VL's vision tower: (patches, channels), the patch count dynamic
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: Dim("patches", max=1024)},))
    lowered = lower(xnnguard.rewrite_for_xnnpack(ep, strict=True), (x,), xnnguard.XnnpackPartitioner())
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
    longer = torch.randn(40, 8)
    (out,) = run_pte(lowered.buffer, (longer,))
    torch.testing.assert_close(out, model(longer), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", [nn.GroupNorm(4, 8), nn.InstanceNorm2d(8, affine=True)], ids=["group", "instance"])
def test_a_group_or_instance_norm_with_a_dynamic_batch_stays_on_xnnpack_and_runs_another_batch(norm: nn.Module) -> None:
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), norm, nn.ReLU()).eval()
    x = torch.randn(2, 4, 6, 6)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: Dim("batch", max=16)},))
    rewriter = XnnpackRewriter(strict=True)
    lowered = lower(rewriter(ep), (x,), xnnguard.XnnpackPartitioner())
    assert rewriter.report == [] and lowered.outside_ops() == {}
    bigger = torch.randn(5, 4, 6, 6)
    (out,) = run_pte(lowered.buffer, (bigger,))
    torch.testing.assert_close(out, model(bigger), atol=1e-4, rtol=1e-4)


class NormThenView(nn.Module):
    """A layer norm of a permuted tensor, its result viewed: a layer norm's result is contiguous, so that is valid."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).view(x.shape[0], -1)


def test_the_result_of_a_rewritten_norm_is_contiguous_as_the_norms_own_is() -> None:
    model, x = NormThenView().eval(), torch.randn(2, 4, 3, 5)
    ep = rewritten(model, x)
    torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


class ConvThenNorm(nn.Module):
    """A Conv3d and its norm: the conv's rewrite leaves the clip's frames in the batch of a 4-D tensor."""

    def __init__(self, norm: nn.Module, c: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv3d(c, c, 3, padding=1)
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


FRAMES_NORMS = {
    "instance norm": lambda: nn.InstanceNorm3d(4, affine=True),
    "instance norm, no affine": lambda: nn.InstanceNorm3d(4),
    "group norm": lambda: nn.GroupNorm(2, 4),
    "group norm, one group": lambda: nn.GroupNorm(1, 4),
}


def _frame_means(ep: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    """The 4-D means over H and W: ExecuTorch runs them as global average poolings in NHWC."""
    return [n for n in ep.graph_module.graph.nodes
            if n.target is torch.ops.aten.mean.dim and n.args[0].meta["val"].dim() == 4]


@pytest.mark.parametrize("name", list(FRAMES_NORMS))
def test_a_norm_of_a_clips_frames_in_a_batch_is_computed_on_the_frames_with_the_same_numbers(name: str) -> None:
    torch.manual_seed(0)
    model = reinit_norms(ConvThenNorm(FRAMES_NORMS[name]())).eval()
    x = torch.randn(1, 4, 3, 5, 6) * 3 + 1
    ep = rewritten(model, x)
    assert len(_frame_means(ep)) >= 2 and all(n.meta["val"].dim() <= 4 for n in _frame_means(ep))
    with torch.no_grad():
        got, eager = ep.module()(x), model(x)
        exact = copy.deepcopy(model).double()(x.double())
    allowed = 2 * (eager.double() - exact).abs() + 2e-5 + 1e-5 * exact.abs()
    assert ((got.double() - exact).abs() <= allowed).all()


def test_a_frames_norm_of_a_channel_of_equal_values_is_exactly_its_bias_on_xnnpack() -> None:
    """Deviations from the channel's first element: a channel with no spread centers to exactly 0, and its
    output is the bias, not the rounding of its mean times ``1/sqrt(eps)``."""
    model = ConvThenNorm(nn.InstanceNorm3d(4, affine=True)).eval()
    with torch.no_grad():
        model.conv.weight[1:3] = 0.0
        model.conv.bias.copy_(torch.tensor([0.1, 0.71, -3.3, 0.2]))
        model.norm.bias.copy_(torch.tensor([0.5, -0.25, 0.75, 1.0]))
    run = lower_and_run(model, torch.randn(1, 4, 3, 5, 6), "float")
    assert torch.equal(run.out[0, 1:3], model.norm.bias[1:3].reshape(2, 1, 1, 1).expand(2, 3, 5, 6))
    run.assert_matches()


def test_a_norm_of_moves_that_mix_the_frames_channels_keeps_the_clip_form() -> None:
    """Frames viewed as a clip without the permute: each channel of the clip holds pieces of several."""

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.InstanceNorm3d(4, affine=True)

        def forward(self, frames: torch.Tensor) -> torch.Tensor:
            return self.norm((frames * 2).reshape(1, 4, 3, 5, 6))

    model, frames = Mixed().eval(), torch.randn(3, 4, 5, 6)
    ep = rewritten(model, frames)
    assert _frame_means(ep) == []
    torch.testing.assert_close(ep.module()(frames), model(frames), atol=1e-5, rtol=1e-5)


def test_a_float16_norm_of_a_clips_frames_keeps_the_staged_sums() -> None:
    """A pooling's float16 sum is not staged against overflow as the linears' are."""
    model = ConvThenNorm(nn.InstanceNorm3d(4, affine=True)).eval().half()
    ep = rewritten(model, torch.randn(1, 4, 3, 5, 6).half())
    assert _frame_means(ep) == []


# ---------------------------------------------------------------- what is left as it was, and said


def test_a_native_layer_norm_whose_mean_is_used_is_left_and_reported() -> None:
    class UsesTheMean(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, mean, _ = torch.native_layer_norm(x, [4], None, None, 1e-5)
            return out + mean

    rewriter = XnnpackRewriter(strict=True)
    rewriter(torch.export.export(UsesTheMean(), (torch.randn(3, 4),)))
    (record,) = rewriter.report
    assert record.rule is Rule.NOT_REWRITTEN and "mean or inverse standard deviation" in record.reason


@pytest.mark.parametrize("precision", ["float", "fp16"])
def test_a_group_norm_of_one_element_groups_is_its_bias_on_xnnpack(precision: str) -> None:
    """Fuzz seed 57: a window partition to (N, 50, 1) and a GroupNorm(50, 50); each group its own mean."""
    torch.manual_seed(0)
    norm = nn.GroupNorm(6, 6).eval()
    nn.init.uniform_(norm.bias, -0.5, 0.5)
    run = lower_and_run(norm, torch.randn(3, 6, 1), precision)
    assert run.lowered.num_delegates == 1 and not run.lowered.outside_ops(), run.lowered.outside_ops()
    assert torch.equal(run.out, (norm.bias.detach().view(1, 6, 1) * torch.ones(3, 1, 1)).to(run.out.dtype))


@pytest.mark.parametrize("precision", ["float", "fp16"])
def test_a_layer_norm_of_single_elements_is_its_bias_on_xnnpack(precision: str) -> None:
    """Fuzz seed 157: a LayerNorm([1, 1]) after a global pooling; each element is its own mean."""
    torch.manual_seed(0)
    norm = nn.LayerNorm([1, 1]).eval()
    nn.init.uniform_(norm.weight, 0.5, 1.5)
    nn.init.uniform_(norm.bias, -0.5, 0.5)
    run = lower_and_run(norm, torch.randn(3, 4, 1, 1), precision)
    assert run.lowered.num_delegates == 1 and not run.lowered.outside_ops(), run.lowered.outside_ops()
    assert torch.equal(run.out, (norm.bias.detach() * torch.ones(3, 4, 1, 1)).to(run.out.dtype))


@pytest.mark.parametrize("precision", ["float", "fp16"])
def test_an_rms_norm_of_single_elements_is_on_xnnpack_and_matches(precision: str) -> None:
    """Fuzz seed 38: an RMSNorm(1) after a linear to one feature; each element is its own mean square."""
    torch.manual_seed(0)
    norm = nn.RMSNorm(1, eps=1e-6).eval()
    nn.init.uniform_(norm.weight, 0.5, 1.5)
    x = 3 * torch.randn(3, 5, 1)
    x[0, 0, 0] = 0.0  # the square of 0 is 0: eps alone
    run = lower_and_run(norm, x, precision)
    assert run.lowered.num_delegates == 1 and not run.lowered.outside_ops(), run.lowered.outside_ops()
    run.assert_matches()


def test_a_group_norm_with_a_dynamic_length_runs_on_xnnpack_at_every_length() -> None:
    """One dynamic position dim: each group averaged by XNNPACK's global average pooling (issue 33)."""
    torch.manual_seed(0)
    model = nn.GroupNorm(2, 4).eval()
    nn.init.uniform_(model.weight, 0.5, 1.5)
    example = torch.randn(1, 4, 6)
    ep = torch.export.export(model, (example,), dynamic_shapes=({2: Dim("length", max=64)},))
    rewriter = XnnpackRewriter(strict=True)
    lowered = lower(rewriter(ep), (example,), xnnguard.XnnpackPartitioner())
    assert not rewriter.report and lowered.num_delegates == 1 and not lowered.outside_ops()
    for length in (2, 9, 64):
        x = torch.randn(1, 4, length)
        (out,) = run_pte(lowered.buffer, (x,))
        torch.testing.assert_close(out, model(x), atol=1e-5, rtol=0, msg=f"length {length}")


def test_a_group_norm_with_a_dynamic_batch_and_length_is_left_and_reported() -> None:
    model = nn.GroupNorm(2, 4).eval()
    shapes = ({0: Dim("batch", max=8), 2: Dim("length", max=64)},)
    ep = torch.export.export(model, (torch.randn(2, 4, 6),), dynamic_shapes=shapes)
    rewriter = XnnpackRewriter(strict=True)
    rewriter(ep)
    (record,) = rewriter.report
    assert "dynamic" in record.reason
