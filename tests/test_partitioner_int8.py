"""The partitioner never delegates an int8 op XNNPACK refuses at load, and keeps int8 ops int8 where it can.

Two rules (``xnnguard.rules.quantized_pad``, ``xnnguard.rules.quantization_match``) and the quantizer's
side of the same guarantee (``xnnguard.quantizer.shared_quantization``): ExecuTorch 1.5.1 makes a pad
of a dequantized tensor int8 whatever reads it, and takes a permute int8 whatever its quantization.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as StockPartitioner
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer as StockQuantizer,
    get_symmetric_quantization_config,
)
from executorch.backends.xnnpack.utils.quant_utils import IS_IMPLICIT_Q_DQ_TAG
from torch import nn
from torchao.quantization.pt2e.quantizer import (
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    SharedQuantizationSpec,
)
from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

import xnnguard
from testbed.int8_reference import converted_pt2e
from testbed.lowered import lower, run_pte
from testbed.networks.swin3d import Swin3DConfig, SwinTransformer3d
from testbed.quantize import quantize_pt2e
from testbed.tolerance import int8_tolerance
from xnnguard.report import Rule
from xnnguard.runtime_check import verify_pte

pytestmark = pytest.mark.release_sensitive

STATIC = get_symmetric_quantization_config(is_per_channel=True)


class ConvPad(nn.Module):
    """Conv2d, then a zero ``F.pad``, then ``after``: a float op of 1.5.1 (ReLU, average pooling) or nothing."""

    def __init__(self, after: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 1)
        self.after = after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.pad(self.conv(x), (0, 1, 0, 1))
        if self.after == "relu":
            return torch.relu(y)
        if self.after == "avg_pool":
            return F.avg_pool2d(y, 3, 2, count_include_pad=False)
        return y


X2D = torch.randn(1, 4, 16, 16)


@pytest.mark.parametrize("after", ["relu", "avg_pool", "output"])
def test_stock_1_5_1_cannot_load_an_int8_pad_read_by_a_float_op(after: str) -> None:
    converted = quantize_pt2e(ConvPad(after), (X2D,), StockQuantizer().set_global(STATIC))
    lowered = lower(torch.export.export(converted, (X2D,)), (X2D,), StockPartitioner())
    with pytest.raises(RuntimeError):  # "Failed to create StaticConstantPad node ... invalid_parameter"
        run_pte(lowered.buffer, (X2D,))


@pytest.mark.parametrize("after", ["relu", "avg_pool", "output"])
def test_an_int8_pad_read_by_a_float_op_stays_outside_xnnpack_and_runs(after: str) -> None:
    converted = quantize_pt2e(ConvPad(after), (X2D,), StockQuantizer().set_global(STATIC))
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = lower(torch.export.export(converted, (X2D,)), (X2D,), partitioner)
    (out,) = run_pte(lowered.buffer, (X2D,))
    assert lowered.outside_ops()["constant_pad_nd"] == 1
    assert [record.rule for record in partitioner.report] == [Rule.QUANTIZED_PAD]
    reference = converted(X2D)
    torch.testing.assert_close(out, reference, atol=int8_tolerance(converted, reference, dynamic=False), rtol=0)


@pytest.mark.parametrize("after", ["relu", "avg_pool", "output"])
def test_with_xnnguards_quantizer_a_zero_pad_runs_int8_inside_the_delegate(after: str) -> None:
    converted = quantize_pt2e(ConvPad(after), (X2D,), xnnguard.XNNPACKQuantizer().set_global(STATIC))
    lowered = lower(torch.export.export(converted, (X2D,)), (X2D,), xnnguard.XnnpackPartitioner())
    (out,) = run_pte(lowered.buffer, (X2D,))
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
    (pad,) = [n for n in lowered.delegated_nodes if "constant_pad_nd" in str(n.target)]
    assert pad.args[0].meta.get(IS_IMPLICIT_Q_DQ_TAG), "the pad reads a float tensor: it runs between two converts"
    reference = converted(X2D)
    torch.testing.assert_close(out, reference, atol=int8_tolerance(converted, reference, dynamic=False), rtol=0)


class ConvPadSliceConv(nn.Module):
    """A zero pad, then a slice of it, between two convs: how a 3-D pooling rewrite pads, then takes depths.
    The slice drops channels, so its values alone would get another quantization than the pad's."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Conv2d(4, 8, 1), nn.Conv2d(4, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(F.pad(self.first(x), (1, 1, 1, 1))[:, :4])


