"""BatchNorm3d: folded into the 3-D conv before it, or run on a 4-D view; either way delegated to XNNPACK."""

from __future__ import annotations

import torch

import xnnguard
from testbed.flow import lower_and_run, rewritten
from testbed.lowered import lower, run_pte
from tests.support import ops


class PoolThenNorm(torch.nn.Module):
    """A BatchNorm3d with no conv in front of it (after a pooling), so there is nothing to fold it into."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = torch.nn.MaxPool3d((1, 2, 2))
        self.bn = torch.nn.BatchNorm3d(4)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.pool(x)))


def test_batch_norm_after_a_conv3d_is_folded_into_it() -> None:
    model = torch.nn.Sequential(torch.nn.Conv3d(3, 4, 3), torch.nn.BatchNorm3d(4)).eval()
    x = torch.randn(1, 3, 5, 6, 6)
    ep = rewritten(model, x)
    assert "batch_norm" not in ops(ep) and "_native_batch_norm_legit_no_training" not in ops(ep)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


def test_batch_norm_with_nothing_to_fold_into_runs_on_a_4d_view_fully_delegated() -> None:
    torch.manual_seed(0)
    lowered, out, reference, tolerance = lower_and_run(PoolThenNorm().eval(), torch.randn(1, 4, 3, 8, 8), "float")
    assert lowered.outside_ops() == {}
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


def test_batch_norm_with_a_dynamic_batch_runs_on_a_4d_view_fully_delegated_at_every_batch() -> None:
    torch.manual_seed(0)
    model, x = PoolThenNorm().eval(), torch.randn(2, 4, 3, 8, 8)
    batch = ({0: torch.export.Dim("batch", min=1, max=8)},)
    ep = xnnguard.rewrite_for_xnnpack(torch.export.export(model, (x,), dynamic_shapes=batch), strict=True)
    lowered = lower(ep, (x,), xnnguard.XnnpackPartitioner())
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1, lowered.outside_ops()
    for size in (1, 2, 5):
        other = torch.randn(size, 4, 3, 8, 8)
        torch.testing.assert_close(run_pte(lowered.buffer, (other,))[0], model(other), atol=1e-5, rtol=1e-5)
