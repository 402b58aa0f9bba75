"""Composing rewrites: the runner keeps every report, checks every postcondition, and re-export keeps dynamic dims."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge_transform_and_lower
from torch.export import Dim
from torch.fx.passes.infra.pass_base import PassBase

import xnnguard
from tests.support import ClassTokenOfIds
from xnnguard.pass_result import ReportedPassResult
from xnnguard.report import Rule
from xnnguard.rewrite.attention.sdpa import AttentionAsBmmPass
from xnnguard.rewrite.conv3d.batch_norm3d import RewriteBatchNorm3dPass
from xnnguard.rewrite.conv3d.conv3d import RewriteConv3dPass
from xnnguard.rewrite.conv3d.conv_transpose3d import RewriteConvTranspose3dPass
from xnnguard.rewrite.conv3d.fold_batch_norm3d import FoldBatchNorm3dPass
from xnnguard.rewrite.conv3d.pool3d import RewritePool3dPass
from xnnguard.rewrite.fold.fold_constants import FoldConstantsPass
from xnnguard.rewrite.forms.max_keepdim import MaxKeepdimPass
from xnnguard.rewrite.forms.prelu_to_4d import PReLUTo4dPass
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.norm import (
    RewriteGroupNormPass,
    RewriteInstanceNormPass,
    RewriteLayerNormPass,
    RewriteRmsNormPass,
)
from xnnguard.rewrite.rank.cat import ReduceRankCatPass
from xnnguard.rewrite.rank.elementwise import ReduceRankElementwisePass
from xnnguard.rewrite.rank.fuse_views import FuseHighRankViewsPass
from xnnguard.rewrite.rank.layer_norm import ReduceRankLayerNormPass
from xnnguard.rewrite.rank.linear import FlattenHighRankLinearPass
from xnnguard.rewrite.rank.permute import ReduceRankPermutePass
from xnnguard.rewrite.rank.reduce_rank import ReduceRankPass
from xnnguard.rewrite.rank.reduction import ReduceRankReductionPass
from xnnguard.rewrite.rank.slice import ReduceRankSlicePass
from xnnguard.rewrite.reduce import MeanKeepdimPass, RewriteExtremumPass, RewritePowerPass, RewriteSumPass
from xnnguard.rewrite.rewrite_for_xnnpack import RewriteError, XnnpackRewriter
from xnnguard.rewrite.runner import run_passes
from xnnguard.rewrite.upsample.nearest import NearestUpsamplePass
from xnnguard.rewrite.views.expand import BroadcastViewsPass
from xnnguard.rewrite.views.inplace_updates import InPlaceSliceUpdatesPass
from xnnguard.rewrite.views.matmul import MatmulAsBmmPass
from xnnguard.rewrite.views.roll import RollAsSlicesPass
from xnnguard.rewrite.views.slices import ViewsAsSlicesPass
from xnnguard.rewrite.views.strided_slice import StridedSliceAsReshapePass
from xnnguard.rules.keep_out import keep_out_reason
from xnnguard.tagging import DO_NOT_DELEGATE, TagConv3dPass, TagHighRankPass

EIGHT_D = (2, 1, 2, 3, 1, 2, 2, 3)


class Lambda(torch.nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor], *modules: torch.nn.Module) -> None:
        super().__init__()
        self.fn = fn
        self.parts = torch.nn.ModuleList(modules)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.fn(self.parts, *xs)


def _conv3d_bn() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return torch.nn.Sequential(torch.nn.Conv3d(2, 3, 1), torch.nn.BatchNorm3d(3)).eval(), (torch.randn(1, 2, 2, 3, 3),)


def _high_rank(fn: Callable[..., torch.Tensor], *modules: torch.nn.Module) -> Callable[[], tuple]:
    """A model that views its 2-D input as 8-D, applies ``fn`` and views the result back to 2-D."""

    def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        def forward(parts: torch.nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
            return fn(parts, x.reshape(EIGHT_D)).reshape(x.shape[0], -1)

        return Lambda(forward, *modules).eval(), (torch.randn(2, 72),)

    return build


# Each pass that states a postcondition, with a model that has a node the pass must handle.
CASES: dict[str, tuple[type[PassBase], Callable[[], tuple]]] = {
    "FoldBatchNorm3dPass": (FoldBatchNorm3dPass, _conv3d_bn),
    "RewriteBatchNorm3dPass": (
        RewriteBatchNorm3dPass,
        lambda: (torch.nn.BatchNorm3d(2).eval(), (torch.randn(1, 2, 2, 3, 3),)),
    ),
    "RewriteConv3dPass": (RewriteConv3dPass, lambda: (torch.nn.Conv3d(2, 3, 2).eval(), (torch.randn(1, 2, 3, 4, 4),))),
    "RewriteConvTranspose3dPass": (
        RewriteConvTranspose3dPass,
        lambda: (torch.nn.ConvTranspose3d(2, 3, 2).eval(), (torch.randn(1, 2, 3, 4, 4),)),
    ),
    "RewritePool3dPass": (RewritePool3dPass, lambda: (torch.nn.MaxPool3d(2).eval(), (torch.randn(1, 2, 4, 4, 4),))),
    "MaxKeepdimPass": (
        MaxKeepdimPass,
        lambda: (Lambda(lambda _, x: torch.max(x, dim=-1)[0]).eval(), (torch.randn(1, 2, 3, 4),)),
    ),
    "PReLUTo4dPass": (PReLUTo4dPass, lambda: (torch.nn.PReLU(2).eval(), (torch.randn(1, 2, 3, 4, 5),))),
    "ReduceRankPermutePass": (ReduceRankPermutePass, _high_rank(lambda _, y: y.permute(0, 2, 4, 6, 1, 3, 5, 7))),
    "ReduceRankElementwisePass": (ReduceRankElementwisePass, _high_rank(lambda _, y: torch.relu(y) + 1)),
    "ReduceRankReductionPass": (ReduceRankReductionPass, _high_rank(lambda _, y: torch.softmax(y, -1))),
    "ReduceRankLayerNormPass": (
        ReduceRankLayerNormPass,
        _high_rank(lambda parts, y: parts[0](y), torch.nn.LayerNorm(3)),
    ),
    "ReduceRankCatPass": (ReduceRankCatPass, _high_rank(lambda _, y: torch.cat([y, y], 3)[:, :, :, :3])),
    "ReduceRankSlicePass": (ReduceRankSlicePass, _high_rank(lambda _, y: y[:, :, :, 1:] * 2)),
    "FlattenHighRankLinearPass": (
        FlattenHighRankLinearPass,
        _high_rank(lambda parts, y: parts[0](y), torch.nn.Linear(3, 3)),
    ),
    "RewriteLayerNormPass": (RewriteLayerNormPass, lambda: (torch.nn.LayerNorm(4).eval(), (torch.randn(2, 3, 4),))),
    "RewriteRmsNormPass": (RewriteRmsNormPass, lambda: (torch.nn.RMSNorm(4).eval(), (torch.randn(2, 3, 4),))),
    "RewriteGroupNormPass": (
        RewriteGroupNormPass,
        lambda: (torch.nn.GroupNorm(2, 4).eval(), (torch.randn(1, 4, 3, 3),)),
    ),
    "RewriteInstanceNormPass": (
        RewriteInstanceNormPass,
        lambda: (torch.nn.InstanceNorm3d(2).eval(), (torch.randn(1, 2, 2, 3, 3),)),
    ),
    "MeanKeepdimPass": (
        MeanKeepdimPass,
        lambda: (Lambda(lambda _, x: x.mean((2, 3))).eval(), (torch.randn(1, 2, 3, 4),)),
    ),
    "RewriteSumPass": (RewriteSumPass, lambda: (Lambda(lambda _, x: x.mean(1)).eval(), (torch.randn(1, 2, 3, 4, 5),))),
    "RewriteExtremumPass": (
        RewriteExtremumPass,
        lambda: (Lambda(lambda _, x: torch.max(x, dim=1)[0]).eval(), (torch.randn(1, 2, 3, 4),)),
    ),
    "RewritePowerPass": (RewritePowerPass, lambda: (Lambda(lambda _, x: x**2.0).eval(), (torch.randn(2, 3),))),
}


def _elementwise(fn: Callable[..., torch.Tensor], *shapes: tuple[int, ...]) -> Callable[[], tuple]:
    """A model computing ``fn(*inputs)`` on inputs of ``shapes``."""
    return lambda: (Lambda(lambda _, *xs: fn(*xs)).eval(), tuple(torch.randn(shape) for shape in shapes))


def _slice_update(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y[:, 1:] += 1.0
    return y


CASES.update({
    "FoldConstantsPass": (
        FoldConstantsPass,
        lambda: (Lambda(lambda parts, x: x + parts[0].weight.t().cumsum(0), torch.nn.Linear(2, 3)).eval(),
                 (torch.randn(2, 3),)),
    ),
    "InPlaceSliceUpdatesPass": (InPlaceSliceUpdatesPass, _elementwise(_slice_update, (2, 3))),
    "ViewsAsSlicesPass": (ViewsAsSlicesPass, _elementwise(lambda x: (x * 2)[:, 1].squeeze(0), (1, 3, 4))),
    "StridedSliceAsReshapePass": (StridedSliceAsReshapePass, _elementwise(lambda x: (x * 2)[:, ::2], (2, 6))),
    "RollAsSlicesPass": (RollAsSlicesPass, _elementwise(lambda x: torch.roll(x, 2, 1), (2, 6))),
    "BroadcastViewsPass": (
        BroadcastViewsPass, _elementwise(lambda x: torch.cat([x.expand(2, 3), x.repeat(2, 1)]), (1, 3))
    ),
    "MatmulAsBmmPass": (MatmulAsBmmPass, _elementwise(torch.matmul, (2, 2, 3, 4), (2, 2, 4, 5))),
    "NearestUpsamplePass": (
        NearestUpsamplePass, _elementwise(lambda x: F.interpolate(x, scale_factor=2), (1, 2, 3, 4))
    ),
    "AttentionAsBmmPass": (AttentionAsBmmPass, _elementwise(F.scaled_dot_product_attention, *[(1, 2, 5, 4)] * 3)),
})


def _graph(build: Callable[[], tuple]) -> torch.fx.GraphModule:
    model, inputs = build()
    return torch.export.export(model, inputs).module()


def _claims_success_without_rewriting(cls: type[NodeRewritePass]) -> type[NodeRewritePass]:
    """``cls`` with a rewrite that says it replaced its node and leaves the graph as it was."""
    return type(f"Broken{cls.__name__}", (cls,), {"rewrite": lambda self, graph_module, node: None})


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_rewrite_keeps_its_postcondition(name: str) -> None:
    cls, build = CASES[name]
    graph_module = _graph(build)
    assert cls().applies_to(graph_module)  # type: ignore[attr-defined]
    run_passes([cls()], graph_module, strict=True)  # raises if the postcondition breaks


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_rewrite_that_claims_success_without_rewriting_breaks_its_postcondition(name: str) -> None:
    cls, build = CASES[name]
    broken = _claims_success_without_rewriting(cls)  # type: ignore[arg-type]
    with pytest.raises(RewriteError, match=f"Broken{name} broke its postcondition"):
        run_passes([broken()], _graph(build), strict=True)


def test_outside_strict_mode_a_broken_postcondition_is_reported_and_the_rewrite_goes_on() -> None:
    broken = _claims_success_without_rewriting(RewriteConv3dPass)
    result = run_passes([broken(), RewritePool3dPass()], _graph(CASES["RewriteConv3dPass"][1]))
    (record,) = result.report
    assert record.rule is Rule.NOT_REWRITTEN and "BrokenRewriteConv3dPass promises" in record.reason


def test_the_view_folding_keeps_its_postcondition_and_a_pass_that_skips_it_breaks_it() -> None:
    build = _high_rank(lambda _, y: y * 2)
    graph_module = _graph(build)
    run_passes([ReduceRankElementwisePass(), FuseHighRankViewsPass()], graph_module, strict=True)

    class SkipsFolding(FuseHighRankViewsPass):
        def call(self, graph_module: torch.fx.GraphModule) -> ReportedPassResult:
            return ReportedPassResult(graph_module, False, ())

    with pytest.raises(RewriteError, match="SkipsFolding broke its postcondition"):
        run_passes([ReduceRankElementwisePass(), SkipsFolding()], _graph(build), strict=True)


def test_the_rank_reduction_tags_what_it_leaves_and_a_composite_that_does_not_breaks_its_postcondition() -> None:
    build = _high_rank(lambda _, y: torch.cumsum(y, 3))  # no rank-reduction rewrite for cumsum
    result = run_passes([ReduceRankPass(strict=True)], _graph(build), strict=True)
    assert {record.rule for record in result.report} == {Rule.HIGH_RANK}
    assert any("cumsum" in record.op for record in result.report)

    class ForgetsToTag(ReduceRankPass):
        def call(self, graph_module: torch.fx.GraphModule) -> ReportedPassResult:
            return ReportedPassResult(graph_module, False, ())

    with pytest.raises(RewriteError, match="ForgetsToTag broke its postcondition"):
        run_passes([ForgetsToTag()], _graph(build), strict=True)


@pytest.mark.parametrize("tag_pass", [TagHighRankPass, TagConv3dPass])
def test_a_tag_pass_that_tags_nothing_breaks_its_postcondition(tag_pass: type[PassBase]) -> None:
    class TagsNothing(tag_pass):  # type: ignore[valid-type,misc]
        def call(self, graph_module: torch.fx.GraphModule) -> ReportedPassResult:
            return ReportedPassResult(graph_module, False, ())

    def forward(parts: torch.nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
        return parts[0](x).sum() + (x.reshape(1, 2, 1, 2, 1, 2, 2, 3) * 2).sum()

    model = Lambda(forward, torch.nn.Conv3d(2, 2, 1))
    graph_module = _graph(lambda: (model.eval(), (torch.randn(1, 2, 2, 2, 6),)))
    run_passes([tag_pass()], graph_module, strict=True)
    with pytest.raises(RewriteError, match="TagsNothing broke its postcondition"):
        run_passes([TagsNothing()], _graph(lambda: (model.eval(), (torch.randn(1, 2, 2, 2, 6),))), strict=True)


class EveryRewriteLeavesOne(torch.nn.Module):
    """A Conv3d with a dynamic height, a 3-D max pool whose indices are used, an op on the graph's 8-D input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(2, 2, 1)

    def forward(self, x: torch.Tensor, v: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pooled, indices = F.max_pool3d(v, 2, return_indices=True)
        return self.conv(x), pooled, indices, high * 2


def test_the_rewriter_keeps_the_report_of_every_pass_it_runs() -> None:
    inputs = (torch.randn(1, 2, 4, 3, 3), torch.randn(1, 2, 4, 4, 4), torch.randn(*EIGHT_D))
    ep = torch.export.export(EveryRewriteLeavesOne().eval(), inputs, dynamic_shapes=({3: Dim("height")}, None, None))
    rewriter = XnnpackRewriter(strict=True)
    rewriter(ep)
    assert {record.rule for record in rewriter.report} == {Rule.CONV3D, Rule.HIGH_RANK, Rule.NOT_REWRITTEN}


def test_a_node_xnnguard_tagged_reports_its_own_rule_not_user_tag() -> None:
    class PoolWithIndices(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return F.max_pool3d(x, 2, return_indices=True)

    x = torch.randn(1, 2, 4, 4, 4)
    ep = xnnguard.rewrite_for_xnnpack(torch.export.export(PoolWithIndices(), (x,)), strict=True)
    (pool,) = [node for node in ep.graph.nodes if "max_pool3d" in str(node.target)]
    record = keep_out_reason(pool)  # asked after the re-export, as the partitioner asks it
    assert record is not None and record.rule is Rule.NOT_REWRITTEN and "indices are used" in record.reason
    # the partitioner reports it too, by the rewrite's rule, though no XNNPACK config exists for the op
    partitioner = xnnguard.XnnpackPartitioner()
    to_edge_transform_and_lower(ep, partitioner=[partitioner])
    (reported,) = [r for r in partitioner.report if "max_pool3d" in r.op]
    assert (reported.rule, reported.reason) == (Rule.NOT_REWRITTEN, record.reason)


def test_a_node_the_user_tagged_reports_user_tag() -> None:
    class Add(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    graph_module = _graph(lambda: (Add(), (torch.randn(2),)))
    (add,) = [node for node in graph_module.graph.nodes if node.op == "call_function"]
    add.meta[DO_NOT_DELEGATE] = "runs on the DSP"
    record = keep_out_reason(add)
    assert record is not None and record.rule is Rule.USER_TAG and record.reason == "tagged by user: runs on the DSP"


class StaticPoolDynamicAdd(torch.nn.Module):
    def forward(
        self, x: torch.Tensor, v: torch.Tensor, skip: torch.Tensor | None = None, scale: float = 2.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return x * scale, F.max_pool3d(v, 2)


@pytest.mark.parametrize(
    "args, kwargs, shapes",
    [
        ((torch.randn(2, 3), torch.randn(1, 2, 4, 4, 4)), {}, ({0: Dim.DYNAMIC}, None)),
        ((torch.randn(2, 3), torch.randn(1, 2, 4, 4, 4), None, 3.0), {}, ({0: Dim("batch", max=64)}, None, None, None)),
        ((torch.randn(2, 3), torch.randn(1, 2, 4, 4, 4)), {"scale": 3.0}, {"x": {0: Dim.DYNAMIC}, "v": None, "scale": None}),  # noqa: E501
        ((), {"x": torch.randn(2, 3), "v": torch.randn(1, 2, 4, 4, 4)}, {"x": {0: Dim.DYNAMIC}, "v": None}),
    ],
    ids=["positional", "with None and a constant input", "a constant keyword input", "keyword inputs"],
)
def test_the_rewritten_program_keeps_its_dynamic_dims(args: tuple, kwargs: dict, shapes: object) -> None:
    model = StaticPoolDynamicAdd()
    ep = torch.export.export(model, args, kwargs, dynamic_shapes=shapes)
    rewritten = xnnguard.rewrite_for_xnnpack(ep, strict=True)
    assert "max_pool3d" not in str(rewritten.graph)
    x = next(n for n in rewritten.graph.nodes if n.op == "placeholder" and n.name == "x")
    assert not isinstance(x.meta["val"].shape[0], int), "the batch of x became static"
    bigger = torch.randn(5, 3)  # another batch than the example's
    args = (bigger, *args[1:]) if args else args
    kwargs = {**kwargs, "x": bigger} if "x" in kwargs else kwargs
    torch.testing.assert_close(rewritten.module()(*args, **kwargs), model(*args, **kwargs))


def test_a_node_a_pass_leaves_untagged_stays_untagged_when_nothing_is_rewritten() -> None:
    x = torch.randint(0, 10, (2, 3))
    ep = torch.export.export(ClassTokenOfIds().eval(), (x,), dynamic_shapes=({0: torch.export.Dim("batch", max=4)},))
    rewriter = xnnguard.XnnpackRewriter()
    rewritten = rewriter(ep)
    assert [record.op for record in rewriter.report] == ["expand.default"]  # reported, all the same
    assert not [node for node in rewritten.graph.nodes if DO_NOT_DELEGATE in node.meta]
