"""Views and data movement as slices, reshapes, cats, broadcasts and bmm: same numbers, inside one delegate."""

from __future__ import annotations

import string
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings, strategies as st

import xnnguard
from testbed.flow import lower_and_run
from testbed.int8_reference import Int8, int8_against_the_original, no_new_scales
from testbed.lowered import lower, run_pte
from testbed.quantize import Precision
from tests.support import dynamic_int8_in_slow_tier, rows_in_slow_tier
from xnnguard.graph.ops import target_name
from xnnguard.report import Rule
from xnnguard.rewrite.rewrite_for_xnnpack import rewrite_for_xnnpack
from xnnguard.rewrite.runner import run_passes
from xnnguard.rewrite.views.constant_where import clamp_bounds, select_by_bounds
from xnnguard.rewrite.views.expand import BroadcastViewsPass, repeat_by_broadcast
from xnnguard.rewrite.views.inplace_updates import InPlaceSliceUpdatesPass
from xnnguard.rewrite.views.matmul import MatmulAsBmmPass, einsum_as_bmm, parse_einsum
from xnnguard.rewrite.views.roll import roll_as_slices
from xnnguard.rewrite.views.slices import ViewsAsSlicesPass
from xnnguard.rewrite.views.strided_slice import strided_slice

Shape = tuple[int, ...]


class Fn(torch.nn.Module):
    """A model computing ``fn(*inputs)``."""

    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.fn(*xs)


def _ops(graph_module: torch.fx.GraphModule) -> Counter[str]:
    return Counter(target_name(n).split(".")[-2] for n in graph_module.graph.nodes if n.op == "call_function")


def _rewritten(fn: Callable[..., torch.Tensor], passes: list, *inputs: torch.Tensor) -> torch.fx.GraphModule:
    graph_module = torch.export.export(Fn(fn), inputs).module()
    run_passes(passes, graph_module, strict=True)
    return graph_module


shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)


# ---------------------------------------------------------------- each form equals the op it replaces


@settings(derandomize=True, max_examples=60, deadline=None)
@given(shapes, st.data(), st.booleans())
def test_a_broadcast_multiply_repeats_like_repeat_and_repeat_interleave(shape: Shape, data: st.DataObject,
                                                                         interleave: bool) -> None:
    extra = 0 if interleave else data.draw(st.integers(0, 1))
    repeats = data.draw(st.lists(st.integers(1, 3), min_size=len(shape) + extra, max_size=len(shape) + extra))
    if interleave:
        repeats = [r if d == data.draw(st.integers(0, len(shape) - 1)) else 1 for d, r in enumerate(repeats)]
    x = torch.randn(shape)
    if interleave:
        dims = [d for d, r in enumerate(repeats) if r > 1]
        expected = x.repeat_interleave(repeats[dims[0]], dims[0]) if dims else x
        repeats = [repeats[d] if dims and d == dims[0] else 1 for d in range(len(shape))]
    else:
        expected = x.repeat(repeats)
    torch.testing.assert_close(repeat_by_broadcast(x, repeats, interleave=interleave), expected, atol=0, rtol=0)


@st.composite
def einsums(draw: st.DrawFn) -> tuple[str, torch.Tensor, torch.Tensor]:
    letters = iter(draw(st.permutations(list(string.ascii_lowercase[:12]))))
    groups = {kind: [next(letters) for _ in range(draw(st.integers(0, 2)))] for kind in ("b", "l", "r", "c")}
    a = draw(st.permutations(groups["b"] + groups["l"] + groups["c"]))
    b = draw(st.permutations(groups["b"] + groups["c"] + groups["r"]))
    out = draw(st.permutations(groups["b"] + groups["l"] + groups["r"]))
    size = {i: draw(st.integers(1, 3)) for i in a + b}
    x, y = torch.randn([size[i] for i in a]), torch.randn([size[i] for i in b])
    return f"{''.join(a)},{''.join(b)}->{''.join(out)}", x, y


