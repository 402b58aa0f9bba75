"""Idioms of third-party vision and video code, each a small model written after its source: one delegate,
nothing outside XNNPACK, and the numbers of eager PyTorch (float) or the converted model (int8).

Each idiom split real networks into several delegates (issue 32): Hugging Face's padding masks built from
the input's shape, ``F.normalize``'s ``expand_as`` (Wan's RMS norm), gathers by computed indices (an
upsampling to a skip connection's size), a channel softmax, a one-tensor ``cat``, ``contiguous()`` after a
window partition, an integer scalar, a window merge or a patchify at the graph's edge, a causal mask applied
with ``masked_fill``. A softmax of a conv's
output computed wrong numbers (ExecuTorch held it channels-last and normalized over the channels).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from testbed.flow import lower_and_run
from testbed.quantize import PRECISIONS, Precision
from tests.support import dynamic_int8_in_slow_tier


class HFPaddingMask(nn.Module):
    """A transformers vision tower's attention: a padding mask of ones from the input's shape, made 4-D
    and additive (``get_extended_attention_mask``), rows of all-minimum unmasked (``_unmask_unattended``)."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.qkv, self.proj, self.heads = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        attention_mask = torch.ones(x.shape[:2], dtype=torch.long)
        expanded = attention_mask[:, None, None, :].expand(b, 1, n, n).to(x.dtype)
        inverted = 1.0 - expanded
        minimum = torch.finfo(x.dtype).min
        mask = inverted.masked_fill(inverted.to(torch.bool), minimum)
        mask = mask.mul(~torch.all(mask == minimum, dim=-1, keepdim=True))
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class MaskedRows(nn.Module):
    """A boolean attention mask with a fully masked query row: eager attention gives 0 there."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        keep = torch.ones(n, n, dtype=torch.bool).tril()
        keep[1] = False  # query 1 sees nothing
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep).squeeze(1) + x


class FullLikeMask(nn.Module):
    """A mask from ``full_like`` + ``eq`` + ``any`` + ``logical_not`` + ``where`` on the input's shape only."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        ones = torch.full_like(x[..., :1], 1.0).expand(b, n, n)
        masked = ones == 0
        keep = torch.logical_not(masked.any(dim=-1, keepdim=True))
        bias = torch.where(masked, torch.finfo(x.dtype).min, 0.0) * keep
        return self.linear(torch.softmax(x @ x.transpose(1, 2) + bias, dim=-1) @ x)


class NormalizeGain(nn.Module):
    """Wan 2.1's RMS norm: ``F.normalize`` (its 2-norm ``expand_as`` the input) times sqrt(C) and a gain."""

    def __init__(self, channels: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv3d(channels, channels, 1)
        self.gamma = nn.Parameter(torch.rand(channels, 1, 1, 1) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.normalize(x, dim=1) * x.shape[1] ** 0.5 * self.gamma)


class FirstFrameRepeated(nn.Module):
    """A causal video conv padded in front with copies of the first frame: an ``expand`` into a ``cat``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(4, 8, 3, padding=(0, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([x[:, :, :1].expand(-1, -1, 2, -1, -1), x], dim=2))


class IndexedUpsample(nn.Module):
    """An upsampling to an odd skip size by computed source indices (``arange`` -> ``floor`` -> ``clamp`` ->
    ``index``), the nearest-neighbour rule of ``F.interpolate(size=...)``, then the skip added."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        (h, w), (sh, sw) = x.shape[-2:], skip.shape[-2:]
        rows = (torch.arange(sh) * (h / sh)).floor().long().clamp(0, h - 1)
        cols = (torch.arange(sw) * (w / sw)).floor().long().clamp(0, w - 1)
        return self.conv(x[:, :, rows][:, :, :, cols]) + skip


class ChannelSoftmax(nn.Module):
    """A softmax over the channels (a segmentation head), and a log-softmax over the width."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.softmax(x, dim=1)) * torch.log_softmax(x, dim=3).mean()


class SoftmaxAfterConv(nn.Module):
    """Softmaxes of a conv's output: over the width (a spatial-softmax keypoint head), over the channels (a
    segmentation head) and a log-softmax over the width; ExecuTorch holds a conv's output channels-last."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return torch.softmax(y, dim=3), torch.softmax(y, dim=1), torch.log_softmax(y, dim=-1)


