"""A rewrite adds no rounding the original op lacks: its int8 program stays within 2 steps of the original's.

Each case is one rewrite family, on a model the stock flow quantizes (the stock quantizer annotates 3-D
ops too). The comparison is with the original, un-rewritten model quantized the stock way and run as a
converted pt2e model: the ideal int8 result of the original ops (``testbed.int8_reference``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pytest
import torch
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config
from torch import nn
from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

import xnnguard
from testbed.int8_reference import ConvertedPair, Int8, both_converted, int8_against_the_original
from testbed.lowered import run_pte
from tests.compat_marks import standalone_int8_batch_norm_fails_to_lower
from tests.support import SeparableBlock
from xnnguard.report import Rule
from xnnguard.rewrite.conv3d.conv3d import RewriteConv3dPass
from xnnguard.rewrite.rewrite_for_xnnpack import XnnpackRewriter

MODES: tuple[Int8, ...] = ("static", "dynamic")


class EightD(nn.Module):
    """``inner`` on the 3-D input viewed as 8-D (a patchify's or a window partition's rank), then back."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x.reshape(x.shape[0], 2, 2, 3, 2, 3, 1, -1))  # the batch kept: it may be dynamic
        return y.reshape(x.shape[0], x.shape[1], -1)


class Then(nn.Module):
    """``after(op(first(x)))``: an op between two quantized ones (or after one)."""

    def __init__(
        self, first: nn.Module, op: Callable[[torch.Tensor], torch.Tensor], after: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.first, self.op, self.after = first, op, after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.op(self.first(x))
        return self.after(y) if self.after is not None else y


class MaskedAttention(nn.Module):
    """3-D attention (matmuls of 3-D operands) with Qwen2-VL's one-image mask: ``full(min)``, all of it set to 0."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(8, 24), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        n = x.shape[1]
        mask = torch.full([1, n, n], torch.finfo(x.dtype).min, dtype=x.dtype)
        mask[..., 0:n, 0:n] = 0
        return self.proj(torch.matmul(torch.softmax(torch.matmul(q, k.transpose(1, 2)) * 0.35 + mask, dim=-1), v))


def _conv(*layers: nn.Module) -> nn.Module:
    return nn.Sequential(nn.Conv3d(4, 8, 1), *layers)


CASES: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "Conv3d, padded depth, + ReLU": (lambda: nn.Sequential(nn.Conv3d(4, 8, 3, padding=1), nn.ReLU()), (1, 4, 6, 8, 8)),
    "Conv3d + BatchNorm3d + ReLU": (
        lambda: nn.Sequential(nn.Conv3d(4, 8, 3, padding=1), nn.BatchNorm3d(8), nn.ReLU()),
        (1, 4, 6, 8, 8),
    ),
    "Conv3d (1, 3, 3) + BatchNorm3d + in-place ReLU": (  # torchvision's video models write ReLU(inplace=True)
        lambda: nn.Sequential(nn.Conv3d(4, 8, (1, 3, 3), padding=(0, 1, 1)), nn.BatchNorm3d(8), nn.ReLU(inplace=True)),
        (1, 4, 6, 8, 8),
    ),
    "R(2+1)D block: spatial and temporal convs, residual add": (  # the layout passes' case
        lambda: SeparableBlock(4), (1, 3, 4, 8, 8),
    ),
    "Conv3d, depth tiles": (lambda: nn.Conv3d(4, 8, (2, 3, 3), stride=(2, 1, 1), padding=(0, 1, 1)), (1, 4, 6, 8, 8)),
    "Conv3d, temporal (3, 1, 1)": (lambda: nn.Conv3d(4, 8, (3, 1, 1), padding=(1, 0, 0)), (1, 4, 6, 8, 8)),
    "Conv3d, one patch": (lambda: nn.Conv3d(3, 16, (2, 4, 4), stride=(2, 4, 4)), (4, 3, 2, 4, 4)),
    "ConvTranspose3d, taps tile depth": (lambda: nn.ConvTranspose3d(8, 4, 2, stride=2), (1, 8, 3, 6, 6)),
    "ConvTranspose3d, overlapping taps": (
        lambda: nn.ConvTranspose3d(8, 4, 3, stride=2, padding=1, output_padding=1),
        (1, 8, 3, 6, 6),
    ),
    "MaxPool3d": (lambda: _conv(nn.MaxPool3d(3, 2, 1)), (1, 4, 8, 12, 12)),
    "AvgPool3d, ceil mode": (lambda: _conv(nn.AvgPool3d(3, 2, ceil_mode=True)), (1, 4, 8, 12, 12)),
    "AdaptiveAvgPool3d": (lambda: _conv(nn.AdaptiveAvgPool3d((2, 3, 3))), (1, 4, 8, 12, 12)),
    "BatchNorm3d alone": (lambda: _conv(nn.ReLU(), nn.BatchNorm3d(8)), (1, 4, 4, 8, 8)),
    "8-D Linear + ReLU": (lambda: EightD(nn.Sequential(nn.Linear(6, 8), nn.ReLU())), (2, 72, 6)),
    "8-D Linear + Hardtanh": (lambda: EightD(nn.Sequential(nn.Linear(6, 8), nn.Hardtanh())), (2, 72, 6)),
    "Conv3d + mean over (2, 3, 4)": (lambda: Then(nn.Conv3d(4, 8, 1), lambda y: y.mean((2, 3, 4))), (1, 4, 4, 6, 6)),
    "Conv2d + channel mean + Conv2d": (
        lambda: Then(nn.Conv2d(4, 8, 1), lambda y: y.mean(1, keepdim=True), nn.Conv2d(1, 8, 1)),
        (1, 4, 6, 6),
    ),
    "Conv2d + mean over H, W without keepdim + Linear": (
        lambda: Then(nn.Conv2d(4, 8, 1), lambda y: y.mean((2, 3)), nn.Linear(8, 4)),
        (1, 4, 6, 6),
    ),
    "Linear + mean over tokens + Linear": (
        lambda: Then(nn.Linear(8, 16), lambda y: y.mean(1), nn.Linear(16, 4)),
        (2, 5, 8),
    ),
    "Conv2d + amax over channels + Conv2d": (
        lambda: Then(nn.Conv2d(4, 8, 1), lambda y: y.amax(1, keepdim=True), nn.Conv2d(1, 8, 1)),
        (1, 4, 6, 6),
    ),
    "Linear + LayerNorm + Linear": (
        lambda: nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 8)),
        (2, 5, 8),
    ),
    "Conv2d + GroupNorm + Conv2d": (
        lambda: nn.Sequential(nn.Conv2d(4, 8, 3), nn.GroupNorm(2, 8), nn.Conv2d(8, 4, 1)),
        (1, 4, 8, 8),
    ),
    "3-D attention with a mask filled with one value": (MaskedAttention, (2, 6, 8)),
}


# 1.4 cannot lower a batch norm no conv precedes in int8, rewritten or not
MARKS = {"BatchNorm3d alone": (standalone_int8_batch_norm_fails_to_lower,)}
# torchao's QAT conv-bn fold traced for the lone batch norm's original: ~50 s, so both of its tests (the
# rounding-point test converts the same two models) are in the slow tier; the rewrite itself is checked in
# float by tests/test_rewrite_batch_norm3d.py, and batch norms in int8 by test_rewrite_norm's int8 rows.
SLOW = {"BatchNorm3d alone": (pytest.mark.slow,)}

# The families whose rewrite takes another form under a dynamic batch (-1 for the batch in its views, an
# input cut along a static dim): each is also run exported with a dynamic batch. Not the batch norm alone:
# its pieces stay float, and its dynamic-batch form runs in float (tests/test_rewrite_batch_norm3d.py).
DYNAMIC_BATCH_CASES = (
    "Conv3d, padded depth, + ReLU",
    "Conv3d, one patch",
    "ConvTranspose3d, overlapping taps",
    "MaxPool3d",
    "AdaptiveAvgPool3d",
    "8-D Linear + ReLU",
    "Linear + LayerNorm + Linear",
    "Conv2d + GroupNorm + Conv2d",
)
# Families whose int8 form drops a requantization the original has: a 3-D max pooling's stages share their
# input's quantization, as the stock quantizer has a 2-D max pooling's (the max of int8 values is one of
# them), where the original requantizes the pooled output at a scale of its own. They round at fewer places
# than the original, so they are held to the original's distance from float, not to its every rounding.
DROPS_A_REQUANTIZATION = ("MaxPool3d",)
# A rewrite whose pieces all stay float in both modes (the stock quantizer annotates no batch norm without a
# conv right before it) adds no rounding in either: one mode is enough there. A batch norm left in the
# original graph makes torchao's convert trace its QAT conv-bn patterns, about a minute a convert.
CASE_MODES: dict[str, tuple[Int8, ...]] = {"BatchNorm3d alone": ("static",)}
# One case of each rewrite family has its dynamic-int8 rows in the default tier; the other cases' are in the
# slow tier (dynamic int8 quantizes only the linears and convs around a rewritten op: the family's form is
# what changes, and one case of it shows the form adds no rounding there).
DYNAMIC_INT8_IN_DEFAULT_TIER = (
    "Conv3d, padded depth, + ReLU",
    "ConvTranspose3d, overlapping taps",
    "MaxPool3d",
    "8-D Linear + ReLU",
    "Conv3d + mean over (2, 3, 4)",
    "Linear + LayerNorm + Linear",
    "3-D attention with a mask filled with one value",
)


def dynamic_rows_tier(name: str, mode: Int8, batch: str) -> tuple[pytest.MarkDecorator, ...]:
    """A case's dynamic-int8 rows are in the slow tier unless it is its family's one; a family run under a
    dynamic batch has its dynamic-int8 row there (the one with a static batch is in the slow tier)."""
    if mode != "dynamic":
        return ()
    slow = name not in DYNAMIC_INT8_IN_DEFAULT_TIER or (name in DYNAMIC_BATCH_CASES and batch == "static")
    return (pytest.mark.slow,) if slow else ()


PROGRAMS = [
    pytest.param(name, mode, batch, id=f"{name}-{mode}-{batch} batch",
                 marks=[*MARKS.get(name, ()), *SLOW.get(name, ()), *dynamic_rows_tier(name, mode, batch),
                        pytest.mark.xdist_group(name)])
    for name in CASES
    for mode in CASE_MODES.get(name, MODES)
    for batch in ("static", "dynamic")
    if batch == "static" or name in DYNAMIC_BATCH_CASES
]


Case = tuple[torch.nn.Module, torch.Tensor, ConvertedPair]


@pytest.fixture(scope="session")
def converted_case() -> Callable[[str, Int8, bool], Case]:
    """A case's model, input and converted pair, quantized once per test run (and worker): the program
    test and the rounding-point test of a case share them (``xdist_group`` keeps them on one worker)."""

    @cache
    def build(name: str, mode: Int8, dynamic_batch: bool) -> Case:
        make, shape = CASES[name]
        torch.manual_seed(0)
        model, x = make(), torch.randn(2, *shape[1:]) if dynamic_batch else torch.randn(shape)  # 1: specialized
        return model, x, both_converted(model, x, mode, dynamic_batch=dynamic_batch)

    return build


@pytest.mark.parametrize("name, mode, batch", PROGRAMS)
def test_the_int8_program_of_a_rewritten_op_is_within_two_steps_of_the_original_op(
    name: str, mode: Int8, batch: str, converted_case: Callable[[str, Int8, bool], Case]
) -> None:
    """A dynamic batch: compared at the traced batch, at 1 and at one more. The rewrites' dynamic-batch
    forms (-1 for the batch, an input cut along a static dim) add no rounding either."""
    dynamic = batch == "dynamic"
    model, x, pair = converted_case(name, mode, dynamic)
    result = int8_against_the_original(model, x, mode, dynamic_batch=dynamic, pair=pair)
    assert result.lowered.outside_ops() == {} and result.lowered.num_delegates == 1, result.lowered.outside_ops()
    if name in DROPS_A_REQUANTIZATION and mode == "static":  # dynamic int8 quantizes no pooling
        with torch.no_grad():
            expected, ideal = model(x), pair.ideal(x)
        (out,) = run_pte(result.lowered.buffer, (x,))
        assert (out - expected).abs().max() <= (ideal - expected).abs().max() + 1e-6
        return
    assert result.steps <= 2, f"{result.steps:.2f} quantization steps from the original op quantized"


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=[*SLOW.get(name, ()), pytest.mark.xdist_group(name)]) for name in CASES]
)
def test_a_rewritten_op_rounds_where_the_original_op_rounds_and_nowhere_else(
    name: str, converted_case: Callable[[str, Int8, bool], Case]
) -> None:
    """Static int8: xnnguard's converted model quantizes activations at the original's scales, no others.
    Converted models only: nothing is lowered."""
    *_, pair = converted_case(name, "static", False)
    scales, ideal_scales = pair.scales()
    if name in DROPS_A_REQUANTIZATION:
        assert scales <= ideal_scales
        return
    assert scales == ideal_scales


def test_a_conv3d_summed_tap_by_tap_is_reported_as_rounding_its_partial_sums() -> None:
    conv = nn.Conv3d(2, 4, 3, padding=1).eval()
    x = torch.randn(1, 2, 4, 6, 6)
    ep = XnnpackRewriter([RewriteConv3dPass(depth_taps="sum")], strict=True)(torch.export.export(conv, (x,)))
    quantizer = xnnguard.XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepare_pt2e(ep.module(), quantizer)
    (record,) = quantizer.report
    assert record.rule is Rule.EXTRA_ROUNDING and "depth_taps='fold'" in record.reason