@settings(derandomize=True, max_examples=60, deadline=None)
@given(einsums())
def test_a_two_operand_einsum_is_one_bmm_between_permutes(case: tuple[str, torch.Tensor, torch.Tensor]) -> None:
    equation, x, y = case
    spec = parse_einsum(equation)
    assert not isinstance(spec, str), spec
    torch.testing.assert_close(einsum_as_bmm(spec, x, y), torch.einsum(equation, x, y), atol=1e-5, rtol=1e-5)


@settings(derandomize=True, max_examples=40, deadline=None)
@given(shapes, st.data())
def test_roll_as_slices_equals_roll(shape: Shape, data: st.DataObject) -> None:
    dims = data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True))
    shifts = data.draw(st.lists(st.integers(-9, 9), min_size=len(dims), max_size=len(dims)))
    x = torch.randn(shape)
    torch.testing.assert_close(roll_as_slices(x, shifts, dims), torch.roll(x, shifts, dims), atol=0, rtol=0)


@settings(derandomize=True, max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=4).map(tuple), st.data())
def test_a_strided_slice_from_views_and_unit_slices_equals_the_strided_slice(shape: Shape, data: st.DataObject) -> None:
    dim = data.draw(st.integers(0, len(shape) - 1))
    start = data.draw(st.integers(0, shape[dim] - 1))
    step = data.draw(st.integers(2, 4))
    count = len(range(start, shape[dim], step))
    x = torch.randn(shape)
    expected = x[(slice(None),) * dim + (slice(start, None, step),)]
    torch.testing.assert_close(strided_slice(x, dim, start, count, step), expected, atol=0, rtol=0)


@settings(derandomize=True, max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple), st.data())
def test_a_batched_matmul_with_broadcast_batch_dims_is_one_bmm(batch: Shape, data: st.DataObject) -> None:
    other = tuple(data.draw(st.sampled_from([size, 1])) for size in batch)
    other = other[data.draw(st.integers(0, len(other) - 1)) :]  # fewer batch dims too
    x, y = torch.randn(*batch, 3, 4), torch.randn(*other, 4, 2)
    if data.draw(st.booleans()):
        x, y = torch.randn(*other, 3, 4), torch.randn(*batch, 4, 2)
    graph_module = _rewritten(torch.matmul, [MatmulAsBmmPass()], x, y)
    assert "matmul" not in _ops(graph_module) and "expand" not in _ops(graph_module)
    torch.testing.assert_close(graph_module(x, y), torch.matmul(x, y), atol=1e-5, rtol=1e-5)


