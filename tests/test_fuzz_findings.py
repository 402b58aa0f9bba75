"""Programs the graph fuzzer (``testbed.fuzz``) found failing to lower or quantize, each a small model written
after its repro: it lowers with the real ExecuTorch, its program loads and runs on the real runtime, and
it matches eager PyTorch (float) or the converted model (int8). The seed that found it is in each name's
docstring.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from testbed.flow import lower_and_run
from testbed.quantize import Precision
from tests.support import rows_in_slow_tier
from xnnguard.report import Rule


def _randomize(bn: nn.BatchNorm1d | nn.BatchNorm2d | nn.BatchNorm3d) -> None:
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)


class TwoBatchNorms(nn.Module):
    """Seed 27: a batch norm right behind another, before a softmax (1.5.1: ``KeyError: 'val'``, stock too)."""

    def __init__(self) -> None:
        super().__init__()
        self.bn1, self.bn2 = nn.BatchNorm2d(5), nn.BatchNorm2d(5)
        _randomize(self.bn1)
        _randomize(self.bn2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.bn2(self.bn1(x)), dim=-1)


# int8 in the slow tier: a batch norm left in the original makes torchao's convert trace its QAT conv-bn
# patterns (15 s a mode); the merged norm is one batch norm, which the int8 rows of test_rewrite_norm cover.
@pytest.mark.parametrize("precision", rows_in_slow_tier(["float", "fp16", "static int8", "dynamic int8"],
                                                       lambda precision: "int8" in precision))
def test_two_batch_norms_in_a_row_lower_as_one_and_match(precision: Precision) -> None:
    torch.manual_seed(27)
    run = lower_and_run(TwoBatchNorms().eval(), (torch.randn(1, 5, 6, 5),), precision)
    assert run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()


class GroupedTransposedConvBatchNorm(nn.Module):
    """Seed 58: a grouped ConvTranspose2d, then a BatchNorm2d (1.5.1 and pt2e fold it with the weight read as
    ungrouped: ``The size of tensor a (3) must match the size of tensor b (6)``, stock too)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose2d(4, 6, 3, stride=(1, 2), output_padding=(0, 1), groups=2, bias=True)
        self.bn = nn.BatchNorm2d(6)
        _randomize(self.bn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


@pytest.mark.parametrize("precision", ["float", "fp16", "static int8", "dynamic int8"])
def test_batch_norm_after_a_grouped_transposed_conv_is_folded_and_matches(precision: Precision) -> None:
    torch.manual_seed(58)
    run = lower_and_run(GroupedTransposedConvBatchNorm().eval(), (torch.randn(1, 4, 5, 9),), precision)
    assert run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()


class AdaptiveMaxPoolHead(nn.Module):
    """Seed 31: ``nn.AdaptiveMaxPool2d`` after an activation (1.5.1's ``to_edge``: not in the core ATen opset,
    stock too), with the activation also returned."""

    def __init__(self, output_size: tuple[int, int]) -> None:
        super().__init__()
        self.pool = nn.AdaptiveMaxPool2d(output_size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.sigmoid(x)
        return self.pool(y), y


@pytest.mark.parametrize("precision", ["float", "fp16", "static int8", "dynamic int8"])
def test_adaptive_max_pool_whose_size_divides_its_input_runs_as_a_max_pooling(precision: Precision) -> None:
    torch.manual_seed(31)
    run = lower_and_run(AdaptiveMaxPoolHead((1, 3)).eval(), (torch.randn(1, 7, 4, 12),), precision)
    assert run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()


@pytest.mark.parametrize("precision", ["float", "static int8"])
def test_adaptive_max_pool_with_uneven_windows_runs_as_maxima_of_its_windows(precision: Precision) -> None:
    torch.manual_seed(31)
    run = lower_and_run(AdaptiveMaxPoolHead((3, 5)).eval(), (torch.randn(1, 7, 7, 12),), precision)
    assert run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()


class AdaptiveMaxPool3dTokens(nn.Module):
    """Seed 125: ``nn.AdaptiveMaxPool3d`` whose output is read as tokens by a linear (1.5.1's ``to_edge``:
    ``adaptive_max_pool3d`` is not in the core ATen opset, stock too)."""

    def __init__(self, output_size: tuple[int, int, int]) -> None:
        super().__init__()
        self.pool = nn.AdaptiveMaxPool3d(output_size)
        self.fc = nn.Linear(3, 14)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(x).flatten(2).transpose(1, 2))


@pytest.mark.parametrize("precision", ["float", "static int8"])
def test_adaptive_max_pool3d_whose_size_divides_its_input_runs_as_a_3d_max_pooling(precision: Precision) -> None:
    torch.manual_seed(125)
    run = lower_and_run(AdaptiveMaxPool3dTokens((3, 2, 7)).eval(), (torch.randn(2, 3, 6, 4, 7),), precision)
    assert run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()


@pytest.mark.parametrize("precision", ["float", "fp16", "static int8", "dynamic int8"])
def test_adaptive_max_pool3d_with_uneven_windows_runs_as_maxima_of_its_windows(precision: Precision) -> None:
    torch.manual_seed(125)
    run = lower_and_run(AdaptiveMaxPool3dTokens((1, 1, 6)).eval(), (torch.randn(2, 3, 6, 4, 7),), precision)
    assert run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()


def test_adaptive_max_pool3d_with_a_dynamic_batch_matches_at_every_batch() -> None:
    torch.manual_seed(125)
    run = lower_and_run(AdaptiveMaxPool3dTokens((1, 1, 6)).eval(), (torch.randn(2, 3, 6, 4, 7),),
                        dynamic_batch=(1, 3))
    assert run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()


class PatchesTanhGelu(nn.Module):
    """Seed 100: patches of an image, then a tanh GELU (1.5.1 serializes XNNPACK's GELU without its
    ``approximate``: it computes the erf GELU, 4.7e-4 off, stock too)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = x.reshape(-1, 3, 13, 1, 8, 1).permute(0, 2, 4, 3, 5, 1)
        return nn.functional.gelu(patches, approximate="tanh")


@pytest.mark.parametrize("dynamic_batch", [(), (1, 3)])
def test_float32_tanh_gelu_runs_as_the_tanh_gelu_not_the_erf_one(dynamic_batch: tuple[int, ...]) -> None:
    torch.manual_seed(100)
    run = lower_and_run(PatchesTanhGelu().eval(), (4 * torch.rand(2, 3, 13, 8) - 3.5,), dynamic_batch=dynamic_batch)
    assert run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()


def test_tanh_gelu_left_unrewritten_stays_outside_xnnpack_and_matches() -> None:
    torch.manual_seed(100)
    run = lower_and_run(PatchesTanhGelu().eval(), (4 * torch.rand(2, 3, 13, 8) - 3.5,), rewrite=False)
    assert [record.rule for record in run.kept_out if record.op == "aten.gelu.default"] == [Rule.TANH_GELU]
    run.assert_matches()


class LinearOverPooledWidth(nn.Module):
    """Seed 18: frames folded into the batch, an average pooling, then linears over its output's width (1.5.1
    in dynamic int8: ``Weight and Input should both be quantized``, stock too)."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.AvgPool2d((2, 3), stride=(1, 3), padding=(1, 0), count_include_pad=False)
        self.fc1, self.fc2 = nn.Linear(1, 8), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.permute(0, 2, 1, 3, 4).reshape(-1, 4, 5, 5)
        return self.fc2(torch.nn.functional.silu(self.fc1(self.pool(frames))))


