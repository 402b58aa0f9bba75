"""Layout: the 3-D rewrites' convs read each other's frames through one permute at most, not a round trip.

A chain of reshapes and permutes becomes the one reshape or permute it amounts to; an elementwise op
whose operands come through alike chains runs before them; a (k, 1, 1) conv of a single clip runs on
rows, one 4-D permute from the spatial convs' frames.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from testbed.flow import lower_and_run
from testbed.quantize import PRECISIONS
from tests.support import SeparableBlock, rows_in_slow_tier
from xnnguard.rewrite.layout.cat_sinking import SinkCatThroughMovesPass
from xnnguard.rewrite.layout.elementwise_sinking import SinkElementwiseThroughMovesPass
from xnnguard.rewrite.layout.movement_chains import CollapseMovementChainsPass, reshape_permute_reshape
from xnnguard.rewrite.layout.shared_moves import ShareMovesPass
from xnnguard.rewrite.layout.transposes import TransposesAsPermutesPass
from xnnguard.rewrite.provenance import RewriteStamp, rewrite_stamp, stamp
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


def test_a_chain_that_shared_its_permute_with_a_collapsed_one_collapses_too() -> None:
    """The first chain can only collapse once the second has, which comes after it in the graph."""

    class Shared(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            p = (x * 2).permute(1, 0, 2)
            first = p.reshape(3, 8).reshape(3, 2, 4)  # a permute, but only two reshapes to free while p is shared
            second = p.permute(1, 0, 2)  # moves nothing
            return first + 1, second + 1

    x = torch.randn(2, 3, 4)
    graph_module = torch.export.export(Shared(), (x,)).module()
    result = CollapseMovementChainsPass()(graph_module)
    assert result is not None and result.modified
    ops = [n.target for n in result.graph_module.graph.nodes if n.op == "call_function"]
    assert ops.count(torch.ops.aten.reshape.default) == 0 and ops.count(torch.ops.aten.permute.default) == 1
    for got, expected in zip(result.graph_module(x), Shared()(x)):
        torch.testing.assert_close(got, expected, atol=0, rtol=0)


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


def _pooled_attention_fold(x: torch.Tensor, transpose: bool = False) -> torch.Tensor:
    """MViT's pooled attention: tokens (1, heads, T*H*W, C) to frames in the batch, channels first."""
    channels_first = x.transpose(2, 3) if transpose else x.permute(0, 1, 3, 2)
    return channels_first.reshape(4, 6, 3, 5, 5).permute(0, 2, 1, 3, 4).reshape(4, 3, 150)