@st.composite
def single_views(draw: st.DrawFn) -> tuple[str, Callable[[torch.Tensor], torch.Tensor], Shape]:
    """A select / squeeze / unsqueeze / split_with_sizes / unbind of a random shape along a random dim."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=5)))
    kind = draw(st.sampled_from(["select", "squeeze", "unsqueeze", "split_with_sizes", "unbind"]))
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    if kind == "select":
        index = draw(st.integers(-shape[dim], shape[dim] - 1))
        return kind, lambda x: x.select(dim, index) * 2, shape
    if kind == "squeeze":
        return kind, lambda x: x.squeeze(dim) * 2, shape
    if kind == "unsqueeze":
        at = draw(st.integers(-len(shape) - 1, len(shape)))
        return kind, lambda x: x.unsqueeze(at) * 2, shape
    if kind == "unbind":
        return kind, lambda x: torch.cat([t.reshape(-1) * (k + 1) for k, t in enumerate(x.unbind(dim))]), shape
    cuts = sorted(draw(st.lists(st.integers(0, shape[dim]), max_size=3)))
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, shape[dim]])]
    return kind, lambda x: torch.cat([t.reshape(-1) * (k + 1) for k, t in enumerate(x.split(sizes, dim))]), shape


@settings(derandomize=True, max_examples=40, deadline=None)
@given(single_views())
def test_any_select_squeeze_unsqueeze_or_split_becomes_slices_and_reshapes_with_the_same_values(
    case: tuple[str, Callable[[torch.Tensor], torch.Tensor], Shape],
) -> None:
    kind, fn, shape = case
    x = torch.randn(shape)
    graph_module = _rewritten(fn, [ViewsAsSlicesPass()], x)
    left = {"select", "squeeze", "split", "split_with_sizes", "unbind"} & set(_ops(graph_module))
    assert not left, (kind, left)
    torch.testing.assert_close(graph_module(x), fn(x), atol=0, rtol=0)


VIEWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "select": lambda x: x[:, -1] * 2,
    "squeeze": lambda x: x.unsqueeze(0).squeeze(0).squeeze(1) * 2,
    "unsqueeze": lambda x: x.unsqueeze(1) * 2,
    "unbind": lambda x: torch.stack([t * k for k, t in enumerate(x.unbind(2))], 0),
    "split": lambda x: torch.cat([t * k for k, t in enumerate(torch.split(x, [1, 2, 1], 2))][::-1], 2),
    "chunk": lambda x: torch.cat([t * k for k, t in enumerate(x.chunk(3, 2))][::-1], 2),
    "alias": lambda x: torch.ops.aten.alias(x) * 2,
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_each_view_becomes_slices_and_reshapes_with_the_same_values(name: str) -> None:
    x = torch.randn(2, 1, 4, 3)
    graph_module = _rewritten(VIEWS[name], [ViewsAsSlicesPass()], x)
    assert not {"select", "squeeze", "unbind", "split", "split_with_sizes", "chunk", "alias"} & set(_ops(graph_module))
    torch.testing.assert_close(graph_module(x), VIEWS[name](x), atol=0, rtol=0)


def test_a_select_along_a_dynamic_dim_is_left_and_reported() -> None:
    x = torch.randn(3, 4)
    ep = torch.export.export(Fn(lambda v: v.select(0, 1) * 2), (x,), dynamic_shapes=(({0: torch.export.Dim("n")},),))
    graph_module = ep.module()
    (record,) = run_passes([ViewsAsSlicesPass()], graph_module, strict=True).report
    assert record.rule is Rule.NOT_REWRITTEN and "dynamic size" in record.reason
    torch.testing.assert_close(graph_module(torch.randn(5, 4)).shape, torch.Size([4]))


def test_an_unsqueeze_of_the_trailing_dim_is_left_as_xnnpack_takes_it() -> None:
    graph_module = _rewritten(lambda x: x.unsqueeze(-1) * 2, [ViewsAsSlicesPass()], torch.randn(2, 3))
    assert "unsqueeze" in _ops(graph_module)


def test_a_view_whose_storage_is_written_after_it_is_left() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x * 1
        row = y.select(0, 1)
        y.add_(1)  # row sees this write
        return row * 2

    x = torch.randn(3, 4)
    graph_module = _rewritten(fn, [ViewsAsSlicesPass()], x)
    assert "select" in _ops(graph_module)
    torch.testing.assert_close(graph_module(x), fn(x))


# ---------------------------------------------------------------- broadcasts


def test_an_expand_read_by_an_add_is_dropped_and_the_add_broadcasts() -> None:
    x, y = torch.randn(1, 3, 4), torch.randn(2, 3, 4)
    graph_module = _rewritten(lambda a, b: a.expand(2, 3, 4) + b, [BroadcastViewsPass()], x, y)
    assert set(_ops(graph_module)) == {"add"}
    torch.testing.assert_close(graph_module(x, y), x + y, atol=0, rtol=0)


def test_an_expand_read_by_a_cat_is_a_multiply_by_ones() -> None:
    x, y = torch.randn(1, 3, 4), torch.randn(2, 3, 4)
    fn: Callable[..., torch.Tensor] = lambda a, b: torch.cat([a.expand(2, 3, 4), b], 1)  # noqa: E731
    graph_module = _rewritten(fn, [BroadcastViewsPass()], x, y)
    assert "expand" not in _ops(graph_module) and "mul" in _ops(graph_module)
    torch.testing.assert_close(graph_module(x, y), fn(x, y), atol=0, rtol=0)


# ---------------------------------------------------------------- in-place slice updates


@st.composite
def slice_updates(draw: st.DrawFn) -> tuple[Shape, list[tuple[int, int, int, str]]]:
    shape = tuple(draw(st.lists(st.integers(2, 5), min_size=2, max_size=4)))
    updates = []
    for _ in range(draw(st.integers(1, 3))):
        dim = draw(st.integers(0, len(shape) - 1))
        start = draw(st.integers(0, shape[dim] - 1))
        end = draw(st.integers(start + 1, shape[dim]))
        updates.append((dim, start, end, draw(st.sampled_from(["add", "mul", "copy", "fill", "select"]))))
    return shape, updates


@settings(derandomize=True, max_examples=25, deadline=None)
@given(slice_updates())
def test_in_place_slice_updates_replayed_as_slices_and_cat_give_every_reader_its_value(
    case: tuple[Shape, list[tuple[int, int, int, str]]],
) -> None:
    shape, updates = case
    x = torch.randn(shape)

    def fn(v: torch.Tensor) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in _reads(v, updates)])

    graph_module = _rewritten(fn, [InPlaceSliceUpdatesPass()], x)
    assert not InPlaceSliceUpdatesPass().applies_to(graph_module)  # no write through a view is left
    expected = fn(x)
    torch.testing.assert_close(graph_module(x), expected, atol=1e-6, rtol=1e-6)


def _reads(x: torch.Tensor, updates: list[tuple[int, int, int, str]]) -> list[torch.Tensor]:
    """The updated tensor and, after each update, a read of the whole tensor and of a view taken before."""
    y = x * 1
    early = y[(slice(0, 1),)]  # a view taken before the writes, read after them
    reads = []
    for dim, start, end, kind in updates:
        index = (slice(None),) * dim
        if kind == "select":
            y.select(dim, start).mul_(3)
        elif kind == "add":
            y[(*index, slice(start, end))] += x[(*index, slice(0, end - start))]
        elif kind == "mul":
            y[(*index, slice(start, end))] *= 2
        elif kind == "copy":
            y[(*index, slice(start, end))] = x[(*index, slice(0, end - start))] + 1
        else:
            y[(*index, slice(start, end))] = 5.0
        reads.append(y * 1)
    return [*reads, early * 1, y]


def test_in_place_ops_on_a_whole_computed_tensor_are_no_slice_update_to_report() -> None:
    def residual(x: torch.Tensor) -> torch.Tensor:  # ResNet's ``out += identity; relu(inplace=True)``
        y = x * 2
        y += x
        return torch.relu_(y)

    graph_module = torch.export.export(Fn(residual), (torch.randn(2, 3),)).module()
    assert not InPlaceSliceUpdatesPass().applies_to(graph_module)
    assert run_passes([InPlaceSliceUpdatesPass()], graph_module, strict=True).report == ()


def test_a_write_into_a_graph_input_is_left() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        x[:, 1:] += 1
        return x * 2

    graph_module = torch.export.export(Fn(fn), (torch.randn(2, 3),)).module()
    assert not InPlaceSliceUpdatesPass().applies_to(graph_module)


# ---------------------------------------------------------------- lowered: inside one delegate, float and int8


class Around(torch.nn.Module):
    """``op`` between two linears, so int8 quantizes around it."""

    def __init__(self, op: Callable[[torch.Tensor], torch.Tensor], dim: int = 8, out: int = 8) -> None:
        super().__init__()
        self.op = op
        self.first = torch.nn.Linear(dim, dim)
        self.last = torch.nn.Linear(out, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.op(self.first(x)))


def _update(y: torch.Tensor) -> torch.Tensor:
    y = torch.relu(y)  # a tensor of its own (a scalar multiply would add ExecuTorch's scalar casts outside)
    y[:, :, 1:] += torch.tanh(y[:, :, :-1])
    y[:, 0] = 0.5
    return y


DELEGATED: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], int]] = {
    "select": (lambda y: y.reshape(2, 3, 4, 2, 4)[:, 1].reshape(2, 4, 8), 8),
    "unbind": (lambda y: torch.cat(y.reshape(2, 3, 4, 8).unbind(1), -1), 24),
    "squeeze": (lambda y: y.reshape(2, 12, 1, 8).squeeze(2), 8),
    "unsqueeze": (lambda y: y.unsqueeze(1).reshape(2, 12, 8), 8),
    "split": (lambda y: torch.cat(torch.split(y, [3, 5], -1)[::-1], -1), 8),
    "strided slice": (lambda y: y[:, ::2, 1::2], 4),
    "roll": (lambda y: torch.roll(y, (1, -3), (1, 2)), 8),
    "expand": (lambda y: torch.cat([y, y[:, :1].expand(2, 12, 8)], -1), 16),
    "repeat": (lambda y: y.repeat(1, 1, 2), 16),
    "batched matmul": (lambda y: y.reshape(2, 3, 4, 8) @ y.reshape(2, 3, 8, 4), 4),
    "einsum": (  # MViT's relative-position einsum on a 6-D query: decomposed, it is 7-D
        lambda y: torch.einsum("bythwc,hkc->bythwk", y.reshape(2, 2, 2, 3, 2, 4), y[0, :3].reshape(3, 2, 4))
        .reshape(2, 12, 4),
        4,
    ),
    "in-place slice update": (_update, 8),
}


@pytest.mark.parametrize("name", list(DELEGATED))
def test_each_view_rewrite_lowers_inside_one_delegate_and_matches_eager(name: str) -> None:
    op, out = DELEGATED[name]
    torch.manual_seed(0)
    lowered, result, reference, tolerance = lower_and_run(Around(op, out=out), torch.randn(2, 12, 8), "float")
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1, lowered.outside_ops()
    torch.testing.assert_close(result, reference, atol=tolerance, rtol=0)


# In the default tier: a slice, a broadcast, a batched matmul and a strided slice. The other views are slices
# and reshapes of the same float pieces (xnnguard.quantizer.rewritten_ops): slow.
INT8_DEFAULT = ("select", "expand", "batched matmul", "strided slice")
INT8_VIEWS = [name for name in DELEGATED if name != "in-place slice update"]


@pytest.mark.parametrize("mode", dynamic_int8_in_slow_tier(["static", "dynamic"]))
@pytest.mark.parametrize("name", rows_in_slow_tier(INT8_VIEWS, [n for n in INT8_VIEWS if n not in INT8_DEFAULT],
                                                   ids=INT8_VIEWS))
def test_each_view_rewrite_in_int8_is_delegated_within_two_steps_of_the_original_quantized(
    name: str, mode: Int8
) -> None:
    op, out = DELEGATED[name]
    torch.manual_seed(0)
    result = int8_against_the_original(Around(op, out=out), torch.randn(2, 12, 8), mode)
    assert result.lowered.outside_ops() == {} and result.lowered.num_delegates == 1, result.lowered.outside_ops()
    assert result.steps <= 2, f"{result.steps:.2f} quantization steps from the original quantized"
    if mode == "static":
        assert no_new_scales(result), (result.scales, result.ideal_scales)  # no rounding the original lacks



@pytest.mark.parametrize("precision", ["static int8", "dynamic int8"])
def test_in_place_slice_updates_in_int8_are_delegated_and_match_their_own_pt2e_model(precision: Precision) -> None:
    """The reference is the rewritten model converted by pt2e, not the original: pt2e's q/dq pairs split the
    original's aliasing (the in-place writes land on a dequantized copy the consumer never reads), so the
    original's converted model is off by half the output range."""
    torch.manual_seed(0)
    lowered, result, reference, tolerance = lower_and_run(Around(_update), torch.randn(2, 12, 8), precision)
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1, lowered.outside_ops()
    torch.testing.assert_close(result, reference, atol=tolerance, rtol=0)

