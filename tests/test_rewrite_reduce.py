"""Reductions over any dims (sum, mean, var, std, vector norms, max, min) and small powers: delegated, same numbers."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge_transform_and_lower
from hypothesis import assume, given, settings, strategies as st
from torch import nn
from torch.export import Dim

import xnnguard
from testbed.flow import Each, lower_and_run, rewritten
from testbed.int8_reference import Int8, int8_against_the_original, steps_allowed
from testbed.lowered import lower, run_pte
from testbed.tolerance import fp16_tolerance
from tests.support import dynamic_int8_in_slow_tier, ops, rows_in_slow_tier
from xnnguard.report import Rule
from xnnguard.rewrite.dtypes import HALF_MAX_STAGE
from xnnguard.rewrite.reduce.extrema import RewriteExtremumPass
from xnnguard.rewrite.reduce.forms import extremum, stage_rule, sum_weights, trailing_sum
from xnnguard.rewrite.reduce.plan import MAX_STAGE, SumPlan, chain_stages, stages, sum_plan
from xnnguard.rewrite.reduce.power import RewritePowerPass
from xnnguard.rewrite.reduce.sums import Reduction, RewriteSumPass, reduction_function
from xnnguard.rewrite.rewrite_for_xnnpack import XnnpackRewriter


class Net(nn.Module):
    """``fn(parts, x)``: a small model around the op under test."""

    def __init__(self, fn: Callable[..., torch.Tensor], *parts: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.parts, x)


# ---------------------------------------------------------------- the arithmetic


@pytest.mark.parametrize(
    "size, expected",
    [(1, ()), (7, (7,)), (4096, (4096,)), (8192, (64, 128)), (4097, (17, 241)), (4099, (4099,)), (2**20, (1024, 1024))],
    ids=["one", "short", "the limit", "two stages", "two odd stages", "a prime above the limit", "a million"],
)
def test_a_dim_is_summed_in_stages_within_the_limit_when_its_divisors_allow(
    size: int, expected: tuple[int, ...]
) -> None:
    assert stages(size) == expected and math.prod(expected) == size
    assert all(length <= MAX_STAGE for length in expected) or expected == (size,)


def test_no_permute_when_only_dims_of_size_one_lie_behind_the_reduced_ones() -> None:
    assert sum_plan((2, 5, 1, 1), [1]) == SumPlan(None, (5, 1, 1))
    assert sum_plan((1, 5, 3), [0, 2]) == SumPlan(None, (3,))  # dim 0 holds no data
    assert sum_plan((1, 5, 3), [0, 1]) == SumPlan((0, 2, 1), (5,))
    assert isinstance(sum_plan((2, 1, 3), [1]), str)  # a reduction over a dim of size 1 is a view


# ---------------------------------------------------------------- property tests of the forms


def _eager(reduction: Reduction, x: torch.Tensor) -> torch.Tensor:
    dims, keepdim = reduction.dims, reduction.keepdim
    if reduction.kind == "sum":
        return x.sum(dims, keepdim=keepdim)
    if reduction.kind == "mean":
        return x.mean(dims, keepdim=keepdim)
    if reduction.kind == "var":
        return torch.var(x, dims, correction=reduction.correction, keepdim=keepdim)
    if reduction.kind == "std":
        return torch.std(x, dims, correction=reduction.correction, keepdim=keepdim)
    order = 1 if reduction.kind == "norm1" else 2
    return torch.linalg.vector_norm(x, order, dims, keepdim=keepdim)


@st.composite
def reductions(draw: st.DrawFn) -> tuple[Reduction, torch.Tensor]:
    rank = draw(st.integers(1, 6))
    shape = tuple(draw(st.integers(1, 5)) for _ in range(rank))
    dims = sorted(draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True)))
    kind = draw(st.sampled_from(["sum", "mean", "var", "std", "norm1", "norm2"]))
    correction = float(draw(st.sampled_from([0, 1, 2]))) if kind in ("var", "std") else 0.0
    assume(math.prod(shape[d] for d in dims) > max(correction, 1))
    torch.manual_seed(draw(st.integers(0, 2**16)))
    return Reduction(kind, dims, draw(st.booleans()), correction), torch.randn(shape) * 3 + 1


@settings(derandomize=True, max_examples=60, deadline=None)
@given(reductions())
def test_linear_form_equals_the_reduction_for_any_dims_rank_and_keepdim(case: tuple[Reduction, torch.Tensor]) -> None:
    reduction, x = case
    plan = sum_plan(x.shape, reduction.dims)
    assume(not isinstance(plan, str))
    assert not isinstance(plan, str)
    function, constants = reduction_function(reduction, plan)
    torch.testing.assert_close(function(x, *constants), _eager(reduction, x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(3, 64, 128), (2, 4099), (2, 2, 4100)])
def test_a_dim_too_long_for_one_linear_is_summed_in_stages(shape: tuple[int, ...]) -> None:
    x = torch.randn(shape)
    sizes = shape[1:]
    weights = sum_weights([s for size in reversed(sizes) for s in stages(size)], 1.0)
    expected = x.sum(dim=tuple(range(1, len(shape))), keepdim=True)
    torch.testing.assert_close(trailing_sum(x, sizes, weights), expected, atol=1e-3, rtol=1e-5)


@st.composite
def extrema(draw: st.DrawFn) -> tuple[torch.Tensor, list[int], str]:
    rank = draw(st.integers(1, 6))
    shape = tuple(draw(st.integers(1, 6)) for _ in range(rank))
    dims = sorted(draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True)))
    torch.manual_seed(draw(st.integers(0, 2**16)))
    return torch.randn(shape), dims, draw(st.sampled_from(["max", "min"]))


@settings(derandomize=True, max_examples=60, deadline=None)
@given(extrema())
def test_tree_of_maximum_of_slices_equals_amax_for_any_dims(case: tuple[torch.Tensor, list[int], str]) -> None:
    x, dims, which = case
    pick, reference = (torch.maximum, torch.amax) if which == "max" else (torch.minimum, torch.amin)
    torch.testing.assert_close(extremum(x, dims, pick), reference(x, dims, keepdim=True), atol=0, rtol=0)


@pytest.mark.parametrize("exponent", [2.0, 3, 3.0, 4, -1, -2.0, 0.5, -0.5])
def test_a_small_power_is_rewritten_into_the_ops_pytorch_computes_it_with(exponent: float) -> None:
    model = Net(lambda _, x: x**exponent).eval()
    x = torch.rand(2, 3, 8) + 0.5
    ep = rewritten(model, x)
    assert "pow" not in ops(ep)
    exact = float(exponent) != 4.0  # x**4 is (x*x)*(x*x): two roundings where pow has one
    tolerance = 0.0 if exact else 1e-6
    torch.testing.assert_close(ep.module()(x), model(x), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("keepdim", [False, True])
def test_a_sum_mean_or_max_over_dims_of_size_one_is_a_view(keepdim: bool) -> None:
    def reductions(x: torch.Tensor) -> torch.Tensor:
        return x.sum((1, 3), keepdim) + x.mean(1, keepdim).mean(-1, keepdim) + x.amax((-1, 1), keepdim)

    model = Net(lambda _, x: reductions(x)).eval()
    x = torch.randn(2, 1, 3, 1)
    ep = rewritten(model, x)
    assert not ops(ep) & {"sum", "mean", "amax"}
    torch.testing.assert_close(ep.module()(x), model(x), atol=0, rtol=0)


def test_the_int_square_xnnpack_takes_itself_is_left_alone() -> None:
    model = Net(lambda _, x: x**2).eval()
    x = torch.randn(2, 3)
    ep = XnnpackRewriter([RewritePowerPass()], strict=True)(torch.export.export(model, (x,)))
    assert "pow" in ops(ep)


# ---------------------------------------------------------------- end to end: delegated, loads, runs, matches

def _var_and_std(y: torch.Tensor) -> torch.Tensor:
    return torch.var(y, (2, 3)) + torch.std(y, 1, keepdim=True, correction=2).mean()


def _range(y: torch.Tensor) -> torch.Tensor:
    return y.amax(-1) - y.amin(-1)


def _mean_and_max(y: torch.Tensor) -> torch.Tensor:
    return y.mean(dim=(2, 3, 4)) + y.amax(dim=(2, 3, 4))


E2E: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "channel mean of a 5-D tensor (a video VAE's RMS norm)": (
        lambda: Net(lambda p, x: p[0](x).mean(dim=1, keepdim=True) + 1.0, nn.Conv3d(4, 8, 1)),
        (1, 4, 3, 6, 6),
    ),
    "mean over (2, 3, 4) of a 5-D tensor (S3D's head)": (
        lambda: Net(lambda p, x: p[0](x).mean(dim=(2, 3, 4)), nn.Conv3d(4, 8, 3)),
        (1, 4, 4, 7, 7),
    ),
    # An odd count of tokens: the int8 mean of an even count can fall on a rounding tie, which float rounding
    # breaks either way (one step at the mean, three at the output).
    "mean and max over dims of size 1 (S3D's head on a small input)": (
        lambda: Net(lambda p, x: _mean_and_max(p[0](x)), nn.Conv3d(4, 8, 3)),
        (1, 4, 3, 3, 3),
    ),
    "mean over the tokens (a ViT's pooling)": (
        lambda: Net(lambda p, x: p[1](p[0](x).mean(1)), nn.Linear(8, 16), nn.Linear(16, 4)),
        (2, 9, 8),
    ),
    "4-D mean over H and W without keepdim": (
        lambda: Net(lambda p, x: p[1](p[0](x).mean((2, 3))), nn.Conv2d(4, 8, 3), nn.Linear(8, 4)),
        (1, 4, 8, 8),
    ),
    "sum over dims that are not adjacent": (
        lambda: Net(lambda p, x: p[0](x).sum((0, 2)), nn.Linear(8, 16)),
        (3, 5, 8),
    ),
    "var and std with a correction": (
        lambda: Net(lambda p, x: _var_and_std(p[0](x)), nn.Conv2d(4, 8, 3)),
        (1, 4, 8, 8),
    ),
    "max over dim 1 of a 4-D view (Hiera's mask-unit pooling)": (
        lambda: Net(lambda p, x: p[0](x).view(2, 4, -1, 16).max(dim=1).values, nn.Linear(8, 16)),
        (2, 12, 8),
    ),
    "amax and amin over the last dim": (
        lambda: Net(lambda p, x: _range(p[0](x)), nn.Linear(8, 16)),
        (2, 5, 8),
    ),
    "x ** 2.0 then a sum (a hand-written norm)": (
        lambda: Net(lambda p, x: p[1]((p[0](x) ** 2.0).sum(-1, keepdim=True)), nn.Linear(8, 16), nn.Linear(1, 4)),
        (2, 5, 8),
    ),
}


@pytest.mark.parametrize("name", list(E2E))
def test_each_reduction_lowers_fully_to_xnnpack_and_matches_eager(name: str) -> None:
    build, shape = E2E[name]
    torch.manual_seed(0)
    lowered, out, reference, tolerance = lower_and_run(build().eval(), torch.randn(shape), "float")
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


# In the default tier: a mean (its result at its input's scale), a variance and a max (float pieces). The
# others take one of those two code paths (xnnguard.quantizer.rewritten_ops): slow.
INT8_DEFAULT = ("mean over (2, 3, 4) of a 5-D tensor (S3D's head)", "var and std with a correction",
                "max over dim 1 of a 4-D view (Hiera's mask-unit pooling)")


@pytest.mark.parametrize("mode", dynamic_int8_in_slow_tier(["static", "dynamic"]))
@pytest.mark.parametrize("name", rows_in_slow_tier(list(E2E), [name for name in E2E if name not in INT8_DEFAULT],
                                                   ids=list(E2E)))
def test_each_reduction_in_int8_is_delegated_within_two_steps_of_the_original_quantized(name: str, mode: Int8) -> None:
    """Against the un-rewritten model quantized the stock way: the rewrite adds no rounding of its own."""
    build, shape = E2E[name]
    torch.manual_seed(0)
    model, x = build(), torch.randn(shape)
    result = int8_against_the_original(model, x, mode)
    assert result.lowered.outside_ops() == {} and result.lowered.num_delegates == 1
    allowed = 2.0 if result.steps <= 2 else steps_allowed(model, x, mode, "xnnguard.rewrite.reduce.")
    assert result.steps <= allowed, f"{result.steps:.2f} steps off"


def test_a_channel_mean_with_a_dynamic_batch_stays_on_xnnpack_and_runs_another_batch() -> None:
    # The mean of squares (not the square of a mean, which can sit near 0 and magnify rounding past any
    # tolerance) keeps the result of order 1, so float rounding stays within 1e-5.
    torch.manual_seed(0)
    model = Net(lambda p, x: p[0](x) * torch.rsqrt((p[0](x) ** 2.0).mean(1, keepdim=True) + 1e-6), nn.Linear(8, 8))
    x = torch.randn(3, 5, 8)
    ep = torch.export.export(model.eval(), (x,), dynamic_shapes=({0: Dim("batch", max=64)},))
    lowered = lower(xnnguard.rewrite_for_xnnpack(ep, strict=True), (x,), xnnguard.XnnpackPartitioner())
    assert lowered.outside_ops() == {}
    bigger = torch.randn(7, 5, 8)
    (out,) = run_pte(lowered.buffer, (bigger,))
    torch.testing.assert_close(out, model(bigger), atol=1e-5, rtol=1e-5)


class AttentionThenRmsNorm(nn.Module):
    """A video VAE's middle block: attention over each frame's positions, a 1x1 conv, a residual add, an RMS norm.

    PyTorch lays out the attention's result one way in its meta function and another in the
    decomposition ``to_edge`` traces with, and so everything computed from it: the tensor the norm
    reduces has other strides there than when the rewrite ran.
    """

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        frames = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        qkv = self.to_qkv(frames).reshape(b * t, 1, c * 3, h * w).permute(0, 1, 3, 2).contiguous()
        q, k, v = qkv.chunk(3, dim=-1)
        attended = F.scaled_dot_product_attention(q, k, v).squeeze(1).permute(0, 2, 1).reshape(b * t, c, h, w)
        y = self.proj(attended).reshape(b, t, c, h, w).permute(0, 2, 1, 3, 4) + x
        return y * torch.rsqrt(y.pow(2).mean(dim=1, keepdim=True) + 1e-6)


def test_a_norm_of_an_attention_output_lowers_and_runs() -> None:
    model = AttentionThenRmsNorm().eval()
    inputs = (torch.randn(1, 8, 2, 4, 4),)
    ep = xnnguard.rewrite_for_xnnpack(torch.export.export(model, inputs), strict=True)
    edge = to_edge_transform_and_lower(ep, partitioner=[xnnguard.XnnpackPartitioner()])
    (out,) = run_pte(edge.to_executorch().buffer, inputs)
    torch.testing.assert_close(out, model(*inputs), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- float16


def test_every_reduction_in_float16_lowers_fully_to_xnnpack_and_matches_eager_float16() -> None:
    torch.manual_seed(0)
    models = [build() for build, _ in E2E.values()]
    inputs = tuple(torch.randn(shape) for _, shape in E2E.values())
    run = lower_and_run(Each(models), inputs, "fp16")
    assert run.lowered.outside_ops() == {} and run.lowered.num_delegates == 1, run.lowered.outside_ops()
    for name, out, reference in zip(E2E, run.outputs, run.references):
        torch.testing.assert_close(out, reference, atol=fp16_tolerance(reference), rtol=0, msg=name)


def test_a_float16_mean_of_large_values_never_overflows_in_its_partial_sums() -> None:
    """Stage sums of 16 values of 5000 would be 80000, above float16's 65504; each stage is a scaled mean."""
    model = Net(lambda _, x: x.mean(-1))
    x = 5000 + 100 * torch.randn(2, 256)
    run = lower_and_run(model, x, "fp16")
    assert run.lowered.outside_ops() == {}
    assert bool(torch.isfinite(run.out).all())
    run.assert_matches()


