"""Average poolings ExecuTorch 1.5.1's XNNPACK partitioner refuses, rewritten into forms it takes: a 2-D
one with ceil mode, a counted padding or a divisor override (``rewrite/reduce/avg_pool2d``), and an
adaptive one with uneven windows (``rewrite/reduce/adaptive_avg``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from testbed.flow import lower_and_run
from testbed.int8_reference import int8_against_the_original
from testbed.quantize import Precision
from xnnguard.rewrite.reduce.adaptive_avg import adaptive_avg_form, pooling_matrix
from xnnguard.rewrite.reduce.avg_pool2d import AvgPool2d, avg_pool2d_form

# (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override) over a 7 x 9 input
POOLINGS = {
    "ceil mode (a DenseNet transition on an odd size)": ((2, 2), (2, 2), (0, 0), True, True, None),
    "ceil mode with a padding it counts": ((3, 3), (2, 2), (1, 1), True, True, None),
    "ceil mode with a padding it does not count": ((3, 2), (2, 3), (1, 0), True, False, None),
    "a counted padding (Inception's 3x3 pool)": ((3, 3), (1, 1), (1, 1), False, True, None),
    "a divisor override": ((2, 3), (2, 2), (0, 1), False, False, 4),
}


@pytest.mark.parametrize("name", list(POOLINGS))
def test_the_2d_average_pooling_form_equals_pytorchs_for_every_argument(name: str) -> None:
    kernel, stride, padding, ceil_mode, counted, divisor = POOLINGS[name]
    x = torch.randn(2, 3, 7, 9, dtype=torch.float64)
    pool = AvgPool2d((7, 9), kernel, stride, padding, ceil_mode, counted, divisor)
    expected = F.avg_pool2d(x, kernel, stride, padding, ceil_mode, counted, divisor)
    form = avg_pool2d_form(x, pool, pool.ratio())
    torch.testing.assert_close(form, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("size", "out"), [((7, 9), (3, 4)), ((5, 6, 7), (2, 4, 3)), ((6, 7), (6, 3))])
def test_the_adaptive_average_pooling_form_equals_pytorchs_for_uneven_windows(
    size: tuple[int, ...], out: tuple[int, ...]
) -> None:
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    dims = tuple(d - len(size) for d in range(len(size)) if size[d] != out[d])
    matrices = [pooling_matrix(size[d], out[d], torch.float64) for d in dims]
    pooling = F.adaptive_avg_pool2d if len(size) == 2 else F.adaptive_avg_pool3d
    torch.testing.assert_close(adaptive_avg_form(x, dims, *matrices), pooling(x, out), rtol=1e-12, atol=1e-12)


class ConvPool(nn.Module):
    """A conv, then the pooling, then a conv: the pooling sits inside what should be one delegate."""

    def __init__(self, pooling: nn.Module) -> None:
        super().__init__()
        self.conv, self.pool, self.head = nn.Conv2d(3, 6, 3, padding=1), pooling, nn.Conv2d(6, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(torch.relu(self.conv(x))))


def _avg_pool(name: str) -> nn.Module:
    kernel, stride, padding, ceil_mode, counted, divisor = POOLINGS[name]
    return nn.AvgPool2d(kernel, stride, padding, ceil_mode, counted, divisor)


# fp16 for two of them (the form is the same for all; its constants are made in the graph's dtype)
@pytest.mark.parametrize(("name", "precision"), [
    *[(name, "float") for name in POOLINGS],
    *[(name, "fp16") for name in ("ceil mode with a padding it counts", "a divisor override")],
])
def test_a_2d_average_pooling_the_stock_config_refuses_is_in_the_one_delegate(name: str, precision: Precision) -> None:
    """Fuzz seeds 142, 152, 155, 163, 166: ``AvgPoolingConfig`` refused it and the program split in two."""
    torch.manual_seed(0)
    run = lower_and_run(ConvPool(_avg_pool(name)).eval(), (torch.randn(2, 3, 7, 9),), precision)
    assert run.lowered.outside_ops() == {} and run.lowered.num_delegates == 1, run.lowered.outside_ops()
    run.assert_matches()


ADAPTIVE = {
    "2-D to 3 x 4 (an ImageNet head's 7 x 7 on a smaller input)": (lambda: nn.AdaptiveAvgPool2d((3, 4)), (2, 3, 7, 9)),
    "2-D, one dim kept": (lambda: nn.AdaptiveAvgPool2d((None, 4)), (2, 3, 7, 9)),
    "2-D to an even grid (fuzz seed 21)": (lambda: nn.AdaptiveAvgPool2d((6, 2)), (1, 3, 12, 6)),
}


@pytest.mark.parametrize(("name", "precision"), [
    *[(name, "float") for name in ADAPTIVE], ("2-D to 3 x 4 (an ImageNet head's 7 x 7 on a smaller input)", "fp16"),
])
def test_an_adaptive_average_pooling_other_than_global_is_in_the_one_delegate(
    name: str, precision: Precision
) -> None:
    """Fuzz seeds 21, 155: ``_adaptive_avg_pool2d`` has no 1.5.1 config and split the program in two."""
    build, shape = ADAPTIVE[name]
    torch.manual_seed(0)
    run = lower_and_run(ConvPool(build()).eval(), (torch.randn(shape),), precision)
    assert run.lowered.outside_ops() == {} and run.lowered.num_delegates == 1, run.lowered.outside_ops()
    run.assert_matches()


class Conv3dAdaptivePool(nn.Module):
    """A video head: a Conv3d, an adaptive average pooling to a grid its input does not divide, a linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.pool, self.fc = nn.Conv3d(3, 6, 3, padding=1), nn.AdaptiveAvgPool3d((2, 3, 3)), nn.Linear(18, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(torch.relu(self.conv(x))).flatten(2))


def test_an_adaptive_3d_average_pooling_with_uneven_windows_runs_on_xnnpack() -> None:
    """Before: ``RewritePool3dPass`` left it (its size does not divide the input's), and nothing ran it."""
    torch.manual_seed(0)
    run = lower_and_run(Conv3dAdaptivePool().eval(), (torch.randn(1, 3, 5, 7, 8),))
    assert run.lowered.outside_ops() == {} and run.lowered.num_delegates == 1, run.lowered.outside_ops()
    run.assert_matches()


@pytest.mark.parametrize(
    "pooling",
    [pytest.param(lambda: _avg_pool("ceil mode with a padding it counts"), id="ceil-mode"),
     pytest.param(lambda: nn.AdaptiveAvgPool2d((3, 4)), id="adaptive-uneven"),
     pytest.param(lambda: nn.AdaptiveAvgPool2d((7, 3)), id="adaptive-even")],
)
def test_a_rewritten_average_pooling_in_static_int8_is_delegated_within_two_steps_of_the_original_quantized(
    pooling: object,
) -> None:
    """Against the un-rewritten model quantized the stock way: the pieces add no rounding of their own."""
    torch.manual_seed(0)
    model = ConvPool(pooling()).eval()  # type: ignore[operator]
    result = int8_against_the_original(model, torch.randn(2, 3, 7, 9), "static")
    assert result.lowered.outside_ops() == {} and result.lowered.num_delegates == 1, result.lowered.outside_ops()
    assert result.steps <= 2.0, f"{result.steps:.2f} steps off"