class DynamicBatchViews(torch.nn.Module):
    """Every view rewrite on a tensor whose batch is dynamic: select, squeeze/unsqueeze, split, strided slice,
    roll, expand, repeat, batched matmul."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.last = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.first(x)  # (B, 12, 8)
        y = y.unsqueeze(1).squeeze(1)
        a, b = torch.split(y, [3, 5], -1)
        y = torch.cat([b, a], -1)
        y = torch.roll(y, 2, 1) + y[:, 1].unsqueeze(1)
        y = y + y[:, :1].expand(-1, 12, 8)
        y = torch.cat([y[:, ::2], y[:, 1:2].repeat(1, 6, 1)], 1)
        y = y.reshape(-1, 3, 4, 8) @ y.reshape(-1, 3, 8, 4)
        return self.last(y.reshape(-1, 12, 4).repeat(1, 1, 2))


def test_the_view_rewrites_keep_a_dynamic_batch_and_the_program_runs_at_other_batch_sizes() -> None:
    torch.manual_seed(0)
    model, x = DynamicBatchViews().eval(), torch.randn(2, 12, 8)
    batch = ({0: torch.export.Dim("batch", min=1, max=16)},)
    ep = rewrite_for_xnnpack(torch.export.export(model, (x,), dynamic_shapes=batch), strict=True)
    assert isinstance(ep.graph_module.graph.find_nodes(op="placeholder")[-1].meta["val"].shape[0], torch.SymInt)
    lowered = lower(ep, (x,), xnnguard.XnnpackPartitioner())
    # ExecuTorch 1.5.1's XNNPACK takes no slice of a tensor with a dynamic dim, nor a view with a symbolic size:
    # those run outside; nothing of the original view ops is left
    assert set(lowered.outside_ops()) <= {"slice_copy", "view_copy", "sym_size"}, lowered.outside_ops()
    for size in (2, 5, 1):
        x = torch.randn(size, 12, 8)
        torch.testing.assert_close(run_pte(lowered.buffer, (x,))[0], model(x), atol=1e-4, rtol=1e-4)


class TokenAttention(torch.nn.Module):
    """Attention over a token count that varies from call to call: the scores are (heads, N, N)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(1, 2)) * 0.25
        return torch.matmul(torch.softmax(scores, dim=-1), v)