@pytest.mark.parametrize("length", [10, 1000])
def test_a_float16_log_softmax_runs_on_xnnpack_within_a_few_roundings_of_eager_float16(length: int) -> None:
    """Fuzz seeds 106, 126, 225: a float16 log-softmax was left to portable kernels, between two delegates.
    Its sum of exponentials, each at most 1 and the largest exactly 1, accumulates in float16 stages."""
    torch.manual_seed(0)
    model = Net(lambda _, x: torch.log_softmax(x, dim=-1))
    run = lower_and_run(model, 4 * torch.randn(3, 5, length), "fp16")
    assert run.lowered.outside_ops() == {} and run.lowered.num_delegates == 1, run.lowered.outside_ops()
    torch.testing.assert_close(run.out, run.reference, atol=fp16_tolerance(run.reference), rtol=0)


def test_a_float16_variance_of_deviations_whose_squares_overflow_matches_eager_float16() -> None:
    """``d * d`` overflows float16 from |d| = 256; PyTorch's float16 var, computed in float32, does not."""
    model = Net(lambda _, x: torch.var(x, -1) + torch.std(x, -1))
    x = 1000 * torch.randn(3, 64)
    run = lower_and_run(model, x, "fp16")
    assert run.lowered.outside_ops() == {}
    run.assert_matches()


