"""Scaled dot-product attention, unmasked, causal or with a constant mask, as bmm, softmax, bmm: same values, one
delegate."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from testbed.flow import lower_and_run
from testbed.int8_reference import Int8, int8_against_the_original, no_new_scales
from xnnguard.graph.ops import target_name
from xnnguard.report import Rule
from xnnguard.rewrite.attention.sdpa import AttentionAsBmmPass, attention_as_bmm
from xnnguard.rewrite.runner import run_passes


class Attention(torch.nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2, **options: object) -> None:
        super().__init__()
        self.heads, self.options = heads, options
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, **self.options)  # type: ignore[arg-type]
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


@settings(derandomize=True, max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 3), min_size=1, max_size=3), st.integers(1, 6), st.integers(1, 6),
    st.integers(1, 8), st.integers(1, 8), st.sampled_from([None, 0.3]),
)
def test_bmm_softmax_bmm_equals_attention(
    batch: list[int], queries: int, keys: int, embed: int, embed_v: int, scale: float | None
) -> None:
    q, k, v = torch.randn(*batch, queries, embed), torch.randn(*batch, keys, embed), torch.randn(*batch, keys, embed_v)
    factor = scale if scale is not None else embed**-0.5
    expected = F.scaled_dot_product_attention(q, k, v, scale=scale)
    torch.testing.assert_close(attention_as_bmm(q, k, v, factor), expected, atol=1e-5, rtol=1e-5)


def _attentions(model: torch.nn.Module, x: torch.Tensor) -> int:
    graph_module = torch.export.export(model, (x,)).module()
    run_passes([AttentionAsBmmPass()], graph_module, strict=True)
    calls = [n for n in graph_module.graph.nodes if n.op == "call_function"]
    return sum("scaled_dot_product_attention" in target_name(n) for n in calls)


class RunTimeMask(Attention):
    """An attention whose mask depends on the input's values: which rows are all -inf is known only at run time."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        mask = x[:, None, :, :1] > 0  # (b, 1, n, 1): queries whose first feature is positive see every key
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


def test_an_attention_whose_mask_is_computed_at_run_time_is_left_and_reported_with_why() -> None:
    graph_module = torch.export.export(RunTimeMask().eval(), (torch.randn(1, 5, 16),)).module()
    (record,) = run_passes([AttentionAsBmmPass()], graph_module, strict=True).report
    assert record.rule is Rule.NOT_REWRITTEN and "mask is computed at run time" in record.reason


def test_an_attention_with_a_constant_mask_a_causal_one_or_none_is_rewritten() -> None:
    x = torch.randn(1, 5, 16)
    assert _attentions(Attention(is_causal=True).eval(), x) == 0
    assert _attentions(Attention(attn_mask=torch.zeros(5, 5)).eval(), x) == 0
    assert _attentions(Attention().eval(), x) == 0


def test_a_causal_attention_over_a_dynamic_length_is_left_and_reported_with_why() -> None:
    x = torch.randn(1, 5, 16)
    ep = torch.export.export(Attention(is_causal=True).eval(), (x,),
                             dynamic_shapes=({1: torch.export.Dim("tokens", min=2, max=16)},))
    (record,) = run_passes([AttentionAsBmmPass()], ep.module(), strict=True).report
    assert "causal over a dynamic length" in record.reason


class CrossCausal(torch.nn.Module):
    """Causal attention of 3 queries over 5 keys: PyTorch's mask is the lower triangle of a 3 x 5 of ones."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("queries", [3, 5, 7])
def test_a_causal_attention_rewritten_gives_eagers_values(queries: int) -> None:
    q, k, v = torch.randn(2, 2, queries, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 4)
    graph_module = torch.export.export(CrossCausal(), (q, k, v)).module()
    assert run_passes([AttentionAsBmmPass()], graph_module, strict=True).report == ()
    with torch.no_grad():
        torch.testing.assert_close(graph_module(q, k, v), CrossCausal()(q, k, v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask", [
    pytest.param(torch.randn(5, 5), id="float"),
    pytest.param(torch.rand(5, 5) > 0.3, id="bool"),
    pytest.param(torch.zeros(5, 5).masked_fill(torch.eye(5, dtype=torch.bool), float("-inf")), id="-inf diagonal"),
    pytest.param(torch.ones(5, 5, dtype=torch.bool).index_fill(0, torch.tensor([2]), False), id="a row all masked"),
])
def test_a_constant_mask_rewritten_gives_eagers_values(mask: torch.Tensor) -> None:
    model, x = Attention(attn_mask=mask).eval(), torch.randn(1, 5, 16)
    graph_module = torch.export.export(model, (x,)).module()
    assert run_passes([AttentionAsBmmPass()], graph_module, strict=True).report == ()
    with torch.no_grad():
        torch.testing.assert_close(graph_module(x), model(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("is_causal", [False, True])
def test_an_attention_block_lowers_to_one_delegate_and_matches_eager(is_causal: bool) -> None:
    torch.manual_seed(0)
    model = Attention(is_causal=is_causal).eval()
    lowered, out, reference, tolerance = lower_and_run(model, torch.randn(1, 6, 16), "float")
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1, lowered.outside_ops()
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_an_attention_block_in_int8_is_one_delegate_within_two_steps_of_the_original(mode: Int8) -> None:
    torch.manual_seed(0)
    result = int8_against_the_original(Attention(), torch.randn(1, 6, 16), mode)
    assert result.lowered.outside_ops() == {} and result.lowered.num_delegates == 1, result.lowered.outside_ops()
    assert result.steps <= 2, f"{result.steps:.2f} quantization steps from the original quantized"
    if mode == "static":
        assert no_new_scales(result), (result.scales, result.ideal_scales)  # no rounding the original lacks