def test_an_attention_over_a_dynamic_token_count_runs_in_one_delegate_at_other_counts() -> None:
    """Its matmuls are of 3-D operands: no view of the (heads, N, N) scores, which has two dynamic sizes."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 6, 4) for _ in range(3))
    tokens = torch.export.Dim("tokens", min=2, max=32)
    shapes = ({1: tokens}, {1: tokens}, {1: tokens})
    ep = rewrite_for_xnnpack(torch.export.export(TokenAttention(), (q, k, v), dynamic_shapes=shapes), strict=True)
    lowered = lower(ep, (q, k, v), xnnguard.XnnpackPartitioner())
    assert lowered.num_delegates == 1 and set(lowered.outside_ops()) <= {"sym_size"}, lowered.outside_ops()
    for count in (6, 3, 17):
        inputs = tuple(torch.randn(2, count, 4) for _ in range(3))
        torch.testing.assert_close(run_pte(lowered.buffer, inputs)[0], TokenAttention()(*inputs), atol=1e-5, rtol=1e-5)


class OneImageMask(torch.nn.Module):
    """Qwen2-VL's block-diagonal mask for one image: ``full(min)``, then the one block set to 0 (all of it)."""

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        n = scores.shape[-1]
        mask = torch.full([1, n, n], torch.finfo(scores.dtype).min, dtype=scores.dtype)
        mask[..., 0:n, 0:n] = 0
        return torch.softmax(scores + mask, dim=-1)


