"""The partitioner merges partitions the stock grouping leaves apart, and only where the union is convex.

``xnnguard.partition.merge``: ExecuTorch's ``GroupBasedPartitioner`` asks each pair of partitions once,
so a pair refused early stays apart even when nothing outside XNNPACK lies between them.
"""

from __future__ import annotations

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as StockPartitioner
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config
from torch import nn

import xnnguard
from testbed.lowered import lower, run_pte

pytestmark = pytest.mark.release_sensitive

DYNAMIC = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)


class SharedNormTwoLinears(nn.Module):
    """Hiera's stage change: one layer norm read by two linears, a max over a dim after each."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, 2 * dim)
        self.qkv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(2 * dim, 2 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        a = self.proj(y)  # in this order: the stock grouping asks the pair that would merge too early
        a = a.view(a.shape[0], 4, -1, a.shape[-1]).max(dim=1).values
        b = self.qkv(y)
        b = b.view(b.shape[0], 4, -1, b.shape[-1]).max(dim=1).values
        return self.out(a + b)


class CumsumBetween(nn.Module):
    """Two delegable stretches with ``cumsum`` between them, an op no XNNPACK config takes."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.first(x))
        return torch.relu(self.second(torch.cumsum(y, dim=1) + y))


def _dynamic_int8_program(batch: str) -> tuple[torch.export.ExportedProgram, torch.fx.GraphModule, torch.Tensor]:
    """The model rewritten and dynamically quantized the xnnguard way, exported; its converted model."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    x = torch.randn(2, 16, 32)
    shapes = ({0: torch.export.Dim("batch", min=1, max=8)},) if batch == "dynamic" else None
    model = SharedNormTwoLinears().eval()
    ep = xnnguard.XnnpackRewriter()(torch.export.export(model, (x,), dynamic_shapes=shapes))
    prepared = prepare_pt2e(ep.module(), xnnguard.XNNPACKQuantizer().set_global(DYNAMIC))
    prepared(x)
    converted = convert_pt2e(prepared)
    return torch.export.export(converted, (x,), dynamic_shapes=shapes), converted, x


def test_stock_1_5_1_cuts_two_dynamically_quantized_linears_of_one_input_into_two_delegates() -> None:
    ep, _, x = _dynamic_int8_program("static")
    lowered = lower(ep, (x,), StockPartitioner())
    assert lowered.num_delegates == 2
    assert not lowered.outside_ops()


@pytest.mark.parametrize("batch", ["static", "dynamic"])
def test_two_dynamically_quantized_linears_of_one_input_make_one_delegate_that_matches(batch: str) -> None:
    ep, converted, x = _dynamic_int8_program(batch)
    lowered = lower(ep, (x,), xnnguard.XnnpackPartitioner())
    assert lowered.num_delegates == 1
    assert not lowered.outside_ops()
    for inputs in [x, x[:1], torch.randn(5, 16, 32)] if batch == "dynamic" else [x]:
        expected = converted(inputs)
        step = float(expected.max() - expected.min()) / 255
        assert (run_pte(lowered.buffer, (inputs,))[0] - expected).abs().max() <= 2 * step


def test_partitions_with_an_op_outside_xnnpack_between_them_stay_two_delegates() -> None:
    torch.manual_seed(0)
    model, x = CumsumBetween().eval(), torch.randn(2, 8, 16)
    lowered = lower(model, (x,), xnnguard.XnnpackPartitioner())
    assert lowered.num_delegates == 2
    assert lowered.outside_ops()["cumsum"] == 1
    torch.testing.assert_close(run_pte(lowered.buffer, (x,))[0], model(x), atol=1e-5, rtol=1e-5)