def test_dynamically_quantized_linear_on_a_pooling_output_reads_it_as_rows_and_matches() -> None:
    torch.manual_seed(18)
    run = lower_and_run(LinearOverPooledWidth().eval(), (torch.randn(1, 4, 3, 5, 5),), "dynamic int8")
    assert run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()


def test_dynamically_quantized_linear_on_a_pooling_output_stays_outside_with_the_stock_quantizer() -> None:
    torch.manual_seed(18)
    run = lower_and_run(LinearOverPooledWidth().eval(), (torch.randn(1, 4, 3, 5, 5),), "dynamic int8",
                        quantizer="stock")
    assert {record.rule for record in run.kept_out if record.op == "aten.addmm.default"} == {
        Rule.DYNAMIC_LINEAR_LAYOUT
    }, run.kept_out
    run.assert_matches()


class MaxPool3dValuesOnly(nn.Module):
    """Seed 184: ``F.max_pool3d(..., return_indices=True)[0]``, the indices never read (export kept their
    getitem, unused: the pooling was left as it was, with no kernel to run it, stock too)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = torch.nn.functional.max_pool3d(x, kernel_size=(3, 1, 2), stride=1, padding=(0, 0, 1),
                                                return_indices=True)[0]
        return torch.softmax(torch.relu(pooled), dim=-3)


@pytest.mark.parametrize("precision", ["float", "static int8"])
def test_a_3d_max_pooling_whose_indices_nobody_reads_runs_on_xnnpack(precision: Precision) -> None:
    torch.manual_seed(184)
    run = lower_and_run(MaxPool3dValuesOnly().eval(), (torch.randn(2, 3, 3, 7, 11),), precision)
    assert run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()


class MaxPool2dValuesOnly(nn.Module):
    """Seeds 138 and 156: ``F.max_pool2d(..., return_indices=True)[0]`` exports as ``max_pool2d_with_indices``,
    which 1.5.1's ``MaxPool2dConfig`` does not take (2 delegates, the pooling on portable kernels, stock too)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)  # the seeds' batch norm, without torchao's QAT tracing in int8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = torch.nn.functional.max_pool2d(self.conv(x), kernel_size=(3, 2), stride=(1, 2), padding=(0, 1),
                                                return_indices=True)[0]
        return torch.relu(pooled.flatten(2).transpose(1, 2))