def test_a_slice_of_a_zero_pad_shares_its_quantization_and_runs_int8_in_the_same_delegate() -> None:
    """XNNPACK slices int8 only with one quantization on both sides; the pad shares its input's, so must
    the slice after it (1.5.1's quantizer shares a slice's before the pad has any)."""
    model = ConvPadSliceConv()
    converted = quantize_pt2e(model, (X2D,), xnnguard.XNNPACKQuantizer().set_global(STATIC))
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = lower(torch.export.export(converted, (X2D,)), (X2D,), partitioner)
    (out,) = run_pte(lowered.buffer, (X2D,))
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1, partitioner.report
    (cut,) = [n for n in lowered.delegated_nodes if "slice_copy" in str(n.target)]
    assert cut.args[0].meta.get(IS_IMPLICIT_Q_DQ_TAG), "the slice reads a float tensor: it runs between two converts"
    reference = converted(X2D)
    torch.testing.assert_close(out, reference, atol=int8_tolerance(converted, reference, dynamic=False), rtol=0)


def test_a_same_padded_int8_conv_keeps_its_pad_in_its_own_match() -> None:
    """The one int8 pad 1.5.1 makes right: the pad of an even-kernel 'same' conv, folded into the conv's match."""
    model = nn.Sequential(nn.Conv2d(4, 8, 1), nn.ReLU(), nn.Conv2d(8, 8, 2, padding="same"))
    converted = quantize_pt2e(model, (X2D,), xnnguard.XNNPACKQuantizer().set_global(STATIC))
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = lower(torch.export.export(converted, (X2D,)), (X2D,), partitioner)
    (out,) = run_pte(lowered.buffer, (X2D,))
    assert lowered.outside_ops() == {} and partitioner.report == []
    reference = converted(X2D)
    torch.testing.assert_close(out, reference, atol=int8_tolerance(converted, reference, dynamic=False), rtol=0)


class OwnPermuteQuantization(StockQuantizer):
    """The stock quantizer, then each permute's (``op``'s) output quantized with fixed parameters of its
    own: another quantization on each side of it, which XNNPACK cannot run int8."""

    op = torch.ops.aten.permute.default

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        model = super().annotate(model)
        fixed = FixedQParamsQuantizationSpec(torch.int8, scale=1 / 16, zero_point=0, quant_min=-128, quant_max=127)
        for node in model.graph.nodes:
            if node.target is self.op:
                source = node.args[0]
                node.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(
                    input_qspec_map={source: SharedQuantizationSpec(source)}, output_qspec=fixed, _annotated=True
                )
        return model


class ConvPermuteConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Conv2d(4, 8, 1), nn.Conv2d(16, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)).permute(0, 2, 1, 3) * 3)


class OwnSliceQuantization(OwnPermuteQuantization):
    op = torch.ops.aten.slice.Tensor


