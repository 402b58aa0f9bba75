"""Constant folding: what depends only on shapes, literals and parameters is computed once, and nothing else is."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from torch.export import Dim

import xnnguard
from testbed.flow import lower_and_run
from testbed.int8_reference import Int8, int8_against_the_original, no_new_scales
from testbed.lowered import lower, run_pte
from xnnguard.graph.ops import target_name
from xnnguard.rewrite import constants
from xnnguard.rewrite.constants import ConstantRegion, constant_value
from xnnguard.rewrite.fold.fold_constants import FoldConstantsPass
from xnnguard.rewrite.rewrite_for_xnnpack import XnnpackRewriter, default_rewrites
from xnnguard.rewrite.runner import run_passes


def _ops(graph_module: torch.fx.GraphModule) -> Counter[str]:
    return Counter(target_name(n).split(".")[-2] for n in graph_module.graph.nodes if n.op == "call_function")


def _folded(model: torch.nn.Module, *inputs: torch.Tensor, **export: object) -> torch.fx.GraphModule:
    graph_module = torch.export.export(model.eval(), inputs, **export).module()  # type: ignore[arg-type]
    run_passes([FoldConstantsPass()], graph_module, strict=True)
    return graph_module


# ---------------------------------------------------------------- models


Pair = tuple[int, int]


def shifted_window_mask(x: torch.Tensor, size: Pair, window: Pair, shift: Pair) -> torch.Tensor:
    """Swin's attention mask: slice assignment into ``new_zeros``, region ids compared pairwise."""
    mask = x.new_zeros(size)
    count = 0
    for h in ((0, -window[0]), (-window[0], -shift[0]), (-shift[0], None)):
        for w in ((0, -window[1]), (-window[1], -shift[1]), (-shift[1], None)):
            mask[h[0] : h[1], w[0] : w[1]] = count
            count += 1
    mask = mask.view(size[0] // window[0], window[0], size[1] // window[1], window[1]).permute(0, 2, 1, 3)
    mask = mask.reshape(-1, window[0] * window[1])
    mask = mask.unsqueeze(1) - mask.unsqueeze(2)
    return mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)


class ShiftedWindowScores(torch.nn.Module):
    """Attention scores of windows plus the shifted-window mask, rebuilt from shapes on every call."""

    def __init__(self, size: tuple[int, int], window: tuple[int, int], shift: tuple[int, int]) -> None:
        super().__init__()
        self.size, self.window, self.shift = size, window, shift

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores + shifted_window_mask(scores, self.size, self.window, self.shift), -1)


