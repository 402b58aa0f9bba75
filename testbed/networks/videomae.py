"""VideoMAE ViT encoder (Tong et al., "VideoMAE", 2022) as used for fine-tuned classification.

What is kept (the ``modeling_finetune.VisionTransformer`` of the VideoMAE repository): tubelet embedding,
a Conv3d with kernel = stride = (2, 16, 16), flatten and transpose to tokens; the fixed sinusoidal
position table (``get_sinusoid_encoding_table``, a buffer) added to the tokens; pre-norm blocks with
LayerNorm(eps 1e-6), attention whose qkv bias is ``cat(q_bias, zeros_like(v_bias), v_bias)`` through
``F.linear`` (no bias for k), scaled q @ k^T, explicit softmax, attn @ v, projection; a GELU MLP (ratio 4);
mean pooling of the tokens, ``fc_norm`` LayerNorm and the linear head.

``build_sdpa`` (registered as ``videomae_sdpa``) is the same network with the attention written as
``F.scaled_dot_product_attention``, as Hugging Face's ``VideoMAEModel`` runs it with the SDPA backend.

What is simplified at "bench" ("full" is VideoMAE ViT-B/16, as fine-tuned on Kinetics-400, on its 16 x
224 x 224 clip): ViT-S/16 widths (dim 384, 6 heads) but depth 4 instead of 12 at "bench"; the clip
is 8 x 112 x 112 (4 x 7 x 7 tokens) instead of 16 x 224 x 224; no drop path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from testbed.networks._common import Built, Mlp, pick, reinit_norms, seeded


@dataclass(frozen=True)
class VideoMAEConfig:
    dim: int
    depth: int
    heads: int
    frames: int
    resolution: int
    tubelet: tuple[int, int, int] = (2, 16, 16)
    num_classes: int = 400


CONFIGS = {
    "bench": VideoMAEConfig(dim=384, depth=4, heads=6, frames=8, resolution=112),
    "test": VideoMAEConfig(dim=32, depth=2, heads=2, frames=4, resolution=32),
    "full": VideoMAEConfig(dim=768, depth=12, heads=12, frames=16, resolution=224),
}


def sinusoid_table(positions: int, dim: int) -> torch.Tensor:
    """VideoMAE's ``get_sinusoid_encoding_table``: sin on even channels, cos on odd, shape (1, N, dim)."""
    exponent = 2 * (torch.arange(dim, dtype=torch.float64) // 2) / dim
    angles = torch.arange(positions, dtype=torch.float64)[:, None] / torch.pow(10000.0, exponent)[None, :]
    angles[:, 0::2] = torch.sin(angles[:, 0::2])
    angles[:, 1::2] = torch.cos(angles[:, 1::2])
    return angles.to(torch.float32).unsqueeze(0)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, sdpa: bool) -> None:
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.sdpa = sdpa
        self.qkv = nn.Linear(dim, dim * 3, bias=False)
        self.q_bias = nn.Parameter(0.02 * torch.randn(dim))
        self.v_bias = nn.Parameter(0.02 * torch.randn(dim))
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        qkv_bias = torch.cat((self.q_bias, torch.zeros_like(self.v_bias), self.v_bias))
        qkv = F.linear(x, self.qkv.weight, qkv_bias)
        q, k, v = qkv.reshape(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if self.sdpa:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            x = attn @ v
        return self.proj(x.transpose(1, 2).reshape(b, n, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, sdpa: bool) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads, sdpa)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, 4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    def __init__(self, cfg: VideoMAEConfig, sdpa: bool) -> None:
        super().__init__()
        self.patch_embed = nn.Conv3d(3, cfg.dim, kernel_size=cfg.tubelet, stride=cfg.tubelet)
        t, p = cfg.tubelet[0], cfg.tubelet[1]
        tokens = (cfg.frames // t) * (cfg.resolution // p) ** 2
        self.register_buffer("pos_embed", sinusoid_table(tokens, cfg.dim))
        self.blocks = nn.Sequential(*(Block(cfg.dim, cfg.heads, sdpa) for _ in range(cfg.depth)))
        self.fc_norm = nn.LayerNorm(cfg.dim, eps=1e-6)
        self.head = nn.Linear(cfg.dim, cfg.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = x + self.pos_embed.type_as(x)  # type: ignore[operator]
        x = self.blocks(x)
        return self.head(self.fc_norm(x.mean(1)))


def _build(size: str, sdpa: bool) -> Built:
    cfg = pick(size, CONFIGS)

    def make() -> Built:
        model = reinit_norms(VisionTransformer(cfg, sdpa))
        return model, (torch.randn(1, 3, cfg.frames, cfg.resolution, cfg.resolution),)

    return seeded(7, make)


def build(size: str = "bench") -> Built:
    """VideoMAE ViT encoder (explicit softmax attention) and a 1 x 3 x T x H x W clip."""
    return _build(size, sdpa=False)


def build_sdpa(size: str = "bench") -> Built:
    """The same encoder with ``F.scaled_dot_product_attention``."""
    return _build(size, sdpa=True)