class ConvSliceConv(nn.Module):
    """The class token of a video transformer's pooling: a slice that a ``cat`` after it quantizes anew."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Conv2d(4, 8, 1), nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x))[:, :, 1:] * 3)


def test_an_int8_slice_with_another_quantization_on_each_side_runs_as_a_float_op_in_the_delegate() -> None:
    """1.5.1 leaves such a slice outside (a delegate boundary each); as a float op it is exact."""
    converted = quantize_pt2e(ConvSliceConv(), (X2D,), OwnSliceQuantization().set_global(STATIC))
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = lower(torch.export.export(converted, (X2D,)), (X2D,), partitioner)
    (out,) = run_pte(lowered.buffer, (X2D,))
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1 and partitioner.report == []
    reference = converted(X2D)
    torch.testing.assert_close(out, reference, atol=int8_tolerance(converted, reference, dynamic=False), rtol=0)


def test_an_int8_permute_with_another_quantization_on_each_side_runs_as_a_float_op() -> None:
    converted = quantize_pt2e(ConvPermuteConv(), (X2D,), OwnPermuteQuantization().set_global(STATIC))
    stock = lower(torch.export.export(converted, (X2D,)), (X2D,), StockPartitioner())
    with pytest.raises(RuntimeError):  # "Failed to create static transpose node"
        run_pte(stock.buffer, (X2D,))
    lowered = lower(torch.export.export(converted, (X2D,)), (X2D,), xnnguard.XnnpackPartitioner())
    (out,) = run_pte(lowered.buffer, (X2D,))
    assert lowered.outside_ops() == {}
    reference = converted(X2D)
    torch.testing.assert_close(out, reference, atol=int8_tolerance(converted, reference, dynamic=False), rtol=0)


class PooledVideo(nn.Module):
    """The issue's reproduction: a pointwise Conv3d, then an AvgPool3d with ceil_mode (its rewrite pads)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(4, 8, 1)
        self.pool = nn.AvgPool3d(3, stride=2, ceil_mode=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.conv(x))


def test_a_static_int8_avg_pool3d_with_ceil_mode_loads_runs_matches_and_verifies_clean() -> None:
    x = torch.randn(1, 4, 8, 16, 16)
    ep = xnnguard.rewrite_for_xnnpack(torch.export.export(PooledVideo().eval(), (x,)), strict=True)
    converted = converted_pt2e(ep.module(), x, xnnguard.XNNPACKQuantizer().set_global(STATIC))
    lowered = lower(torch.export.export(converted, (x,)), (x,), xnnguard.XnnpackPartitioner())
    assert verify_pte(lowered.buffer).ok
    (out,) = run_pte(lowered.buffer, (x,))
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
    reference = converted(x)
    torch.testing.assert_close(out, reference, atol=int8_tolerance(converted, reference, dynamic=False), rtol=0)


def _swin3d() -> tuple[torch.nn.Module, torch.Tensor]:
    """torchvision's Swin3D at its smallest: patch embedding, windows padded (5 x 5 tokens into 4 x 4 windows),
    shifted windows with their mask and roll, and a patch merging that pads an odd size."""
    torch.manual_seed(0)
    config = Swin3DConfig(embed_dim=8, depths=(2, 1), heads=(1, 2), frames=4, resolution=20, window=(2, 4, 4))
    return SwinTransformer3d(config).eval(), torch.randn(1, 3, 4, 20, 20)


@pytest.mark.slow  # 30-45 s each; the int8 window rewrites have small tests in test_reduce_rank
@pytest.mark.network
@pytest.mark.parametrize("quantizer", ["xnnguard", "stock"])
def test_a_static_int8_swin3d_loads_runs_matches_and_verifies_clean(quantizer: str) -> None:
    """xnnguard's quantizer keeps its pads int8; with the stock one the partitioner keeps them outside."""
    model, x = _swin3d()
    ep = xnnguard.rewrite_for_xnnpack(torch.export.export(model, (x,)), strict=True)
    chosen = xnnguard.XNNPACKQuantizer() if quantizer == "xnnguard" else StockQuantizer()
    converted = converted_pt2e(ep.module(), x, chosen.set_global(STATIC))
    lowered = lower(torch.export.export(converted, (x,)), (x,), xnnguard.XnnpackPartitioner())
    report = verify_pte(lowered.buffer)
    assert report.ok, str(report)
    (out,) = run_pte(lowered.buffer, (x,))
    reference = converted(x)
    torch.testing.assert_close(out, reference, atol=int8_tolerance(converted, reference, dynamic=False), rtol=0)