class QkvBias(torch.nn.Module):
    """VideoMAE's attention input: ``F.linear`` with a bias concatenated from parameters and zeros."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3 * dim, dim) * 0.1)
        self.q_bias = torch.nn.Parameter(torch.randn(dim))
        self.v_bias = torch.nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, torch.cat((self.q_bias, torch.zeros_like(self.v_bias), self.v_bias)))


class RelativeBias(torch.nn.Module):
    """A relative-position bias gathered from a parameter table by an index computed with ``arange``."""

    def __init__(self, size: int = 6) -> None:
        super().__init__()
        self.size = size
        self.table = torch.nn.Parameter(torch.randn(2 * size - 1, 2))

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(self.size)[:, None] - torch.arange(self.size)[None, :] + (self.size - 1)
        return scores + self.table[offsets.long()].permute(2, 0, 1)


class OneHeadRelativeBias(torch.nn.Module):
    """A one-head relative-position bias: the folded value is a permuted gather with size-1 dims."""

    def __init__(self, size: int = 6) -> None:
        super().__init__()
        self.size = size
        self.table = torch.nn.Parameter(torch.randn(2 * size - 1, 1))

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(self.size)[:, None] - torch.arange(self.size)[None, :] + (self.size - 1)
        return scores + self.table[offsets].permute(2, 0, 1).unsqueeze(0)


# ---------------------------------------------------------------- the values are the ones eager computes


@settings(derandomize=True, max_examples=12, deadline=None)
@given(
    st.integers(1, 3), st.integers(1, 3), st.integers(2, 4), st.integers(2, 4), st.data(),
)
def test_a_shifted_window_mask_of_any_window_and_shift_folds_to_its_eager_value(
    windows_h: int, windows_w: int, window_h: int, window_w: int, data: st.DataObject
) -> None:
    shift = (data.draw(st.integers(1, window_h - 1)), data.draw(st.integers(1, window_w - 1)))
    size, window = (windows_h * window_h, windows_w * window_w), (window_h, window_w)
    model = ShiftedWindowScores(size, window, shift)
    scores = torch.randn(windows_h * windows_w, window_h * window_w, window_h * window_w)
    folded = _folded(model, scores)
    assert not {"fill_", "new_zeros", "masked_fill", "ne", "eq", "slice", "sub"} & set(_ops(folded))
    torch.testing.assert_close(folded(scores), model(scores), atol=0, rtol=0)


def test_the_qkv_bias_folds_into_one_parameter_and_the_parameters_it_read_are_dropped() -> None:
    model, x = QkvBias(), torch.randn(2, 5, 16)
    folded = _folded(model, x)
    (linear,) = [n for n in folded.graph.nodes if n.op == "call_function"]
    bias = linear.args[2]
    assert bias.op == "get_attr"
    expected = torch.cat((model.q_bias, torch.zeros(16), model.v_bias))
    torch.testing.assert_close(getattr(folded, bias.target), expected, atol=0, rtol=0)
    assert not any("q_bias" in name or "v_bias" in name for name, _ in folded.named_parameters())


def test_a_gather_from_a_parameter_table_by_computed_indices_folds() -> None:
    model, scores = RelativeBias(), torch.randn(1, 2, 6, 6)
    folded = _folded(model, scores)
    assert set(_ops(folded)) == {"add"}
    torch.testing.assert_close(folded(scores), model(scores), atol=0, rtol=0)


# ---------------------------------------------------------------- what is never folded


def test_what_depends_on_an_input_value_is_not_folded() -> None:
    class InputDependent(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mask = torch.zeros_like(x)  # from x's shape only: constant
            mask[:, :1] = x[:, :1]  # from x's values: the whole storage is not constant any more
            return x + mask

    x = torch.randn(2, 3)
    folded = _folded(InputDependent(), x)
    assert "copy_" in _ops(folded) or "slice_scatter" in _ops(folded)
    torch.testing.assert_close(folded(x), InputDependent()(x))
    other = torch.randn(2, 3)
    torch.testing.assert_close(folded(other), InputDependent()(other))


def test_a_random_op_is_never_folded() -> None:
    class Noisy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.randn(3) * 0

    folded = _folded(Noisy(), torch.randn(2, 3))
    assert "randn" in _ops(folded)


def test_a_buffer_written_in_place_is_state_and_is_not_folded() -> None:
    class Counter_(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("count", torch.zeros(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.count.add_(1)
            return x + self.count * 2

    region = ConstantRegion(torch.export.export(Counter_(), (torch.randn(2),)).module())
    assert not any(n.op == "call_function" for n in region.nodes)


def test_a_size_from_a_dynamic_dim_is_not_folded_and_a_static_one_is() -> None:
    class Dynamic(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.zeros(x.shape[0], 1) + torch.ones(1, x.shape[1]).cumsum(1)

    x = torch.randn(3, 4)
    folded = _folded(Dynamic(), x, dynamic_shapes=({0: Dim("batch")},))
    ops = _ops(folded)
    assert "zeros" in ops and "cumsum" not in ops and "ones" not in ops
    bigger = torch.randn(7, 4)
    torch.testing.assert_close(folded(bigger), Dynamic()(bigger))


def test_a_mask_started_with_new_zeros_of_a_dynamically_batched_input_folds() -> None:
    """``x.new_zeros(size)`` reads only ``x``'s dtype and device: a dynamic batch of ``x`` changes nothing."""
    model, scores = ShiftedWindowScores((8, 8), (4, 4), (2, 2)), torch.randn(2, 4, 16, 16)
    folded = _folded(model, scores, dynamic_shapes=({0: Dim("batch", min=1, max=16)},))
    assert not {"fill_", "new_zeros", "masked_fill", "ne", "eq", "slice", "sub"} & set(_ops(folded))
    other = torch.randn(5, 4, 16, 16)
    torch.testing.assert_close(folded(other), model(other), atol=0, rtol=0)


def test_the_shifted_window_mask_of_swin3d_t_at_its_published_size_folds() -> None:
    """128 windows of 8x7x7 tokens: a 19.7M-element mask, the size a video Swin reaches at 32x224x224."""
    from testbed.networks.swin3d import _attention_mask_3d

    class Masked(torch.nn.Module):
        def forward(self, scores: torch.Tensor) -> torch.Tensor:
            return scores + _attention_mask_3d(scores, (16, 56, 56), (8, 7, 7), (4, 3, 3))

    scores = torch.randn(1, 392)
    folded = _folded(Masked(), scores)
    assert not {"masked_fill", "ne", "eq", "sub"} & set(_ops(folded))
    torch.testing.assert_close(folded(scores), Masked()(scores), atol=0, rtol=0)


