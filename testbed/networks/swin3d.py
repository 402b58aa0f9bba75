"""Swin3D-T (Liu et al., "Video Swin Transformer", 2022), following torchvision's ``swin3d_t``.

What is kept: ``PatchEmbed3d`` (F.pad of the clip to a multiple of the patch size, Conv3d with
kernel = stride = (2, 4, 4), permute to channels-last, LayerNorm); per block, pre-norm 3-D shifted window
attention as torchvision's ``shifted_window_attention_3d`` computes it: the window and shift shrink to the
input where it is smaller, F.pad of the 5-D activations to a multiple of the window, ``torch.roll`` by
minus the shift, the 8-D view + permute window partition, qkv linear, scaled q @ k^T, the relative
position bias gathered from its table by the ``relative_position_index`` buffer, the shifted-window
attention mask built with slice assignment into ``new_zeros`` and compared pairwise (``masked_fill``
-100), softmax, the inverse 8-D permute, the inverse roll and the unpad slice; a GELU MLP; torchvision's
2-D ``PatchMerging`` between stages (``x[..., 0::2, 0::2, :]`` and its three siblings, ``cat``, LayerNorm,
bias-free Linear 4C -> 2C); final LayerNorm, permute, AdaptiveAvgPool3d(1), flatten, head.
Blocks alternate shift 0 and window // 2, as in torchvision.

What is simplified at "bench" ("full" is ``swin3d_t`` on its 32 x 224 x 224 clip): embed dim 48 instead of 96
(heads scaled with it), depths (2, 2, 2, 2) instead of (2, 2, 6, 2), clip 8 x 96 x 96 instead of 32 x 224 x
224 (so windows are padded at the first two stages and shrink to the input at the last two); dropout and
stochastic depth are inactive in eval mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from testbed.networks._common import Built, Mlp, pick, reinit_norms, seeded

Size3 = tuple[int, int, int]


@dataclass(frozen=True)
class Swin3DConfig:
    embed_dim: int
    depths: tuple[int, ...]
    heads: tuple[int, ...]
    frames: int
    resolution: int
    window: Size3 = (8, 7, 7)
    patch: Size3 = (2, 4, 4)
    num_classes: int = 400


CONFIGS = {
    "bench": Swin3DConfig(embed_dim=48, depths=(2, 2, 2, 2), heads=(3, 6, 12, 24), frames=8, resolution=96),
    # only the first stage is larger than a window, so only it shifts: one block a stage after it
    "test": Swin3DConfig(embed_dim=16, depths=(2, 1, 1), heads=(1, 2, 4), frames=4, resolution=40),
    "full": Swin3DConfig(embed_dim=96, depths=(2, 2, 6, 2), heads=(3, 6, 12, 24), frames=32, resolution=224),
}


def _window_and_shift(shift: list[int], size_dhw: Size3, window: list[int]) -> tuple[list[int], list[int]]:
    """Where the input is no larger than the window, the window is the input and there is no shift."""
    for i in range(3):
        if size_dhw[i] <= window[i]:
            window[i] = size_dhw[i]
            shift[i] = 0
    return window, shift


def _pad_size_3d(size_dhw: Size3, patch: Size3) -> Size3:
    pad = [(patch[i] - size_dhw[i] % patch[i]) % patch[i] for i in range(3)]
    return pad[0], pad[1], pad[2]


def _attention_mask_3d(x: Tensor, size_dhw: Size3, window: Size3, shift: Size3) -> Tensor:
    """Which tokens of a shifted window came from the same region: 0 there, -100 between regions."""
    attn_mask = x.new_zeros(*size_dhw)
    num_windows = (size_dhw[0] // window[0]) * (size_dhw[1] // window[1]) * (size_dhw[2] // window[2])
    slices = [((0, -window[i]), (-window[i], -shift[i]), (-shift[i], None)) for i in range(3)]
    count = 0
    for d in slices[0]:
        for h in slices[1]:
            for w in slices[2]:
                attn_mask[d[0]:d[1], h[0]:h[1], w[0]:w[1]] = count
                count += 1
    attn_mask = attn_mask.view(size_dhw[0] // window[0], window[0], size_dhw[1] // window[1], window[1],
                               size_dhw[2] // window[2], window[2])
    attn_mask = attn_mask.permute(0, 2, 4, 1, 3, 5).reshape(num_windows, window[0] * window[1] * window[2])
    attn_mask = attn_mask.unsqueeze(1) - attn_mask.unsqueeze(2)
    return attn_mask.masked_fill(attn_mask != 0, -100.0).masked_fill(attn_mask == 0, 0.0)


def shifted_window_attention_3d(x: Tensor, qkv: nn.Linear, proj: nn.Linear, relative_position_bias: Tensor,
                                window: list[int], num_heads: int, shift: list[int]) -> Tensor:
    """torchvision's ``shifted_window_attention_3d`` on a (B, T, H, W, C) tensor (dropout 0)."""
    b, t, h, w, c = x.shape
    pad = _pad_size_3d((t, h, w), (window[0], window[1], window[2]))
    x = F.pad(x, (0, 0, 0, pad[2], 0, pad[1], 0, pad[0]))
    _, tp, hp, wp, _ = x.shape
    if sum(shift) > 0:
        x = torch.roll(x, shifts=(-shift[0], -shift[1], -shift[2]), dims=(1, 2, 3))
    num_windows = (tp // window[0]) * (hp // window[1]) * (wp // window[2])
    x = x.view(b, tp // window[0], window[0], hp // window[1], window[1], wp // window[2], window[2], c)
    x = x.permute(0, 1, 3, 5, 2, 4, 6, 7).reshape(b * num_windows, window[0] * window[1] * window[2], c)

    qkv_out = qkv(x).reshape(x.size(0), x.size(1), 3, num_heads, c // num_heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv_out[0], qkv_out[1], qkv_out[2]
    q = q * (c // num_heads) ** -0.5
    attn = q.matmul(k.transpose(-2, -1)) + relative_position_bias
    if sum(shift) > 0:
        attn_mask = _attention_mask_3d(x, (tp, hp, wp), (window[0], window[1], window[2]),
                                       (shift[0], shift[1], shift[2]))
        attn = attn.view(x.size(0) // num_windows, num_windows, num_heads, x.size(1), x.size(1))
        attn = attn + attn_mask.unsqueeze(1).unsqueeze(0)
        attn = attn.view(-1, num_heads, x.size(1), x.size(1))
    attn = F.softmax(attn, dim=-1)
    x = attn.matmul(v).transpose(1, 2).reshape(x.size(0), x.size(1), c)
    x = proj(x)

    x = x.view(b, tp // window[0], hp // window[1], wp // window[2], window[0], window[1], window[2], c)
    x = x.permute(0, 1, 4, 2, 5, 3, 6, 7).reshape(b, tp, hp, wp, c)
    if sum(shift) > 0:
        x = torch.roll(x, shifts=(shift[0], shift[1], shift[2]), dims=(1, 2, 3))
    return x[:, :t, :h, :w, :].contiguous()


class ShiftedWindowAttention3d(nn.Module):
    def __init__(self, dim: int, window: list[int], shift: list[int], num_heads: int) -> None:
        super().__init__()
        self.window = window
        self.shift = shift
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        table = (2 * window[0] - 1) * (2 * window[1] - 1) * (2 * window[2] - 1)
        self.relative_position_bias_table = nn.Parameter(torch.randn(table, num_heads) * 0.02)
        self.register_buffer("relative_position_index", self._relative_position_index())

    def _relative_position_index(self) -> Tensor:
        """For each (token, token) pair inside a window, the row of the bias table for their offset."""
        wd, wh, ww = self.window
        coords = torch.stack(torch.meshgrid(torch.arange(wd), torch.arange(wh), torch.arange(ww), indexing="ij"))
        coords_flatten = torch.flatten(coords, 1)
        relative = (coords_flatten[:, :, None] - coords_flatten[:, None, :]).permute(1, 2, 0).contiguous()
        relative[:, :, 0] += wd - 1
        relative[:, :, 1] += wh - 1
        relative[:, :, 2] += ww - 1
        relative[:, :, 0] *= (2 * wh - 1) * (2 * ww - 1)
        relative[:, :, 1] *= 2 * ww - 1
        return relative.sum(-1)

    def _relative_position_bias(self, window: list[int]) -> Tensor:
        vol = window[0] * window[1] * window[2]
        index: Tensor = self.relative_position_index  # type: ignore[assignment]
        bias = self.relative_position_bias_table[index[:vol, :vol].flatten()]
        return bias.view(vol, vol, -1).permute(2, 0, 1).contiguous().unsqueeze(0)

    def forward(self, x: Tensor) -> Tensor:
        _, t, h, w, _ = x.shape
        window, shift = _window_and_shift(self.shift.copy(), (t, h, w), self.window.copy())
        bias = self._relative_position_bias(window)
        return shifted_window_attention_3d(x, self.qkv, self.proj, bias, window, self.num_heads, shift)


class SwinTransformerBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, window: list[int], shift: list[int]) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = ShiftedWindowAttention3d(dim, window, shift, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, 4 * dim)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchMerging(nn.Module):
    """torchvision's 2-D patch merging on the last three dims of a (B, T, H, W, C) tensor."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(4 * dim)

    def forward(self, x: Tensor) -> Tensor:
        h, w, _ = x.shape[-3:]
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        x0 = x[..., 0::2, 0::2, :]
        x1 = x[..., 1::2, 0::2, :]
        x2 = x[..., 0::2, 1::2, :]
        x3 = x[..., 1::2, 1::2, :]
        x = torch.cat([x0, x1, x2, x3], -1)
        return self.reduction(self.norm(x))


class PatchEmbed3d(nn.Module):
    def __init__(self, patch: Size3, embed_dim: int) -> None:
        super().__init__()
        self.patch = patch
        self.proj = nn.Conv3d(3, embed_dim, kernel_size=patch, stride=patch)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x: Tensor) -> Tensor:
        _, _, t, h, w = x.size()
        pad = _pad_size_3d((t, h, w), self.patch)
        x = F.pad(x, (0, pad[2], 0, pad[1], 0, pad[0]))
        x = self.proj(x).permute(0, 2, 3, 4, 1)
        return self.norm(x)


class SwinTransformer3d(nn.Module):
    def __init__(self, cfg: Swin3DConfig) -> None:
        super().__init__()
        self.patch_embed = PatchEmbed3d(cfg.patch, cfg.embed_dim)
        layers: list[nn.Module] = []
        for stage, (depth, heads) in enumerate(zip(cfg.depths, cfg.heads)):
            dim = cfg.embed_dim * 2**stage
            for index in range(depth):
                shift = [0 if index % 2 == 0 else w // 2 for w in cfg.window]
                layers.append(SwinTransformerBlock(dim, heads, list(cfg.window), shift))
            if stage < len(cfg.depths) - 1:
                layers.append(PatchMerging(dim))
        self.features = nn.Sequential(*layers)
        num_features = cfg.embed_dim * 2 ** (len(cfg.depths) - 1)
        self.norm = nn.LayerNorm(num_features)
        self.avgpool = nn.AdaptiveAvgPool3d(1)
        self.head = nn.Linear(num_features, cfg.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(self.patch_embed(x))
        x = self.norm(x).permute(0, 4, 1, 2, 3)
        x = torch.flatten(self.avgpool(x), 1)
        return self.head(x)


def build(size: str = "bench") -> Built:
    """Swin3D-T-structured network and a 1 x 3 x T x H x W clip."""
    cfg = pick(size, CONFIGS)

    def make() -> Built:
        model = reinit_norms(SwinTransformer3d(cfg))
        return model, (torch.randn(1, 3, cfg.frames, cfg.resolution, cfg.resolution),)

    return seeded(3, make)
