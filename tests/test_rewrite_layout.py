"""Layout: a chain of reshapes and permutes that moves no element becomes one reshape (or nothing)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.rewrite_support import PRECISIONS, lower_and_run
from xnnguard.rewrite.layout.movement_chains import CollapseMovementChainsPass
from xnnguard.rewrite.rewrite_for_xnnpack import XnnpackRewriter, default_rewrites


def _frame_wise_pair() -> nn.Module:
    """Two (1, 3, 3) convs: each folds frames into the batch and unfolds them again after."""
    return nn.Sequential(
        nn.Conv3d(4, 8, (1, 3, 3), padding=(0, 1, 1)),
        nn.ReLU(inplace=True),
        nn.Conv3d(8, 8, (1, 3, 3), padding=(0, 1, 1)),
    ).eval()


def _permutes(ep: torch.export.ExportedProgram) -> int:
    return sum(node.target is torch.ops.aten.permute.default for node in ep.graph_module.graph.nodes)


def _conv_inputs(ep: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    convs = [node for node in ep.graph_module.graph.nodes if node.target is torch.ops.aten.conv2d.default]
    return [conv.args[0] for conv in convs]  # type: ignore[misc]


def test_a_conv3d_after_a_conv3d_reads_the_first_ones_folded_frames_directly() -> None:
    model, x = _frame_wise_pair(), torch.randn(1, 4, 3, 8, 8)
    ep = XnnpackRewriter(strict=True)(torch.export.export(model, (x,)))
    _, second = _conv_inputs(ep)
    assert second.target is torch.ops.aten.relu.default and second.args[0].target is torch.ops.aten.conv2d.default
    assert _permutes(ep) == 2  # the clip into frames, the frames back into a clip
    torch.testing.assert_close(ep.module()(x), model(x), atol=1e-6, rtol=1e-6)


def test_without_the_layout_pass_the_frames_go_back_and_forth_between_the_two_convs() -> None:
    x = torch.randn(1, 4, 3, 8, 8)
    passes = [p for p in default_rewrites() if not isinstance(p, CollapseMovementChainsPass)]
    ep = XnnpackRewriter(passes, strict=True)(torch.export.export(_frame_wise_pair(), (x,)))
    assert _permutes(ep) == 4


def test_a_chain_that_moves_elements_is_left_as_it_is() -> None:
    class Transpose(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(2, 3, 4).permute(0, 2, 1).reshape(2, 12) + 1

    x = torch.randn(6, 4)
    graph_module = torch.export.export(Transpose(), (x,)).module()
    result = CollapseMovementChainsPass()(graph_module)
    assert result is not None and not result.modified
    torch.testing.assert_close(result.graph_module(x), Transpose()(x), atol=0, rtol=0)


def test_a_chain_that_moves_nothing_collapses_to_one_reshape() -> None:
    class RoundTrip(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(2, 3, 4).permute(0, 2, 1).permute(0, 2, 1).reshape(6, 4) + 1

    x = torch.randn(24)
    graph_module = torch.export.export(RoundTrip(), (x,)).module()
    result = CollapseMovementChainsPass()(graph_module)
    assert result is not None and result.modified
    ops = [n.target for n in result.graph_module.graph.nodes if n.op == "call_function"]
    assert ops == [torch.ops.aten.reshape.default, torch.ops.aten.add.Tensor]
    torch.testing.assert_close(result.graph_module(x), RoundTrip()(x), atol=0, rtol=0)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_two_frame_wise_convs_lower_to_one_delegate_and_match(precision: str) -> None:
    torch.manual_seed(0)
    lowered, out, reference, tolerance = lower_and_run(_frame_wise_pair(), torch.randn(1, 4, 3, 8, 8), precision)  # type: ignore[arg-type]
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)