@pytest.mark.parametrize("precision", ["float", "fp16", "static int8"])
def test_a_2d_max_pooling_whose_indices_nobody_reads_is_in_the_one_delegate(precision: Precision) -> None:
    torch.manual_seed(138)
    run = lower_and_run(MaxPool2dValuesOnly().eval(), (torch.randn(2, 4, 6, 7),), precision)
    assert run.lowered.num_delegates == 1 and run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()


class DetachedPooling(nn.Module):
    """Seeds 151 and 156: a ``.detach()`` between two ops reaches the edge dialect as ``alias_copy``, which no
    1.5.1 config takes (2 delegates, the copy on portable kernels, stock too)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv2d(4, 6, 3, padding=1), nn.GroupNorm(2, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = torch.relu(self.conv(x)).detach()
        return self.norm(pooled), x.detach()  # the second: a graph input's detach, which stays


# float on 1.4.0 too (release_sensitive): the partitioner rewrites there from ops_to_not_decompose
@pytest.mark.parametrize("precision", [pytest.param("float", marks=pytest.mark.release_sensitive), "static int8"])
def test_a_detach_inside_the_graph_is_in_the_one_delegate(precision: Precision) -> None:
    torch.manual_seed(151)
    run = lower_and_run(DetachedPooling().eval(), (torch.randn(2, 4, 6, 7),), precision)
    assert run.lowered.num_delegates == 1, run.lowered.outside_ops()
    assert run.lowered.outside_ops() == {"alias_copy": 1}, run.lowered.outside_ops()  # the input's, at the edge
    run.assert_matches()


class SubsamplingMaxPool(nn.Module):
    """Seed 37: ``F.max_pool2d(x, 1, stride=(2, 1))`` (a subsampling) and a (2, 2) pooling at stride 3, which
    1.5.1's ``MaxPool2dConfig`` refuses (a stride above the kernel: on portable kernels, stock too)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        sub = F.max_pool2d(y, kernel_size=1, stride=(2, 1))
        pooled = F.max_pool2d(y, kernel_size=2, stride=3, padding=1)
        return sub.sum(dim=(2, 3)) + pooled.amax(dim=(2, 3))


