"""Hiera for video (Ryali et al., "Hiera", 2023), following facebookresearch/hiera's ``Hiera``.

What is kept: the Conv3d patch embedding (3, 7, 7) / (2, 4, 4), flattened to tokens; separate spatial
and temporal position embeddings (``sep_pos_embed``: spatial repeated over frames plus temporal
``repeat_interleave``d over positions); ``Unroll``, which reorders the tokens once per pooling stage with
an 8-D view and 8-D permute (so that every later max pooling is a max over a leading dim); blocks with
mask-unit attention (qkv reshaped to 6-D (B, tokens, windows, 3, heads, head_dim) and permuted, q pooled
by a 6-D view + ``max(dim=3)`` at the first block of a pooled stage, ``F.scaled_dot_product_attention``),
mask units of (1, 8, 8) tokens in the first two stages and global attention after (lagging one block, as
Hiera does), channel doubling with ``do_pool(proj(x_norm))`` on the skip, LayerNorm, GELU MLP; mean
over tokens, LayerNorm, linear head.

What is simplified at "bench" ("full" is Hiera-B 16x224): widths (48 instead of 96) and depths ((1, 2, 3, 1)
instead of Hiera-B's (2, 3, 16, 3)), clip 8 x 96 x 96 instead of 16 x 224 x 224; no drop path; no masking (MAE
pretraining only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from testbed.networks._common import Built, Mlp, pick, reinit_norms, seeded

Size3 = tuple[int, int, int]


@dataclass(frozen=True)
class HieraConfig:
    embed_dim: int
    stages: tuple[int, ...]
    frames: int
    resolution: int
    num_heads: int = 1
    q_pool: int = 3
    q_stride: Size3 = (1, 2, 2)
    mask_unit_size: Size3 = (1, 8, 8)
    mask_unit_attn: tuple[bool, ...] = (True, True, False, False)
    patch_stride: Size3 = (2, 4, 4)
    num_classes: int = 400


CONFIGS = {
    "bench": HieraConfig(embed_dim=48, stages=(1, 2, 3, 1), frames=8, resolution=96),
    "test": HieraConfig(embed_dim=16, stages=(1, 2, 1, 1), frames=4, resolution=64),
    "full": HieraConfig(embed_dim=96, stages=(2, 3, 16, 3), frames=16, resolution=224),
}


def do_pool(x: torch.Tensor, stride: int) -> torch.Tensor:
    """Max pool the unrolled tokens: after ``Unroll``, each pooling window is a leading block of ``stride``."""
    return x.view(x.shape[0], stride, -1, x.shape[-1]).max(dim=1).values


class Unroll(nn.Module):
    """Reorder tokens so that each of ``schedule``'s poolings takes a max over a leading dim."""

    def __init__(self, input_size: Size3, patch_stride: Size3, schedule: list[Size3]) -> None:
        super().__init__()
        self.size = [i // s for i, s in zip(input_size, patch_stride)]
        self.schedule = schedule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, c = x.shape
        cur_size = self.size
        x = x.view(*([b, *cur_size, c]))
        for strides in self.schedule:
            cur_size = [i // s for i, s in zip(cur_size, strides)]
            new_shape = [b, *(d for i, s in zip(cur_size, strides) for d in (i, s)), c]
            x = x.view(new_shape)
            rank = len(new_shape)
            x = x.permute([0, *range(2, rank - 1, 2), *range(1, rank - 1, 2), rank - 1])
            x = x.flatten(0, len(strides))
            b *= math.prod(strides)
        return x.reshape(-1, math.prod(self.size), c)


class MaskUnitAttention(nn.Module):
    """Attention within mask units (or global), with q max-pooled by ``q_stride``."""

    def __init__(self, dim: int, dim_out: int, heads: int, q_stride: int, window_size: int,
                 use_mask_unit_attn: bool) -> None:
        super().__init__()
        self.dim_out = dim_out
        self.heads = heads
        self.q_stride = q_stride
        self.head_dim = dim_out // heads
        self.window_size = window_size
        self.use_mask_unit_attn = use_mask_unit_attn
        self.qkv = nn.Linear(dim, 3 * dim_out)
        self.proj = nn.Linear(dim_out, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        num_windows = n // (self.q_stride * self.window_size) if self.use_mask_unit_attn else 1
        qkv = self.qkv(x).reshape(b, -1, num_windows, 3, self.heads, self.head_dim).permute(3, 0, 4, 2, 1, 5)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if self.q_stride > 1:
            q = q.view(b, self.heads, num_windows, self.q_stride, -1, self.head_dim).max(dim=3).values
        x = F.scaled_dot_product_attention(q, k, v)
        x = x.transpose(1, 3).reshape(b, -1, self.dim_out)
        return self.proj(x)


class HieraBlock(nn.Module):
    def __init__(self, dim: int, dim_out: int, heads: int, q_stride: int, window_size: int,
                 use_mask_unit_attn: bool) -> None:
        super().__init__()
        self.dim, self.dim_out = dim, dim_out
        self.norm1 = nn.LayerNorm(dim)
        self.attn = MaskUnitAttention(dim, dim_out, heads, q_stride, window_size, use_mask_unit_attn)
        self.norm2 = nn.LayerNorm(dim_out)
        self.mlp = Mlp(dim_out, 4 * dim_out)
        self.proj = nn.Linear(dim, dim_out) if dim != dim_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_norm = self.norm1(x)
        if self.proj is not None:
            x = do_pool(self.proj(x_norm), stride=self.attn.q_stride)
        x = x + self.attn(x_norm)
        return x + self.mlp(self.norm2(x))


class Hiera(nn.Module):
    def __init__(self, cfg: HieraConfig) -> None:
        super().__init__()
        input_size = (cfg.frames, cfg.resolution, cfg.resolution)
        self.tokens_spatial = [i // s for i, s in zip(input_size[1:], cfg.patch_stride[1:])]
        frames = cfg.frames // cfg.patch_stride[0]
        embed_dim = cfg.embed_dim
        self.patch_embed = nn.Conv3d(3, embed_dim, (3, 7, 7), stride=cfg.patch_stride, padding=(1, 3, 3))
        self.pos_embed_spatial = nn.Parameter(0.02 * torch.randn(1, math.prod(self.tokens_spatial), embed_dim))
        self.pos_embed_temporal = nn.Parameter(0.02 * torch.randn(1, frames, embed_dim))
        stage_ends = [sum(cfg.stages[:i]) - 1 for i in range(1, len(cfg.stages) + 1)]
        self.unroll = Unroll(input_size, cfg.patch_stride, [cfg.q_stride] * len(stage_ends[:-1]))
        q_pool_blocks = [x + 1 for x in stage_ends[: cfg.q_pool]]
        flat_mu_size, flat_q_stride = math.prod(cfg.mask_unit_size), math.prod(cfg.q_stride)
        num_heads, cur_stage = cfg.num_heads, 0
        blocks = []
        for i in range(sum(cfg.stages)):
            dim_out = embed_dim
            use_mask_unit_attn = cfg.mask_unit_attn[cur_stage]  # lags one block behind the stage, as in Hiera
            if (i - 1) in stage_ends:
                dim_out, num_heads, cur_stage = embed_dim * 2, num_heads * 2, cur_stage + 1
                if i in q_pool_blocks:
                    flat_mu_size //= flat_q_stride
            blocks.append(HieraBlock(embed_dim, dim_out, num_heads, flat_q_stride if i in q_pool_blocks else 1,
                                     flat_mu_size, use_mask_unit_attn))
            embed_dim = dim_out
        self.blocks = nn.Sequential(*blocks)
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, cfg.num_classes)

    def pos_embed(self) -> torch.Tensor:
        frames = self.pos_embed_temporal.shape[1]
        return (self.pos_embed_spatial.repeat(1, frames, 1)
                + torch.repeat_interleave(self.pos_embed_temporal, math.prod(self.tokens_spatial), dim=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = self.unroll(x + self.pos_embed())
        x = self.blocks(x)
        return self.head(self.norm(x.mean(dim=1)))


def build(size: str = "bench") -> Built:
    """Hiera-structured video network and a 1 x 3 x T x H x W clip."""
    cfg = pick(size, CONFIGS)

    def make() -> Built:
        return reinit_norms(Hiera(cfg)), (torch.randn(1, 3, cfg.frames, cfg.resolution, cfg.resolution),)

    return seeded(9, make)