def _float16_accumulating_linear(t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A float16 fully connected op as XNNPACK's ``neonfp16arith`` kernels compute it (ARM's phones): the
    accumulator is float16, rounded after each fused multiply-add."""
    acc = torch.zeros((*t.shape[:-1], w.shape[0]), dtype=torch.float16)
    for j in range(t.shape[-1]):
        acc = (acc.float() + t[..., j : j + 1].float() * w[:, j].float()).half()
    return acc


@pytest.mark.parametrize("size", [768, 197, 3136])
def test_a_float16_mean_stays_within_two_steps_when_the_cpu_accumulates_in_float16(
    size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The x86 CPUs here accumulate float16 in float32 (XNNPACK's ``f16_f32acc``); ARM's do not. There one
    linear over 768 values loses ten and more float16 steps of the mean; stages of at most 16 keep two (a
    prime length padded with zeros)."""
    torch.manual_seed(0)
    x = (torch.randn(16, size) ** 2).half()
    exact = x.double().mean(-1, keepdim=True)
    step = 2.0 ** (torch.floor(torch.log2(exact)) - 10)
    monkeypatch.setattr(F, "linear", _float16_accumulating_linear)
    lengths = chain_stages((size,), *stage_rule(torch.float16))
    staged = trailing_sum(x, (size,), sum_weights(lengths, 1.0 / size, torch.float16))
    assert float(((staged.double() - exact).abs() / step).max()) <= 2
    assert max(lengths) <= HALF_MAX_STAGE
    if size == 768:
        one = trailing_sum(x, (size,), [w.half() for w in sum_weights(chain_stages((size,)), 1.0 / size)])
        assert float(((one.double() - exact).abs() / step).max()) > 10