@pytest.mark.parametrize("precision", ["float", "static int8"])
def test_a_max_pooling_whose_stride_exceeds_its_kernel_is_in_the_one_delegate(precision: Precision) -> None:
    torch.manual_seed(37)
    run = lower_and_run(SubsamplingMaxPool().eval(), (torch.randn(2, 3, 9, 8),), precision)
    assert run.lowered.num_delegates == 1 and run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()



class ReturnedAndSoftmaxed(nn.Module):
    """Seed 8: a convolution's result both returned and read by a softmax over W (int8: 1.5.1's channels-last
    pass points the delegate's output at a dequantize without a value, ``KeyError: 'val'``; stock fails at run)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(7, 7, kernel_size=(1, 3), padding="same", dilation=(1, 2), bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.relu(self.conv(x))
        return torch.softmax(features, dim=3), features


def test_a_quantized_output_that_a_softmax_also_reads_lowers_to_one_delegate_and_matches() -> None:
    torch.manual_seed(8)
    run = lower_and_run(ReturnedAndSoftmaxed().eval(), (torch.randn(2, 7, 4, 5),), "static int8")
    assert run.lowered.num_delegates == 1 and run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()


class CeilModePoolings(nn.Module):
    """Seeds 159 and 163: ceil-mode max poolings, 3-D and 2-D, under a dynamic batch (1.5.1's
    ``MaxPool2dConfig`` refuses a ceil mode under dynamic shapes: portable kernels between two delegates)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(3, 4, 3, padding=1)
        self.pool3d = nn.MaxPool3d(kernel_size=(1, 2, 3), stride=(1, 2, 2), padding=(0, 0, 1), ceil_mode=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pool3d(torch.relu(self.conv(x))).flatten(1, 2)
        return F.max_pool2d(y, kernel_size=2, stride=2, ceil_mode=True)


def test_ceil_mode_max_poolings_under_a_dynamic_batch_are_in_the_one_delegate() -> None:
    torch.manual_seed(159)
    run = lower_and_run(CeilModePoolings().eval(), (torch.randn(2, 3, 2, 7, 9),), dynamic_batch=(1, 3))
    assert run.lowered.num_delegates == 1 and run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()


class SevenDimLinear(nn.Module):
    """Seed 111: a linear on a 7-D input (int8: its dq at 7 dims stayed outside, and the linear with it)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).transpose(1, 5)[:, :, :, [1]]


def test_a_quantized_linear_on_a_7d_input_is_delegated() -> None:
    torch.manual_seed(111)
    run = lower_and_run(SevenDimLinear().eval(), (torch.randn(2, 3, 1, 2, 1, 3, 4),), "static int8")
    assert run.lowered.num_delegates == 1 and run.lowered.delegated_ops()["linear"] == 1, run.lowered.outside_ops()
    run.assert_matches()


class DilatedTransposedConv(nn.Module):
    """Seed 232: a transposed convolution at stride 1, dilation 2 and output padding 1, which PyTorch allows
    (below the dilation) and XNNPACK refuses at run (not below the stride): 1.5.1 lowered it and failed."""

    def __init__(self, padding: int) -> None:
        super().__init__()
        self.deconv = nn.ConvTranspose2d(3, 4, kernel_size=3, padding=padding, output_padding=1, dilation=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.deconv(x))


def test_a_transposed_conv_with_an_output_padding_within_its_padding_is_a_slice_of_one_xnnpack_takes() -> None:
    torch.manual_seed(232)
    run = lower_and_run(DilatedTransposedConv(padding=2).eval(), (torch.randn(2, 3, 6, 5),))
    assert run.lowered.num_delegates == 1 and run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()


def test_a_transposed_conv_with_an_output_padding_past_its_padding_runs_on_the_portable_kernel() -> None:
    torch.manual_seed(232)
    run = lower_and_run(DilatedTransposedConv(padding=0).eval(), (torch.randn(2, 3, 6, 5),))
    assert run.lowered.outside_ops() == {"convolution": 1}, run.lowered.outside_ops()
    assert any("output padding exceeds its padding" in record.reason for record in run.rewrite_report)
    run.assert_matches()


class NormOfOneElementSoftmax(nn.Module):
    """Seed 271: a softmax over a batch of 1 (all ones), then a layer norm of those ones, which multiplies
    any rounding of them by ``1 / sqrt(eps)``: PyTorch gives exactly the bias."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.norm = nn.Linear(23, 23), nn.LayerNorm(23)
        nn.init.uniform_(self.norm.bias, -0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.softmax(self.fc(x), dim=0))


def test_a_layer_norm_of_a_one_element_softmax_is_exactly_its_bias() -> None:
    torch.manual_seed(271)
    model = NormOfOneElementSoftmax().eval()
    run = lower_and_run(model, (torch.randn(1, 11, 23),))
    assert run.lowered.num_delegates == 1 and run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    assert torch.equal(run.out, model.norm.bias.detach().expand(1, 11, 23))


class CeilModeSubsampling(nn.Module):
    """Seed 263: ``MaxPool2d((1, 2), stride=2, ceil_mode=True)``, a stride above the kernel in ceil mode."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.pool = nn.Conv2d(3, 4, 3, padding=1), nn.MaxPool2d((1, 2), stride=2, ceil_mode=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.conv(x))).mean(dim=(2, 3))


def test_a_ceil_mode_max_pooling_with_a_stride_above_its_kernel_is_in_the_one_delegate() -> None:
    torch.manual_seed(263)
    run = lower_and_run(CeilModeSubsampling().eval(), (torch.randn(2, 3, 5, 7),))
    assert run.lowered.num_delegates == 1 and run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()



class StdThenGroupNorm(nn.Module):
    """Seed 455: an instance norm, a ``std`` over depth, a window partition, then a group norm over groups of
    two nearly equal values, whose spread is far below their magnitude."""

    def __init__(self) -> None:
        super().__init__()
        self.inorm = nn.InstanceNorm3d(2, track_running_stats=True)
        nn.init.uniform_(self.inorm.running_mean, -0.5, 0.5)
        nn.init.uniform_(self.inorm.running_var, 0.5, 2.0)
        self.norm = nn.GroupNorm(2, 2)
        nn.init.uniform_(self.norm.weight, 0.5, 1.5)
        nn.init.uniform_(self.norm.bias, -0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = torch.std(self.inorm(x + F.silu(x)), dim=2, correction=0, keepdim=True)
        windows = v.permute(0, 2, 3, 4, 1).reshape(-1, 1, 1, 2, 2, 5, 1, 2).permute(0, 1, 3, 5, 2, 4, 6, 7)
        return self.norm(windows.reshape(-1, 2, 2) / 0.25)


@pytest.mark.parametrize("dynamic_batch", [(), (1, 3)])
def test_a_group_norm_of_nearly_equal_values_matches_eager_float32(dynamic_batch: tuple[int, ...]) -> None:
    """``x * scale + shift`` rounds ``x * scale`` at ``|x| / std``, far above the result: 2.1e-5 off at an
    output of 1, where the tolerance is 1.1e-5 (stock 1.5.1 fails to run it)."""
    torch.manual_seed(455)
    model = StdThenGroupNorm().eval()
    x = torch.randn(2, 2, 8, 4, 5, generator=torch.Generator().manual_seed(455))
    run = lower_and_run(model, x, "float", dynamic_batch=dynamic_batch)
    assert run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()


class PooledResidualNorm(nn.Module):
    """Seed 453: a residual, an adaptive average pooling to 8 values a row, then a layer norm over them. The
    norm divides a one-step rounding difference of the pooled values by their spread."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d((8, 1))
        self.norm = nn.LayerNorm([8, 1], bias=False)
        nn.init.uniform_(self.norm.weight, 0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.pool(x + F.silu(x)))


def test_a_static_int8_program_may_differ_by_what_one_step_roundings_amplified_by_a_norm_make() -> None:
    """XNNPACK rounds a few pooled values to the other side of a step than pt2e: 0.166 off the converted
    model where two steps are 0.078, and as far from float as it is (0.113)."""
    torch.manual_seed(453)
    x = torch.randn(1, 8, 12, 8, generator=torch.Generator().manual_seed(453))
    run = lower_and_run(PooledResidualNorm().eval(), x, "static int8")
    assert run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()