class TwoConvs(nn.Module):
    """conv -> ``between`` -> conv: the second conv's dynamically quantized input is not a graph input."""

    def __init__(self, between: str) -> None:
        super().__init__()
        self.between = between
        self.a, self.b = nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.scale, self.shift = nn.Parameter(torch.rand(1, 8, 1, 1) + 0.5), nn.Parameter(torch.randn(1, 8, 1, 1))
        self.gain = nn.Parameter(torch.rand(8, 1, 1) + 0.5)  # an RMS norm's gain, as video VAEs shape it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        if self.between == "add":
            y = y + 1.0
        elif self.between == "reshape":
            y = y.reshape(1, 8, 4, 16)
        elif self.between == "gain":
            y = y * self.gain
        else:  # a norm's affine on a tensor reshaped back from another layout (a video VAE's frame fold)
            y = y.reshape(1, 8, 64).transpose(1, 2).reshape(1, 8, 8, 8) * self.scale + self.shift
        return self.b(y)


def _dynamic_int8(
    model: nn.Module, x: torch.Tensor, partitioner: object, quantizer: object | None = None
) -> tuple[torch.Tensor, torch.Tensor, list, int]:
    """Output, converted model's output, partitioner report, delegate count (quantizer: the stock one)."""
    chosen = quantizer or StockQuantizer()
    converted = quantize_pt2e(model, (x,), chosen.set_global(  # type: ignore[attr-defined]
        get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)))
    lowered = lower(torch.export.export(converted, (x,)), (x,), partitioner)
    return run_pte(lowered.buffer, (x,))[0], converted(x), getattr(partitioner, "report", []), lowered.num_delegates


@pytest.mark.parametrize("between", [
    pytest.param("add", id="add: 1.5.1 lays out the graph input, 76 % of the range off"),
    pytest.param("affine", id="affine of a reshape: 1.5.1 feeds the conv another tensor's layout"),
    pytest.param("gain", id="gain of shape (C, 1, 1): 1.5.1 feeds the conv its NCHW input as NHWC, 86 % off"),
])
def test_a_dynamically_quantized_conv_behind_an_op_the_layout_walk_passes_computes_the_converted_models_numbers(
    between: str,
) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 4, 8, 8)
    out, expected, report, _ = _dynamic_int8(TwoConvs(between).eval(), x, xnnguard.XnnpackPartitioner())
    assert (out - expected).abs().max() <= 2 * float(expected.max() - expected.min()) / 255
    assert [r.rule for r in report if r.rule is Rule.DYNAMIC_CONV_SOURCE] == [Rule.DYNAMIC_CONV_SOURCE]


def test_a_dynamically_quantized_conv_behind_a_reshape_loads_and_runs() -> None:
    """Stock 1.5.1 lowers it into a delegate that fails at init (error 0x1)."""
    torch.manual_seed(0)
    x = torch.randn(1, 4, 8, 8)
    out, expected, _, _ = _dynamic_int8(TwoConvs("reshape").eval(), x, xnnguard.XnnpackPartitioner())
    assert (out - expected).abs().max() <= 2 * float(expected.max() - expected.min()) / 255


@pytest.mark.parametrize("between", ["add", "reshape", "affine", "gain"])
def test_with_xnnguards_dynamic_quantizer_a_conv_behind_such_an_op_stays_on_xnnpack_and_matches(between: str) -> None:
    """The quantizer gives the conv a cat input, where 1.5.1's layout walk stops on the right tensor."""
    torch.manual_seed(0)
    x = torch.randn(1, 4, 8, 8)
    out, expected, report, delegates = _dynamic_int8(
        TwoConvs(between).eval(), x, xnnguard.XnnpackPartitioner(), xnnguard.XNNPACKQuantizer())
    assert not [r for r in report if r.rule is Rule.DYNAMIC_CONV_SOURCE]
    assert delegates == 1
    assert (out - expected).abs().max() <= 2 * float(expected.max() - expected.min()) / 255


def test_with_a_static_config_xnnguards_quantizer_adds_no_cat_before_a_conv() -> None:
    """A static config would quantize the cat: a rounding the model does not have."""
    x = torch.randn(1, 4, 8, 8)
    converted = quantize_pt2e(TwoConvs("reshape").eval(), (x,), xnnguard.XNNPACKQuantizer().set_global(STATIC))
    assert not [n for n in converted.graph.nodes if n.target == torch.ops.aten.cat.default]
