"""ConvTranspose3d -> ConvTranspose2d: same numbers as eager, fully delegated to XNNPACK, and it runs."""

from __future__ import annotations

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower
from hypothesis import given, settings, strategies as st

import xnnguard
from testbed.flow import lower_and_run, rewritten
from testbed.lowered import run_pte
from testbed.quantize import PRECISIONS
from tests.support import assert_within_rank_limit, dynamic_int8_in_slow_tier, ops
from xnnguard.rewrite.conv3d.conv_transpose3d import (
    ConvTranspose3dGeometry,
    conv_transpose2d_constants,
    conv_transpose3d_as_2d,
)


@st.composite
def conv_transpose3d_cases(draw: st.DrawFn) -> tuple[torch.nn.ConvTranspose3d, torch.Tensor]:
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    kernel = tuple(draw(st.integers(1, 4)) for _ in range(3))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(3))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(3))
    output_padding = tuple(draw(st.integers(0, max(stride[i], dilation[i]) - 1)) for i in range(3))
    # keep the output non-empty: padding <= what the kernel span and output padding give back
    padding = tuple(
        draw(st.integers(0, max(0, (dilation[i] * (kernel[i] - 1) + output_padding[i]) // 2))) for i in range(3)
    )
    conv = torch.nn.ConvTranspose3d(
        groups * draw(st.integers(1, 3)),
        groups * draw(st.integers(1, 3)),
        kernel,  # type: ignore[arg-type]
        stride,  # type: ignore[arg-type]
        padding,  # type: ignore[arg-type]
        output_padding,  # type: ignore[arg-type]
        groups,
        bias=draw(st.booleans()),
        dilation=dilation,  # type: ignore[arg-type]
    )
    torch.manual_seed(draw(st.integers(0, 2**16)))
    size = tuple(draw(st.integers(1, 5)) for _ in range(3))
    return conv.eval(), torch.randn(draw(st.integers(1, 2)), conv.in_channels, *size)


@settings(derandomize=True, max_examples=40, deadline=None)
@given(conv_transpose3d_cases())
def test_conv_transpose2d_form_equals_conv_transpose3d_for_any_parameters(
    case: tuple[torch.nn.ConvTranspose3d, torch.Tensor],
) -> None:
    conv, x = case
    geometry = ConvTranspose3dGeometry(
        tuple(x.shape), tuple(conv.weight.shape), conv.stride, conv.padding, conv.output_padding,  # type: ignore[arg-type]
        conv.dilation, conv.groups,  # type: ignore[arg-type]
    )
    bias = None if conv.bias is None else conv.bias.detach()
    constants = conv_transpose2d_constants(conv.weight.detach(), bias, geometry)
    with torch.no_grad():
        torch.testing.assert_close(conv_transpose3d_as_2d(x, constants, geometry), conv(x), atol=1e-4, rtol=1e-4)


@settings(derandomize=True, max_examples=10, deadline=None)
@given(conv_transpose3d_cases())
def test_rewritten_program_has_no_3d_transposed_conv_and_equals_eager(
    case: tuple[torch.nn.ConvTranspose3d, torch.Tensor],
) -> None:
    conv, x = case
    ep = rewritten(conv, x)
    assert "conv_transpose3d" not in ops(ep)
    assert_within_rank_limit(ep)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), conv(x), atol=1e-4, rtol=1e-4)


def test_grouped_dilated_transposed_conv_with_output_padding_lowers_fully_and_runs() -> None:
    conv = torch.nn.ConvTranspose3d(4, 6, (3, 2, 3), stride=(2, 1, 2), padding=(1, 0, 1), output_padding=(1, 0, 1),
                                    groups=2, dilation=(2, 1, 1)).eval()
    lowered, out, reference, tolerance = lower_and_run(conv, torch.randn(2, 4, 3, 5, 4), "float")
    assert lowered.outside_ops() == {}
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


class Upsampler(torch.nn.Module):
    """A video-VAE style decoder step: ConvTranspose3d that doubles depth, height and width, then ReLU."""

    def __init__(self, kernel: tuple[int, int, int] = (2, 2, 2), padding: int | tuple[int, int, int] = 0) -> None:
        super().__init__()
        self.up = torch.nn.ConvTranspose3d(16, 8, kernel, stride=2, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.up(x))


@pytest.mark.parametrize("precision", dynamic_int8_in_slow_tier(PRECISIONS))
def test_upsampler_runs_fully_delegated(precision: str) -> None:
    torch.manual_seed(0)
    lowered, out, reference, tolerance = lower_and_run(Upsampler().eval(), torch.randn(1, 16, 4, 8, 8), precision)  # type: ignore[arg-type]
    assert lowered.outside_ops() == {}
    assert lowered.delegated_ops()["convolution"] == 1  # taps tile the depth: placing them is a permute
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


@pytest.mark.parametrize("precision", dynamic_int8_in_slow_tier(PRECISIONS))
def test_overlapping_upsampler_runs_fully_delegated(precision: str) -> None:
    """Kernel depth 4 > stride 2: taps overlap along depth; over the zero-inserted input they fold into one conv."""
    torch.manual_seed(0)
    model = Upsampler(kernel=(4, 4, 4), padding=1).eval()
    lowered, out, reference, tolerance = lower_and_run(model, torch.randn(1, 16, 3, 6, 6), precision)  # type: ignore[arg-type]
    assert lowered.outside_ops() == {}
    assert lowered.delegated_ops()["convolution"] == 1  # the overlap-add is part of one conv_transpose2d
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


def test_without_the_rewrite_stock_1_5_1_cannot_run_the_upsampler() -> None:
    x = torch.randn(1, 16, 4, 8, 8)
    ep = torch.export.export(Upsampler().eval(), (x,))
    with pytest.raises(Exception):
        program = to_edge_transform_and_lower(ep, partitioner=[xnnguard.XnnpackPartitioner()]).to_executorch()
        run_pte(program.buffer, (x,))
