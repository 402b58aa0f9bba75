"""The tag passes: which nodes they tag, with what reason, and that they compose like torch.fx passes."""

from __future__ import annotations

import pytest
import torch
from executorch.exir import to_edge

from xnnguard import DO_NOT_DELEGATE, TagConv3dPass, TagHighRankPass
from xnnguard.report import Rule

pytestmark = pytest.mark.release_sensitive


class Permute(torch.nn.Module):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(*reversed(range(self.rank))) + 1


class Conv3dThenConv2d(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv3d = torch.nn.Conv3d(2, 4, 3)
        self.deconv3d = torch.nn.ConvTranspose3d(4, 2, 2)
        self.conv2d = torch.nn.Conv2d(2, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.deconv3d(self.conv3d(x))
        return self.conv2d(y.flatten(1, 2)[:, :2])


def _edge_gm(model: torch.nn.Module, x: torch.Tensor) -> torch.fx.GraphModule:
    return to_edge(torch.export.export(model, (x,))).exported_program().graph_module


def _tagged(gm: torch.fx.GraphModule) -> dict[str, str]:
    return {n.name: n.meta[DO_NOT_DELEGATE] for n in gm.graph.nodes if DO_NOT_DELEGATE in n.meta}


def test_high_rank_pass_tags_every_op_touching_a_7d_tensor() -> None:
    gm = _edge_gm(Permute(7), torch.randn(1, 2, 1, 2, 1, 2, 3))
    result = TagHighRankPass()(gm)
    assert result.modified
    assert set(_tagged(gm)) == {"aten_permute_copy_default", "aten_add_tensor"}
    assert all(r.rule is Rule.HIGH_RANK for r in result.report)
    assert _tagged(gm)["aten_permute_copy_default"] == "output has 7 dims > 6"


def test_high_rank_pass_leaves_a_6d_graph_alone() -> None:
    gm = _edge_gm(Permute(6), torch.randn(1, 2, 1, 2, 1, 2))
    result = TagHighRankPass()(gm)
    assert not result.modified
    assert _tagged(gm) == {}
    assert result.report == ()


def test_high_rank_pass_names_the_input_when_only_the_input_is_too_big() -> None:
    class Flatten(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(4, -1)

    gm = _edge_gm(Flatten(), torch.randn(2, 2, 1, 2, 1, 2, 3))
    TagHighRankPass()(gm)
    assert list(_tagged(gm).values()) == ["input 0 (x) has 7 dims > 6"]


def test_high_rank_pass_is_idempotent() -> None:
    gm = _edge_gm(Permute(8), torch.randn(1, 2, 1, 2, 1, 2, 1, 2))
    assert TagHighRankPass()(gm).modified
    second = TagHighRankPass()(gm)
    assert not second.modified
    assert len(second.report) == 2


def test_conv3d_pass_tags_3d_convs_and_transposed_convs_by_weight_rank() -> None:
    gm = _edge_gm(Conv3dThenConv2d(), torch.randn(1, 2, 5, 6, 6))
    result = TagConv3dPass()(gm)
    tags = _tagged(gm)
    assert sorted(tags.values()) == [
        "3-D convolution: XNNPACK has no 3-D convolution",
        "3-D transposed convolution: XNNPACK has no 3-D convolution",
    ]
    assert [r.rule for r in result.report] == [Rule.CONV3D, Rule.CONV3D]


def test_conv3d_pass_is_idempotent() -> None:
    gm = _edge_gm(Conv3dThenConv2d(), torch.randn(1, 2, 5, 6, 6))
    assert TagConv3dPass()(gm).modified
    assert not TagConv3dPass()(gm).modified


def test_a_users_tag_is_never_overwritten() -> None:
    gm = _edge_gm(Permute(7), torch.randn(1, 2, 1, 2, 1, 2, 3))
    permute = next(n for n in gm.graph.nodes if n.name == "aten_permute_copy_default")
    permute.meta[DO_NOT_DELEGATE] = "keep on CPU for profiling"
    TagHighRankPass()(gm)
    assert permute.meta[DO_NOT_DELEGATE] == "keep on CPU for profiling"
