"""bfloat16: ExecuTorch 1.5.1 delegates it only with ``enable_bf16=True``, and XNNPACK then runs few ops in it.

By default every bfloat16 node stays on portable kernels, each with a record that says so. With
``enable_bf16=True`` the stock partitioner delegates a bfloat16 convolution, which fails at load;
xnnguard's keeps it out (``xnnguard.rules.bfloat16``) and delegates the linear and elementwise ops.
"""

from __future__ import annotations

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as StockXnnpackPartitioner
from torch import nn

import xnnguard
from testbed.lowered import lower, run_pte
from tests.compat_marks import needs_bfloat16_opt_in
from xnnguard.report import Rule

pytestmark = pytest.mark.release_sensitive


class LinearAndConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear, self.conv = nn.Linear(16, 16), nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(self.linear(x)) * 2, self.conv(image)


def _bfloat16() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return LinearAndConv().eval().bfloat16(), (torch.randn(2, 16).bfloat16(), torch.randn(1, 3, 8, 8).bfloat16())


def _program(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.export.ExportedProgram:
    return xnnguard.rewrite_for_xnnpack(torch.export.export(model, inputs))


def test_a_bfloat16_program_runs_outside_xnnpack_by_default_and_every_node_says_why() -> None:
    model, inputs = _bfloat16()
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = lower(_program(model, inputs), inputs, partitioner)
    assert lowered.num_delegates == 0
    assert {record.rule for record in partitioner.report} == {Rule.BFLOAT16}
    assert len(partitioner.report) == sum(lowered.outside_ops().values())
    linear = [record for record in partitioner.report if "addmm" in record.op]
    assert linear and "enable_bf16=True" in linear[0].reason
    out, _ = run_pte(lowered.buffer, inputs)
    torch.testing.assert_close(out, model(*inputs)[0], atol=0.05, rtol=0.02)


@needs_bfloat16_opt_in
def test_with_enable_bf16_a_bfloat16_convolution_fails_stock_and_xnnguard_keeps_it_out_and_delegates_the_rest() -> None:
    model, inputs = _bfloat16()
    with pytest.raises(Exception):  # delegated, then XNNPACK has no bfloat16 convolution: load fails
        run_pte(lower(_program(model, inputs), inputs, StockXnnpackPartitioner(enable_bf16=True)).buffer, inputs)
    partitioner = xnnguard.XnnpackPartitioner(enable_bf16=True)
    lowered = lower(_program(model, inputs), inputs, partitioner)
    assert lowered.num_delegates == 1 and {"linear", "relu", "mul"} <= set(lowered.delegated_ops())
    (record,) = [record for record in partitioner.report if "convolution" in record.op]
    assert record.rule is Rule.BFLOAT16 and "fails at load" in record.reason
    out, image_out = run_pte(lowered.buffer, inputs)
    expected, expected_image = model(*inputs)  # bfloat16 has 8 significant bits: within a few of its steps
    torch.testing.assert_close(out, expected, atol=0.05, rtol=0.02)
    torch.testing.assert_close(image_out, expected_image, atol=0.05, rtol=0.02)