def test_a_chain_with_two_permutes_becomes_one_permute_between_two_reshapes() -> None:
    class Fold(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _pooled_attention_fold(x) + 1

    x = torch.randn(1, 4, 75, 6)
    graph_module = torch.export.export(Fold(), (x,)).module()
    result = CollapseMovementChainsPass()(graph_module)
    assert result is not None and result.modified
    moves = [(n.target, n.args[1]) for n in result.graph_module.graph.nodes if n.target in _LAYOUT_OPS]
    assert moves == [(torch.ops.aten.reshape.default, [12, 25, 6]), (torch.ops.aten.permute.default, [0, 2, 1]),
                     (torch.ops.aten.reshape.default, [4, 3, 150])]
    torch.testing.assert_close(result.graph_module(x), Fold()(x), atol=0, rtol=0)


def _random_chain(generator: random.Random) -> tuple[list[int], list[tuple[str, list[int]]]]:
    """A source shape and a chain of reshapes and permutes that keep blocks of elements together."""
    atoms = [generator.choice((2, 3, 4, 5)) for _ in range(generator.randint(2, 5))]
    order = list(range(len(atoms)))  # the atoms' current order

    def grouping() -> list[list[int]]:
        cuts = sorted(generator.sample(range(1, len(order)), generator.randint(0, len(order) - 1)))
        return [order[a:b] for a, b in zip([0, *cuts], [*cuts, len(order)])]

    dims = grouping()
    shape = [math.prod(atoms[a] for a in dim) for dim in dims]
    chain: list[tuple[str, list[int]]] = []
    for _ in range(generator.randint(2, 5)):
        if generator.random() < 0.5 and len(dims) > 1:
            perm = generator.sample(range(len(dims)), len(dims))
            dims = [dims[p] for p in perm]
            order = [a for dim in dims for a in dim]
            chain.append(("permute", perm))
        else:
            dims = grouping()
            chain.append(("reshape", [math.prod(atoms[a] for a in dim) for dim in dims]))
    return shape, chain


def test_every_chain_that_keeps_blocks_together_is_a_reshape_a_permute_and_a_reshape() -> None:
    generator = random.Random(0)
    for _ in range(200):
        shape, steps = _random_chain(generator)

        class Chain(nn.Module):
            def forward(self, x: torch.Tensor, steps: list[tuple[str, list[int]]] = steps) -> torch.Tensor:
                for kind, args in steps:
                    x = x.permute(args) if kind == "permute" else x.reshape(args)
                return x

        x = torch.arange(math.prod(shape)).reshape(shape)
        graph_module = torch.export.export(Chain(), (x,)).module()
        chain = [n for n in graph_module.graph.nodes if n.target in _LAYOUT_OPS]
        moves = reshape_permute_reshape(shape, chain)
        assert moves is not None, (shape, steps)
        got = x
        for target, args in moves:
            got = target(got, args)  # type: ignore[operator]
        assert torch.equal(got, Chain()(x)), (shape, steps, moves)
        assert sum(target is torch.ops.aten.permute.default for target, _ in moves) <= 1


def test_a_transpose_is_the_permute_that_swaps_its_two_dims() -> None:
    class Transpose(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.transpose(1, -1) + 1

    x = torch.randn(2, 3, 4, 5)
    result = TransposesAsPermutesPass()(torch.export.export(Transpose(), (x,)).module())
    assert result is not None and result.modified
    permutes = [n.args[1] for n in result.graph_module.graph.nodes if n.target is torch.ops.aten.permute.default]
    assert permutes == [[0, 3, 2, 1]]
    torch.testing.assert_close(result.graph_module(x), Transpose()(x), atol=0, rtol=0)


def test_a_pooled_attention_fold_written_with_a_transpose_moves_its_tokens_in_one_permute() -> None:
    class Fold(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _pooled_attention_fold(x, transpose=True) * 2

    x = torch.randn(1, 4, 75, 6)
    ep = XnnpackRewriter(strict=True)(torch.export.export(Fold(), (x,)))
    moves = [n.target for n in ep.graph_module.graph.nodes if n.target in (*_LAYOUT_OPS, torch.ops.aten.transpose.int)]
    assert moves.count(torch.ops.aten.permute.default) == 1 and torch.ops.aten.transpose.int not in moves
    torch.testing.assert_close(ep.module()(x), Fold()(x), atol=0, rtol=0)


_LAYOUT_OPS = (torch.ops.aten.permute.default, torch.ops.aten.reshape.default)


def _through_layout_ops(node: torch.fx.Node) -> list[object]:
    """The reshape/permute targets between ``node`` and the compute op it reads."""
    found = []
    while node.target in _LAYOUT_OPS:
        found.append(node.target)
        node = node.args[0]  # type: ignore[assignment]
    return found


def test_a_temporal_conv_of_one_clip_reads_the_spatial_convs_frames_through_one_permute() -> None:
    model, x = SeparableBlock().eval(), torch.randn(1, 3, 4, 8, 8)
    ep = XnnpackRewriter(strict=True)(torch.export.export(model, (x,)))
    *_, temporal_input = _conv_inputs(ep)
    assert _through_layout_ops(temporal_input) == [torch.ops.aten.permute.default]
    assert temporal_input.args[1] == [2, 1, 0, 3]  # (D, C, H, W) -> (H, C, D, W): whole rows move
    torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


def test_a_residual_add_and_its_relu_run_where_the_convs_run() -> None:
    model, x = SeparableBlock().eval(), torch.randn(1, 3, 4, 8, 8)
    ep = XnnpackRewriter(strict=True)(torch.export.export(model, (x,)))
    (add,) = [n for n in ep.graph_module.graph.nodes if n.target is torch.ops.aten.add.Tensor]
    assert [_through_layout_ops(operand) for operand in add.args] == [[], []]  # both in the rows layout
    torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


def test_an_in_place_op_writing_through_a_view_others_read_stays_where_it_is() -> None:
    class WritesThroughAView(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            base = x * 2
            moved = base.permute(1, 0)
            moved.add_((x * 3).permute(1, 0))  # writes into base as well
            return moved, base

    x = torch.randn(3, 4)
    graph_module = torch.export.export(WritesThroughAView(), (x,)).module()
    expected = WritesThroughAView()(x)
    result = SinkElementwiseThroughMovesPass()(graph_module)
    assert result is not None
    for out, reference in zip(result.graph_module(x), expected, strict=True):
        torch.testing.assert_close(out, reference, atol=0, rtol=0)


def test_an_op_whose_operands_no_one_move_reconciles_stays_where_it_is() -> None:
    class Different(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * 2).permute(1, 0, 2) + (x * 3).reshape(4, 3, 2)  # a permute of a reshape is no one move

    graph_module = torch.export.export(Different(), (torch.randn(3, 4, 2),)).module()
    result = SinkElementwiseThroughMovesPass()(graph_module)
    assert result is not None and not result.modified


def test_an_op_whose_operands_move_differently_runs_where_the_first_ones_source_is() -> None:
    """The other operand reaches that layout in one permute: its own chain of two moves goes."""

    class Different(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            a = (x * 2).reshape(1, 4, 3, 5).permute(0, 2, 3, 1)  # (4, 3, 5) -> (1, 3, 5, 4)
            b = (y * 3).reshape(1, 5, 3, 4).permute(0, 2, 1, 3)  # (5, 3, 4) -> (1, 3, 5, 4)
            return a + b

    x, y = torch.randn(4, 3, 5), torch.randn(5, 3, 4)
    graph_module = torch.export.export(Different(), (x, y)).module()
    result = SinkElementwiseThroughMovesPass()(graph_module)
    assert result is not None and result.modified
    (add,) = [n for n in result.graph_module.graph.nodes if n.target is torch.ops.aten.add.Tensor]
    first, second = add.args
    assert first.target is torch.ops.aten.mul.Tensor  # the first operand's source, as it is
    assert second.target is torch.ops.aten.permute.default and second.args[0].target is torch.ops.aten.mul.Tensor
    torch.testing.assert_close(result.graph_module(x, y), Different()(x, y), atol=0, rtol=0)


def test_two_identical_moves_of_one_tensor_are_one() -> None:
    class Twice(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = x * 2
            return y.permute(1, 0) + 1, y.permute(1, 0) * 3

    x = torch.randn(3, 4)
    graph_module = torch.export.export(Twice(), (x,)).module()
    result = ShareMovesPass()(graph_module)
    assert result is not None and result.modified
    permutes = [n for n in result.graph_module.graph.nodes if n.target is torch.ops.aten.permute.default]
    assert len(permutes) == 1 and len(permutes[0].users) == 2
    for got, expected in zip(result.graph_module(x), Twice()(x), strict=True):
        torch.testing.assert_close(got, expected, atol=0, rtol=0)


class PointwiseBranches(nn.Module):
    """S3D's inception block begins so: 1x1x1 convs of the block's input, one per branch."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv3d(3, 8, (1, 3, 3), padding=(0, 1, 1))
        self.branches = nn.ModuleList(nn.Conv3d(8, c, 1) for c in (4, 6, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return torch.cat([branch(x) for branch in self.branches], 1)


def test_the_pointwise_branches_of_an_inception_block_read_one_fold_of_its_input() -> None:
    model, x = PointwiseBranches().eval(), torch.randn(1, 3, 4, 8, 8)
    ep = XnnpackRewriter(strict=True)(torch.export.export(model, (x,)))
    _, *branches = _conv_inputs(ep)
    assert len(branches) == 3 and len(set(branches)) == 1
    torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


class MovedActivation(nn.Module):
    def __init__(self, activation: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation((x * 2).permute(1, 0))


ACTIVATIONS = {"relu": (torch.relu, torch.ops.aten.relu.default),
               "leaky relu": (lambda t: F.leaky_relu(t, 0.01), torch.ops.aten.leaky_relu.default)}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_an_activation_after_a_permute_runs_before_it(name: str) -> None:
    activation, op = ACTIVATIONS[name]
    model, x = MovedActivation(activation), torch.randn(3, 4)
    result = SinkElementwiseThroughMovesPass()(torch.export.export(model, (x,)).module())
    assert result is not None and result.modified
    ops = [n.target for n in result.graph_module.graph.nodes if n.op == "call_function"]
    assert ops == [torch.ops.aten.mul.Tensor, op, torch.ops.aten.permute.default]
    torch.testing.assert_close(result.graph_module(x), model(x), atol=0, rtol=0)


def test_a_moved_piece_of_a_rewritten_op_is_still_a_piece_of_it() -> None:
    """The quantizer reads the stamp: a piece of an op left float that lost it would be quantized."""

    class Moved(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x.permute(1, 0)) * 0.5

    graph_module = torch.export.export(Moved(), (torch.randn(3, 4),)).module()
    mark = RewriteStamp("sdpa", "aten.scaled_dot_product_attention.default", stays_float=True)
    for node in graph_module.graph.nodes:
        if node.op == "call_function":
            stamp(node, mark)
    result = SinkElementwiseThroughMovesPass()(graph_module)
    assert result is not None and result.modified
    nodes = [n for n in result.graph_module.graph.nodes if n.op == "call_function"]
    assert [rewrite_stamp(n) for n in nodes] == [mark] * len(nodes)


def test_the_moves_after_a_sunk_op_give_its_value_and_are_no_pieces_of_what_it_read() -> None:
    """A rewritten mean's last reshape, moved past an add, is the add's: the mean keeps one result."""

    class Moved(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * 2).permute(1, 0) + 1.0

    graph_module = torch.export.export(Moved(), (torch.randn(3, 4),)).module()
    mark = RewriteStamp("mean", "aten.mean.dim", stays_float=True, shares_input=True)
    for node in graph_module.graph.nodes:
        if node.target in (torch.ops.aten.mul.Tensor, torch.ops.aten.permute.default):
            stamp(node, mark)
    result = SinkElementwiseThroughMovesPass()(graph_module)
    assert result is not None and result.modified
    nodes = [n for n in result.graph_module.graph.nodes if n.op == "call_function"]
    assert [(n.target, rewrite_stamp(n)) for n in nodes] == [
        (torch.ops.aten.mul.Tensor, mark), (torch.ops.aten.add.Tensor, None), (torch.ops.aten.permute.default, None)
    ]


def _separable(c_in: int, c_out: int) -> nn.Module:
    spatial = nn.Conv3d(c_in, c_out, (1, 3, 3), padding=(0, 1, 1))
    return nn.Sequential(spatial, nn.Conv3d(c_out, c_out, (3, 1, 1), padding=(1, 0, 0)))


class InceptionBlock(nn.Module):
    """S3D's block in miniature: branches in the convs' layout, concatenated on channels, then a conv."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = _separable(3, 8)
        self.pointwise = nn.Conv3d(8, 4, 1)
        self.separable = _separable(8, 6)
        self.head = nn.Conv3d(10, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return self.head(torch.cat((self.pointwise(x), self.separable(x)), 1))


def test_an_inception_cat_concatenates_the_branches_in_their_convs_layout() -> None:
    model, x = InceptionBlock().eval(), torch.randn(1, 3, 4, 8, 8)
    ep = XnnpackRewriter(strict=True)(torch.export.export(model, (x,)))
    (cat,) = [n for n in ep.graph_module.graph.nodes if n.target is torch.ops.aten.cat.default]
    assert [_through_layout_ops(operand) for operand in cat.args[0]] == [[], []]
    assert [operand.target for operand in cat.args[0]] == [torch.ops.aten.conv2d.default] * 2
    torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


def test_a_cat_of_inputs_moved_differently_stays_where_it_is() -> None:
    class Different(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat(((x * 2).permute(1, 0, 2), (x * 3).permute(1, 2, 0).reshape(4, 3, 2)), 0)

    graph_module = torch.export.export(Different(), (torch.randn(3, 4, 2),)).module()
    result = SinkCatThroughMovesPass()(graph_module)
    assert result is not None and not result.modified


def test_a_cat_of_permuted_inputs_concatenates_their_sources_along_the_matching_dim() -> None:
    class Permuted(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.cat(((x * 2).permute(2, 0, 1), (y * 3).permute(2, 0, 1)), 0)

    x, y = torch.randn(3, 4, 2), torch.randn(3, 4, 5)
    graph_module = torch.export.export(Permuted(), (x, y)).module()
    result = SinkCatThroughMovesPass()(graph_module)
    assert result is not None and result.modified
    (cat,) = [n for n in result.graph_module.graph.nodes if n.target is torch.ops.aten.cat.default]
    assert cat.args[1] == 2
    torch.testing.assert_close(result.graph_module(x, y), Permuted()(x, y), atol=0, rtol=0)


class CopiedMove(nn.Module):
    """A permute copied contiguous (as a rewritten norm's result is), then read by ``read``."""

    def __init__(self, read: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.read = read

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.read(torch.clone((x * 2).permute(1, 0), memory_format=torch.contiguous_format))


def test_a_contiguous_copy_of_a_permute_runs_before_it() -> None:
    model, x = CopiedMove(torch.relu), torch.randn(3, 4)
    result = SinkElementwiseThroughMovesPass()(torch.export.export(model, (x,)).module())
    assert result is not None and result.modified
    ops = [n.target for n in result.graph_module.graph.nodes if n.op == "call_function"]
    assert ops[:3] == [torch.ops.aten.mul.Tensor, torch.ops.aten.clone.default, torch.ops.aten.relu.default]
    torch.testing.assert_close(result.graph_module(x), model(x), atol=0, rtol=0)


def test_a_contiguous_copy_that_a_view_reads_stays_where_it_is() -> None:
    """A view needs the copy's strides: moved before the permute, the copy would leave the permute's."""
    model, x = CopiedMove(lambda t: t.view(-1)), torch.randn(3, 4)
    result = SinkElementwiseThroughMovesPass()(torch.export.export(model, (x,)).module())
    assert result is not None and not result.modified


class MovedPReLU(nn.Module):
    """A per-channel PReLU of frames ``(D, C, H, W)`` moved to a clip by ``clip``."""

    def __init__(self, clip: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.clip = clip
        self.prelu = nn.PReLU(4)
        with torch.no_grad():
            self.prelu.weight.copy_(torch.tensor([0.1, 0.2, 0.3, 0.4]))

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.prelu(self.clip(frames * 2))


def test_a_per_channel_prelu_after_moves_that_keep_the_channels_runs_before_them() -> None:
    """A MONAI UNet's PReLU after a norm computed on frames: on frames it stays in NHWC with the convs."""
    model = MovedPReLU(lambda f: f.reshape(1, 3, 4, 5, 6).permute(0, 2, 1, 3, 4))
    frames = torch.randn(3, 4, 5, 6)
    result = SinkElementwiseThroughMovesPass()(torch.export.export(model, (frames,)).module())
    assert result is not None and result.modified
    (prelu,) = [n for n in result.graph_module.graph.nodes if n.target is torch.ops.aten.prelu.default]
    assert prelu.meta["val"].dim() == 4
    torch.testing.assert_close(result.graph_module(frames), model(frames), atol=0, rtol=0)


def test_a_per_channel_prelu_after_moves_that_mix_the_channels_stays_where_it_is() -> None:
    model = MovedPReLU(lambda f: f.reshape(1, 4, 3, 5, 6))  # each clip channel holds pieces of several
    result = SinkElementwiseThroughMovesPass()(torch.export.export(model, (torch.randn(3, 4, 5, 6),)).module())
    assert result is not None and not result.modified


def test_a_cat_of_chains_of_different_lengths_concatenates_where_their_alike_ends_begin() -> None:
    """A UNet's decoder: upsampled frames (a transposed conv's taps, one reshape more) and the skip."""

    class Ends(nn.Module):
        def forward(self, taps: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
            up = (taps * 2).reshape(-1, 4, 3, 3).reshape(1, 4, 4, 3, 3).permute(0, 2, 1, 3, 4)
            return torch.cat((up, (skip * 3).reshape(1, 4, 4, 3, 3).permute(0, 2, 1, 3, 4)), 1)

    taps, skip = torch.randn(2, 8, 3, 3), torch.randn(4, 4, 3, 3)  # the same sizes: either dim could be summed
    graph_module = torch.export.export(Ends(), (taps, skip)).module()
    result = SinkCatThroughMovesPass()(graph_module)
    assert result is not None and result.modified
    (cat,) = [n for n in result.graph_module.graph.nodes if n.target is torch.ops.aten.cat.default]
    assert cat.args[1] == 1 and tuple(cat.meta["val"].shape) == (4, 8, 3, 3)
    torch.testing.assert_close(result.graph_module(taps, skip), Ends()(taps, skip), atol=0, rtol=0)


def instance_norm(channels: int) -> nn.Module:
    return nn.InstanceNorm3d(channels, affine=True)


class NormedConvs(nn.Module):
    """nnU-Net's conv block: (Conv3d k3 + norm + LeakyReLU), twice."""

    def __init__(self, c: int = 4, norm: Callable[[int], nn.Module] = instance_norm) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv3d(c, c, 3, padding=1), norm(c), nn.LeakyReLU(0.01, inplace=True),
            nn.Conv3d(c, c, 3, padding=1), norm(c), nn.LeakyReLU(0.01, inplace=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class DecoderStage(nn.Module):
    """A UNet level: a conv block, a strided conv down, a transposed conv up, the skip concatenated, a conv."""

    def __init__(self, c: int = 4) -> None:
        super().__init__()
        self.stage = NormedConvs(c)
        self.down = nn.Conv3d(c, 2 * c, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose3d(2 * c, c, 2, stride=2)
        self.head = nn.Conv3d(2 * c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.stage(x)
        return self.head(torch.cat((self.up(self.down(skip)), skip), 1))


_MOVES = (torch.ops.aten.permute.default, torch.ops.aten.reshape.default, torch.ops.aten.view.default)


def _between_convs(ep: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    nodes = [n for n in ep.graph_module.graph.nodes if n.op == "call_function"]
    convs = [i for i, n in enumerate(nodes) if n.target is torch.ops.aten.conv2d.default]
    return nodes[convs[0] + 1 : convs[-1]]


@pytest.mark.parametrize("norm", [instance_norm, lambda c: nn.GroupNorm(2, c)], ids=["instance norm", "group norm"])
def test_a_normed_conv_block_runs_from_one_conv_to_the_next_on_4d_frames(norm: Callable[[int], nn.Module]) -> None:
    """Frames in the batch of 4-D tensors, the layout ExecuTorch runs in NHWC: before, the norm read
    (N, C, D, H, W), and XNNPACK transposed out of NHWC and to channels first and back around it."""
    model, x = NormedConvs(norm=norm).eval(), torch.randn(1, 4, 4, 8, 8)
    ep = XnnpackRewriter(strict=True)(torch.export.export(model, (x,)))
    between = _between_convs(ep)
    assert all(n.meta["val"].dim() <= 4 for n in between)
    frame = 4 * 8 * 8  # C x H x W: only a norm's statistics (a value per frame and channel) move
    assert [n for n in between if n.target in _MOVES and n.meta["val"].numel() >= frame] == []
    _, second = _conv_inputs(ep)
    assert second.target is torch.ops.aten.cat.default and second.meta["val"].dim() == 4
    torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


def test_a_normed_conv_block_stays_in_nhwc_between_its_convs() -> None:
    """On XNNPACK: no transpose of even one frame between the first conv and the last."""
    from xnnguard.runtime_check.pte_reader import read_methods
    from xnnguard.runtime_check.xnnpack_blob import read_xnnpack_blob

    torch.manual_seed(0)
    run = lower_and_run(NormedConvs().eval(), torch.randn(1, 4, 4, 8, 8), "float")
    (method,) = read_methods(run.lowered.buffer, "block")
    (delegate,) = method.delegates
    graph = read_xnnpack_blob(delegate.blob)
    values = graph.value_map()
    convs = [i for i, node in enumerate(graph.nodes) if node.op == "XNNConv2d"]
    moved = [math.prod(values[node.outputs[0]].dims) for node in graph.nodes[convs[0] : convs[-1]]
             if node.op == "XNNStaticTranspose"]
    assert all(elements < 4 * 8 * 8 for elements in moved), moved  # a frame: C x H x W
    run.assert_matches()


def test_a_unet_decoder_concatenates_its_upsampled_frames_and_its_skip_as_frames() -> None:
    """The transposed conv's taps are output channels (tap, channel): its output frames are a view of its
    result, so the cat runs on frames, where the head conv reads it."""
    model, x = DecoderStage().eval(), torch.randn(1, 4, 4, 8, 8)
    ep = XnnpackRewriter(strict=True)(torch.export.export(model, (x,)))
    _, _, _, head = _conv_inputs(ep)
    taps = [operand for operand in head.args[0] if operand.target is not torch.ops.aten.slice.Tensor]
    (skip_and_up,) = taps
    assert skip_and_up.target is torch.ops.aten.cat.default and skip_and_up.args[1] == 1
    assert skip_and_up.meta["val"].dim() == 4
    torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


class DownsamplingBlock(nn.Module):
    """R(2+1)D's first block of a stage: strided separable convs, a strided 1x1x1 conv on the skip, added."""

    def __init__(self, c_in: int = 8, c_out: int = 16) -> None:
        super().__init__()
        self.stem = SeparableBlock(c_in)
        self.body = nn.Sequential(
            nn.Conv3d(c_in, c_out, (1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)),
            nn.ReLU(inplace=True),
            nn.Conv3d(c_out, c_out, (3, 1, 1), stride=(2, 1, 1), padding=(1, 0, 0)),
        )
        self.shortcut = nn.Conv3d(c_in, c_out, 1, stride=2)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        out = self.body(x)
        out += self.shortcut(x)
        return self.relu(out)


def test_a_downsampling_residual_add_runs_where_its_temporal_conv_runs() -> None:
    """The skip's conv (frames in the batch) reaches the rows layout in one permute; before, both
    operands went back to (N, C, D, H, W) and the sum forth again."""
    model, x = DownsamplingBlock().eval(), torch.randn(1, 3, 4, 8, 8)
    ep = XnnpackRewriter(strict=True)(torch.export.export(model, (x,)))
    *_, add = [n for n in ep.graph_module.graph.nodes if n.target is torch.ops.aten.add.Tensor]
    body, skip = add.args
    assert _through_layout_ops(body) == []
    assert _through_layout_ops(skip) == [torch.ops.aten.permute.default]
    torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


class PoolingBranch(nn.Module):
    """S3D's pooling branch: a 3x3x3 max pooling of the block's input (left on rows by 1x1x1 convs), then a
    1x1x1 conv."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv3d(3, 8, 1)
        self.pool = nn.MaxPool3d(3, stride=1, padding=1)
        self.head = nn.Conv3d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.stem(x)))


def test_a_max_pooling_between_convs_on_rows_pools_on_their_rows() -> None:
    """Over (D, W) on the rows the convs left, then over H one permute away, then one permute back to rows:
    the frames-in-the-channels form reshaped in and out of NCHW around each of its stages."""
    model, x = PoolingBranch().eval(), torch.randn(1, 3, 4, 8, 8)
    ep = XnnpackRewriter(strict=True)(torch.export.export(model, (x,)))
    first, second = [n for n in ep.graph_module.graph.nodes if n.target is torch.ops.aten.max_pool2d.default]
    assert _through_layout_ops(first.args[0]) == [] and first.args[0].target is torch.ops.aten.conv2d.default
    assert _through_layout_ops(second.args[0]) == [torch.ops.aten.permute.default]
    _, head_input = _conv_inputs(ep)
    assert _through_layout_ops(head_input) == [torch.ops.aten.permute.default]
    torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


CASES = {  # name: (model, input shape)
    "two frame-wise convs": (_frame_wise_pair, (1, 4, 3, 8, 8)),
    "separable residual block": (SeparableBlock, (1, 3, 4, 8, 8)),
    "downsampling residual block": (DownsamplingBlock, (1, 3, 4, 8, 8)),
    "inception block": (InceptionBlock, (1, 3, 4, 8, 8)),
    "pointwise branches": (PointwiseBranches, (1, 3, 4, 8, 8)),
    "pooling branch": (PoolingBranch, (1, 3, 4, 8, 8)),
    "normed conv block": (NormedConvs, (1, 4, 4, 8, 8)),
    "unet decoder stage": (DecoderStage, (1, 4, 4, 8, 8)),
}


# Static int8 in the default tier for the cases whose int8 layout differs from float's (a residual add of
# two int8 branches, a norm in float between int8 convs, a cat of an upsampled and a skip branch); the
# others' static-int8 rows, and every dynamic-int8 row, are in the slow tier.
INT8_CASES = ("separable residual block", "normed conv block", "unet decoder stage")


@pytest.mark.parametrize(("name", "precision"), rows_in_slow_tier(
    [(name, precision) for name in CASES for precision in PRECISIONS],
    lambda name, precision: precision != "float" and (name not in INT8_CASES or "dynamic" in precision),
    ids=lambda name, precision: f"{name}-{precision}",
))
def test_the_layout_cases_lower_to_one_delegate_and_match(name: str, precision: str) -> None:
    build, shape = CASES[name]
    torch.manual_seed(0)
    lowered, out, reference, tolerance = lower_and_run(build().eval(), torch.randn(shape), precision)  # type: ignore[arg-type]
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)