# ---------------------------------------------------------------- what is left as it was, and said


def test_a_max_whose_indices_are_used_is_left_and_reported() -> None:
    model = Net(lambda _, x: torch.max(x, dim=1)[1].float() + torch.max(x, dim=1)[0])
    ep = torch.export.export(model, (torch.randn(2, 5, 3),))
    rewriter = XnnpackRewriter([RewriteExtremumPass()], strict=True)
    rewriter(ep)
    (record,) = rewriter.report
    assert record.rule is Rule.NOT_REWRITTEN and "indices are used" in record.reason


def test_a_reduction_over_a_dynamic_dim_is_left_and_reported() -> None:
    model = Net(lambda _, x: x.sum(0))
    ep = torch.export.export(model, (torch.randn(3, 4),), dynamic_shapes=({0: Dim("n", max=64)},))
    rewriter = XnnpackRewriter([RewriteSumPass()], strict=True)
    rewriter(ep)
    (record,) = rewriter.report
    assert "dynamic dim" in record.reason


def test_an_integer_sum_is_not_picked() -> None:
    model = Net(lambda _, x: (x > 0).int().sum(1))
    ep = XnnpackRewriter([RewriteSumPass()], strict=True)(torch.export.export(model, (torch.randn(3, 4),)))
    assert "sum" in ops(ep)