class OneTensorCat(nn.Module):
    """``torch.cat`` of a list that holds one tensor (a loop over one scale), and integer scalars."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(5, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.cat([x * 2], dim=1) + 1)


class PatchifyInput(nn.Module):
    """Perceiver IO's space-to-depth of the graph input (B, T, H, W, C): an 8-D view, permute, ``contiguous``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(24, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h, w, c = x.shape
        y = x.reshape(b, t // 2, 2, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 5, 2, 4, 6, 7).contiguous()
        return self.linear(y.reshape(b, -1, 8 * c))


class WindowMergeOutput(nn.Module):
    """Swin-UNETR's window reverse at the graph's end: windows back to (B, D, H, W, C), returned."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        y = self.linear(windows).view(1, 2, 2, 2, 2, 2, 2, 4).permute(0, 1, 4, 2, 5, 3, 6, 7).contiguous()
        return y.view(1, 4, 4, 4, 4)


class EightDimOutput(nn.Module):
    """A patchified result returned as it is, 8-D: the one reshape that must touch it stays outside."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).reshape(2, 2, 2, 2, 2, 1, 1, 8)


class CausalMaskedFill(nn.Module):
    """Hand-written causal attention (fuzz seed 194): ``scores.masked_fill(~tril, finfo.min)`` with a constant
    mask; 1.5.1 left the ``where`` and its ``scalar_tensor`` between two delegates."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(8, 24), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) * 8**-0.5
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
        return self.proj(scores.softmax(dim=-1) @ v)


IDIOMS: dict[str, tuple[Callable[[], nn.Module], tuple[tuple[int, ...], ...]]] = {
    "Hugging Face padding mask": (HFPaddingMask, ((2, 6, 16),)),
    "boolean mask with a fully masked row": (MaskedRows, ((2, 5, 8),)),
    "full_like + any + where mask": (FullLikeMask, ((2, 6, 16),)),
    "F.normalize's expand_as": (NormalizeGain, ((1, 4, 3, 4, 4),)),
    "first frame expanded into a cat": (FirstFrameRepeated, ((1, 4, 4, 8, 8),)),
    "upsampling by computed indices": (IndexedUpsample, ((1, 4, 3, 4), (1, 4, 7, 9))),
    "softmax over the channels": (ChannelSoftmax, ((1, 4, 6, 6),)),
    "softmax of a conv's output": (SoftmaxAfterConv, ((1, 4, 5, 7),)),
    "cat of one tensor, integer scalars": (OneTensorCat, ((2, 4, 5),)),
    "patchify of the graph input": (PatchifyInput, ((1, 4, 4, 4, 3),)),
    "window merge at the graph output": (WindowMergeOutput, ((8, 8, 4),)),
    "8-D graph output": (EightDimOutput, ((2, 16, 8),)),
    "causal mask by masked_fill": (CausalMaskedFill, ((2, 6, 8),)),
}
# What must stay outside: the one reshape that makes an 8-D graph output (not its requantization, in int8).
LEFT = {"8-D graph output": {"view_copy": 1}}


@pytest.mark.parametrize("precision", dynamic_int8_in_slow_tier(PRECISIONS))
@pytest.mark.parametrize("name", list(IDIOMS))
def test_an_idiom_of_real_networks_runs_in_one_delegate_and_matches(name: str, precision: Precision) -> None:
    build, shapes = IDIOMS[name]
    torch.manual_seed(0)
    model, inputs = build().eval(), tuple(torch.randn(shape) for shape in shapes)
    run = lower_and_run(model, inputs, precision)
    assert run.lowered.num_delegates == 1 and dict(run.lowered.outside_ops()) == LEFT.get(name, {}), (
        run.lowered.outside_ops())
    run.assert_matches()
