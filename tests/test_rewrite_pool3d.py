"""3-D pooling -> two 2-D poolings: same numbers as eager, fully delegated to XNNPACK, and it loads and runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge_transform_and_lower
from hypothesis import assume, given, settings, strategies as st

import xnnguard
from testbed.flow import lower_and_run, rewritten
from testbed.lowered import run_pte
from testbed.quantize import PRECISIONS
from tests.support import ops, rows_in_slow_tier
from xnnguard.passes import DO_NOT_DELEGATE
from xnnguard.rewrite.conv3d.pool3d import Pool3d, pool3d_as_2d, pool3d_correction
from xnnguard.rewrite.rewrite_for_xnnpack import XnnpackRewriter


@st.composite
def pool3d_cases(draw: st.DrawFn) -> tuple[Pool3d, torch.Tensor]:
    kind = draw(st.sampled_from(["max", "avg"]))
    kernel = tuple(draw(st.integers(1, 4)) for _ in range(3))
    stride = tuple(draw(st.integers(1, kernel[i] + 2)) for i in range(3))
    padding = tuple(draw(st.integers(0, kernel[i] // 2)) for i in range(3))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(3)) if kind == "max" else (1, 1, 1)
    minimum = [max(1, dilation[i] * (kernel[i] - 1) + 1 - 2 * padding[i]) for i in range(3)]
    if kind == "avg":
        minimum = list(kernel)  # eager avg_pool3d refuses an input smaller than the kernel
    size = tuple(draw(st.integers(minimum[i], minimum[i] + 6)) for i in range(3))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), *size)
    if draw(st.booleans()) and kind == "avg":
        shape = shape[1:]  # unbatched
    pool = Pool3d(
        kind,
        shape,
        kernel,  # type: ignore[arg-type]
        stride,  # type: ignore[arg-type]
        padding,  # type: ignore[arg-type]
        dilation,  # type: ignore[arg-type]
        ceil_mode=draw(st.booleans()),
        count_include_pad=draw(st.booleans()),
        divisor_override=draw(st.sampled_from([None, None, 3])) if kind == "avg" else None,
    )
    assume(pool.why_not() is None)  # a stride above the kernel with a ceil_mode window: left as it was
    torch.manual_seed(draw(st.integers(0, 2**16)))
    return pool, torch.randn(shape)


def _eager(pool: Pool3d, x: torch.Tensor) -> torch.Tensor:
    if pool.kind == "max":
        return F.max_pool3d(x, pool.kernel, pool.stride, pool.padding, pool.dilation, pool.ceil_mode)
    return F.avg_pool3d(
        x, pool.kernel, pool.stride, pool.padding, pool.ceil_mode, pool.count_include_pad, pool.divisor_override
    )


@settings(derandomize=True, max_examples=40, deadline=None)
@given(pool3d_cases())
def test_2d_pooling_form_equals_3d_pooling_for_any_parameters(case: tuple[Pool3d, torch.Tensor]) -> None:
    pool, x = case
    torch.testing.assert_close(pool3d_as_2d(x, pool, pool3d_correction(pool)), _eager(pool, x), atol=1e-5, rtol=1e-5)


class Pool(torch.nn.Module):
    def __init__(self, pool: torch.nn.Module) -> None:
        super().__init__()
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


@pytest.mark.parametrize(
    "pool",
    [
        torch.nn.MaxPool3d(3, stride=2, padding=1, ceil_mode=True),
        torch.nn.MaxPool3d((1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)),
        torch.nn.MaxPool3d(3, stride=(1, 4, 4), padding=1),  # MViT's pooled keys: stride above the kernel
        torch.nn.AvgPool3d((2, 3, 3), stride=(1, 2, 2), padding=(1, 1, 1), count_include_pad=True),
        torch.nn.AvgPool3d(2, ceil_mode=True, count_include_pad=False),
        torch.nn.AdaptiveAvgPool3d((1, 1, 1)),
        torch.nn.AdaptiveAvgPool3d((2, 3, 3)),
    ],
    ids=[
        "max-ceil",
        "max-spatial-only",
        "max-stride-above-kernel",
        "avg-count-pad",
        "avg-ceil",
        "adaptive-global",
        "adaptive-2x3x3",
    ],
)
def test_each_pooling_lowers_fully_to_xnnpack_and_runs(pool: torch.nn.Module) -> None:
    x = torch.randn(2, 3, 5, 9, 9) if not isinstance(pool, torch.nn.AdaptiveAvgPool3d) else torch.randn(1, 4, 4, 9, 9)
    lowered, out, reference, tolerance = lower_and_run(Pool(pool), x, "float")
    assert lowered.outside_ops() == {}
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


def test_max_pool_whose_indices_are_used_is_left_tagged_and_reported() -> None:
    class MaxWithIndices(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return F.max_pool3d(x, 2, return_indices=True)

    x = torch.randn(1, 2, 4, 4, 4)
    ep = torch.export.export(MaxWithIndices(), (x,)).run_decompositions()
    rewriter = XnnpackRewriter(strict=True)
    result = rewriter(ep)
    (record,) = rewriter.report
    assert "indices are used" in record.reason
    (node,) = [n for n in result.graph.nodes if n.name == record.node]
    assert node.meta[DO_NOT_DELEGATE] == record.reason


def test_max_pool_with_unused_indices_after_decomposition_is_rewritten() -> None:
    x = torch.randn(1, 2, 4, 6, 6)
    model = Pool(torch.nn.MaxPool3d(2)).eval()
    ep = XnnpackRewriter(strict=True)(torch.export.export(model, (x,)).run_decompositions())
    assert "max_pool3d_with_indices" not in ops(ep)
    torch.testing.assert_close(ep.module()(x), model(x))


class Mixed3dCnn(torch.nn.Module):
    """Conv3d + BatchNorm3d + ReLU, MaxPool3d, Conv3d, AvgPool3d: the shape of S3D/3-D U-Net encoders."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv3d(3, 8, (3, 5, 5), stride=(1, 2, 2), padding=(1, 2, 2), bias=False)
        self.bn1 = torch.nn.BatchNorm3d(8)
        self.pool1 = torch.nn.MaxPool3d((1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))
        self.conv2 = torch.nn.Conv3d(8, 16, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm3d(16)
        self.pool2 = torch.nn.MaxPool3d(2, ceil_mode=True)
        self.pool3 = torch.nn.AvgPool3d((2, 3, 3), stride=1, padding=(0, 1, 1), count_include_pad=False)
        with torch.no_grad():
            for bn in (self.bn1, self.bn2):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(torch.relu(self.bn1(self.conv1(x))))
        x = self.pool2(torch.relu(self.bn2(self.conv2(x))))
        return self.pool3(x)


def test_stock_1_5_1_cannot_load_the_mixed_3d_cnn() -> None:
    x = torch.randn(1, 3, 8, 32, 32)
    ep = torch.export.export(Mixed3dCnn().eval(), (x,))
    with pytest.raises(Exception):
        program = to_edge_transform_and_lower(ep, partitioner=[xnnguard.XnnpackPartitioner()]).to_executorch()
        run_pte(program.buffer, (x,))


# static int8 slow (17 s): test_rewrites_in_int8's MaxPool3d / AvgPool3d rows check the pooling in int8
@pytest.mark.parametrize("precision", rows_in_slow_tier(PRECISIONS, ["static int8"]))
def test_mixed_3d_cnn_runs_fully_delegated_after_the_rewrite(precision: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 32, 32)
    lowered, out, reference, tolerance = lower_and_run(Mixed3dCnn().eval(), x, precision)  # type: ignore[arg-type]
    assert lowered.outside_ops() == {}
    delegated = lowered.delegated_ops()
    assert delegated["max_pool2d"] == 3 and delegated["avg_pool2d"] == 2  # pool1 has no depth stage
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


def test_rewritten_mixed_3d_cnn_is_still_exportable() -> None:
    x = torch.randn(1, 3, 8, 32, 32)
    model = Mixed3dCnn().eval()
    ep = rewritten(model, x)
    again = torch.export.export(ep.module(), (x,))
    assert not {"conv3d", "max_pool3d", "avg_pool3d", "batch_norm"} & ops(again)
    with torch.no_grad():
        torch.testing.assert_close(again.module()(x), model(x), atol=1e-4, rtol=1e-4)


def test_a_3d_max_pooling_between_int8_convs_pools_int8_values() -> None:
    """Each 2-D stage reads a dequantize and feeds a quantize of the same scale, as the stock quantizer has a
    2-D max pooling: in S3D's static int8 program the 24 float poolings, their transposes and conversions
    were a quarter of the forward."""
    from testbed.quantize import quantize_pt2e, xnnguard_quantizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv3d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool3d(3, 2, 1),
                                torch.nn.Conv3d(8, 8, 3, padding=1)).eval()
    x = torch.randn(1, 3, 8, 12, 12)
    converted = quantize_pt2e(rewritten(model, x), (x,), xnnguard_quantizer(dynamic=False))
    stages = [node for node in converted.graph.nodes if node.target is torch.ops.aten.max_pool2d.default]
    assert len(stages) == 2
    for stage in stages:
        (user,) = stage.users
        assert "dequantize" in str(stage.args[0].target) and "quantize_per_tensor" in str(user.target)
        assert stage.args[0].args[1:3] == user.args[1:3]  # scale and zero point: no requantization