def test_a_mask_of_a_dynamic_token_count_filled_with_one_value_is_that_value_added() -> None:
    """A tensor of a dynamic size has no XNNPACK form (no fill op); its one value broadcast by the add has."""
    torch.manual_seed(0)
    scores = torch.randn(2, 6, 6)
    tokens = torch.export.Dim("tokens", min=2, max=32)
    program = torch.export.export(OneImageMask(), (scores,), dynamic_shapes=({1: tokens, 2: tokens},))
    ep = rewrite_for_xnnpack(program, strict=True)
    assert not {"full", "fill_"} & set(_ops(ep.graph_module))
    lowered = lower(ep, (scores,), xnnguard.XnnpackPartitioner())
    assert lowered.num_delegates == 1 and set(lowered.outside_ops()) <= {"sym_size"}, lowered.outside_ops()
    for count in (6, 3, 17):
        x = torch.randn(2, count, count)
        torch.testing.assert_close(run_pte(lowered.buffer, (x,))[0], OneImageMask()(x), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("fill", [float("-inf"), torch.finfo(torch.float32).min, 0.5])
def test_a_selection_by_a_constant_mask_is_the_tensor_where_kept_and_the_fill_elsewhere_infinities_too(
    fill: float,
) -> None:
    keep = torch.rand(5, 7) > 0.5
    x = torch.randn(3, 5, 7)
    x[0, 0, :] = float("inf")
    x[1, 1, :] = float("-inf")
    low, high = clamp_bounds(keep, torch.tensor(fill), x.shape, x.dtype)
    assert torch.equal(select_by_bounds(x, low, high), torch.where(keep, x, torch.tensor(fill)))


class ClassTokenViT(torch.nn.Module):
    """A ViT's class token, ``token.expand(B, -1, -1)`` concatenated before the patches (fuzz seeds 163, 171,
    187 under a dynamic batch: the ``expand_copy`` had no XNNPACK form and split the program)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.token = torch.nn.Linear(12, 8), torch.nn.Parameter(torch.randn(1, 1, 8))
        self.head = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = self.embed(x)
        tokens = torch.cat([self.token.expand(x.shape[0], -1, -1), patches], dim=1)
        return self.head(tokens)


def test_a_class_token_expanded_to_a_dynamic_batch_is_in_the_one_delegate_at_every_batch() -> None:
    torch.manual_seed(0)
    model, x = ClassTokenViT().eval(), torch.randn(2, 5, 12)
    x[0, 0, 0] = float("inf")  # the token's batch size is read from the input's first elements: infinities too
    batch = ({0: torch.export.Dim("batch", min=1, max=16)},)
    ep = rewrite_for_xnnpack(torch.export.export(model, (x,), dynamic_shapes=batch), strict=True)
    lowered = lower(ep, (x,), xnnguard.XnnpackPartitioner())
    assert lowered.num_delegates == 1 and set(lowered.outside_ops()) <= {"sym_size"}, lowered.outside_ops()
    for size in (2, 7, 1):
        inputs = torch.randn(size, 5, 12)
        inputs[-1, 0, 0] = float("-inf")
        got, want = run_pte(lowered.buffer, (inputs,))[0], model(inputs)
        torch.testing.assert_close(got[:, 0], want[:, 0], atol=1e-5, rtol=1e-5)  # the token rows
    clean = torch.randn(3, 5, 12)
    torch.testing.assert_close(run_pte(lowered.buffer, (clean,))[0], model(clean), atol=1e-5, rtol=1e-5)


class RelativePositionBias(torch.nn.Module):
    """Swin's relative position bias over a window of ``4 * (t // 2)`` tokens: gathered flat, viewed back."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(30, 2))
        self.register_buffer("index", torch.randint(0, 30, (40, 40)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = 4 * (x.shape[0] // 2)
        index: torch.Tensor = self.index  # type: ignore[assignment]
        return self.table[index[:n, :n].flatten()].view(n, n, -1) + x[:1, :1, None]


def test_a_gather_by_a_flattened_index_viewed_back_has_the_index_sizes_not_a_division_of_them() -> None:
    """Split back, the view's second size was ``(16*t**2) // t``, which ExecuTorch bounds at four times its largest."""
    model = RelativePositionBias().eval()
    dims = ({0: torch.export.Dim.DYNAMIC(min=4, max=16)},)
    rewritten = rewrite_for_xnnpack(torch.export.export(model, (torch.randn(8, 3),), dynamic_shapes=dims))
    (output,) = rewritten.graph.find_nodes(op="output")
    rows, columns, heads = output.args[0][0].meta["val"].shape
    assert columns.node.expr == rows.node.expr and heads == 2, (rows, columns)  # the symbols, not their values
    for rows in (4, 9, 16):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(rewritten.module()(x), model(x), atol=0, rtol=0)