def test_a_constant_above_the_element_budget_is_left_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    class Big(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.arange(64.0).reshape(8, 8).cumsum(0)

    monkeypatch.setattr(constants, "MAX_CONSTANT_ELEMENTS", 32)
    folded = _folded(Big(), torch.randn(8, 8))
    assert "cumsum" in _ops(folded)


def test_an_expand_of_a_constant_read_by_an_add_is_kept_and_only_the_small_constant_stored() -> None:
    class Broadcast(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pos = torch.nn.Parameter(torch.randn(4, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + (self.pos * 2).expand(16, 4, 8)

    model, x = Broadcast(), torch.randn(16, 4, 8)
    folded = _folded(model, x)
    (expand,) = [n for n in folded.graph.nodes if n.op == "call_function" and "expand" in str(n.target)]
    assert tuple(getattr(folded, expand.args[0].target).shape) == (4, 8)
    torch.testing.assert_close(folded(x), model(x))


def test_a_constant_the_graph_returns_is_left_computed() -> None:
    class ReturnsConstant(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x * 2, torch.arange(4.0) * 3

    graph_module = torch.export.export(ReturnsConstant(), (torch.randn(2),)).module()
    assert not FoldConstantsPass().applies_to(graph_module)


def test_folding_twice_changes_nothing_the_second_time() -> None:
    graph_module = _folded(ShiftedWindowScores((4, 4), (2, 2), (1, 1)), torch.randn(4, 4, 4))
    assert not run_passes([FoldConstantsPass()], graph_module, strict=True).modified


def test_constant_value_refuses_a_tensor_written_in_place_by_a_non_constant() -> None:
    class Written(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            base = torch.zeros(2, 3)
            base[0] = x[0]
            return base

    graph_module = torch.export.export(Written(), (torch.randn(2, 3),)).module()
    (zeros,) = [n for n in graph_module.graph.nodes if "zeros" in str(n.target)]
    assert constant_value(graph_module, zeros) is None


# ---------------------------------------------------------------- lowered: the linear with the folded bias is delegated


FOLDED: dict[str, tuple[type[torch.nn.Module], tuple[int, ...]]] = {
    "qkv bias": (QkvBias, (2, 5, 16)),
    "relative-position bias": (RelativeBias, (1, 2, 6, 6)),
    "one-head relative-position bias": (OneHeadRelativeBias, (4, 1, 6, 6)),
    "shifted-window mask": (lambda: ShiftedWindowScores((8, 8), (4, 4), (2, 2)), (4, 16, 16)),  # type: ignore[dict-item]
}


@pytest.mark.parametrize("name", list(FOLDED))
def test_a_model_computing_a_constant_lowers_to_one_delegate_with_nothing_outside(name: str) -> None:
    build, shape = FOLDED[name]
    torch.manual_seed(0)
    lowered, out, reference, tolerance = lower_and_run(build(), torch.randn(shape), "float")
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1, lowered.outside_ops()
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_a_linear_with_a_folded_bias_in_int8_is_delegated_within_two_steps_of_the_original(mode: Int8) -> None:
    torch.manual_seed(0)
    result = int8_against_the_original(QkvBias(), torch.randn(2, 5, 16), mode)
    assert result.lowered.outside_ops() == {} and result.lowered.num_delegates == 1, result.lowered.outside_ops()
    assert result.steps <= 2, f"{result.steps:.2f} quantization steps from the original quantized"
    if mode == "static":
        assert no_new_scales(result), (result.scales, result.ideal_scales)  # no rounding the original lacks


def test_without_folding_the_computed_bias_keeps_the_linear_out_of_xnnpack() -> None:
    """What the fold fixes: XNNPACK's linear takes a static bias only ("Expected bias to be a static param")."""
    x = torch.randn(2, 5, 16)
    passes = [p for p in default_rewrites() if not isinstance(p, FoldConstantsPass)]
    ep = XnnpackRewriter(passes, strict=True)(torch.export.export(QkvBias().eval(), (x,)))
    lowered = lower(ep, (x,), xnnguard.XnnpackPartitioner())
    assert "addmm" in lowered.outside_ops()


def test_with_a_dynamic_batch_the_bias_still_folds_and_the_program_runs_at_other_batch_sizes() -> None:
    torch.manual_seed(0)
    model, x = QkvBias().eval(), torch.randn(2, 5, 16)
    batch = ({0: Dim("batch", min=1, max=16)},)
    ep = xnnguard.rewrite_for_xnnpack(torch.export.export(model, (x,), dynamic_shapes=batch), strict=True)
    lowered = lower(ep, (x,), xnnguard.XnnpackPartitioner())
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1, lowered.outside_ops()
    for size in (2, 7, 1):
        x = torch.randn(size, 5, 16)
        torch.testing.assert_close(run_pte(lowered.buffer, (x,))[0], model(x), atol=1e-4, rtol=1e-4)


def test_a_folded_value_is_stored_with_the_strides_of_a_fresh_tensor() -> None:
    """A permuted gather with size-1 dims is contiguous to torch with strides (1, 1, 6, 1); ExecuTorch reads a
    dim order from those strides, and the XNNPACK delegate then fails at run time ("Propagating input shapes")."""
    folded = _folded(OneHeadRelativeBias(), torch.randn(4, 1, 6, 6))
    (constant,) = [n for n in folded.graph.nodes if n.op == "get_attr"]
    value = getattr(folded, constant.target)
    assert value.stride() == torch.empty(value.shape).stride()
