"""Qwen2-VL's vision tower (``Qwen2VisionTransformerPretrainedModel`` in Hugging Face transformers).

What is kept: the input is the processor's flattened patches, one row of 3 x 2 x 14 x 14 values per
patch; ``PatchEmbed`` views each row as a (3, 2, 14, 14) volume and runs a bias-free Conv3d with
kernel = stride = (2, 14, 14) on it (so the conv's batch is the patch count), then views to (N, dim);
2-D rotary position embeddings (``VisionRotaryEmbedding`` frequencies for head_dim / 2, gathered per
patch by its (row, column) ids, which the processor orders in 2 x 2 merge windows) applied to q and k
with ``rotate_half`` in float32; the block-diagonal attention mask built from ``cu_seqlens`` by
``torch.full(finfo.min)`` and slice assignment; pre-norm blocks (LayerNorm eps 1e-6, fused qkv Linear,
scaled q @ k^T + mask, float32 softmax, projection; MLP with QuickGELU); ``PatchMerger`` (LayerNorm,
view 4 neighbouring patches as one row, Linear-GELU-Linear to the language model's width).

``build_dynamic`` (registered as ``qwen_vision_dyn``) is the same network exported with a dynamic
patch count (a multiple of 4, up to 4x the example's), as a runtime that takes images of any size needs;
the builder's model carries the spec in ``export_dynamic_shapes``.

What is simplified: one image per call, so ``cu_seqlens`` is [0, N] and the patch (row, column) ids are
an input computed by the caller (the processor knows ``grid_thw``; in transformers ``rot_pos_emb``
computes them in Python from it); at "bench", widths (256 instead of 1280, 4 heads, 4 blocks instead of 32 at
"bench") and a 224 x 224 image (16 x 16 patches); "full" is Qwen2-VL-2B's tower on the same image.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from testbed.networks._common import Built, pick, reinit_norms, seeded


@dataclass(frozen=True)
class QwenVisionConfig:
    embed_dim: int
    depth: int
    heads: int
    hidden_size: int  # the language model's width, what the merger projects to
    grid: int  # patches per side of the example image
    patch: int = 14
    temporal_patch: int = 2
    merge: int = 2
    max_grid: int = 64  # the largest (row, column) id the rotary table covers


CONFIGS = {
    "bench": QwenVisionConfig(embed_dim=256, depth=4, heads=4, hidden_size=512, grid=16),
    "test": QwenVisionConfig(embed_dim=32, depth=2, heads=2, hidden_size=64, grid=4),
    # Qwen2-VL-2B's tower (the 7B's differs only in hidden_size, 3584)
    "full": QwenVisionConfig(embed_dim=1280, depth=32, heads=16, hidden_size=1536, grid=16),
}


class PatchEmbed(nn.Module):
    def __init__(self, cfg: QwenVisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        kernel = (cfg.temporal_patch, cfg.patch, cfg.patch)
        self.proj = nn.Conv3d(3, cfg.embed_dim, kernel_size=kernel, stride=kernel, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        hidden_states = hidden_states.view(-1, 3, c.temporal_patch, c.patch, c.patch)
        return self.proj(hidden_states).view(-1, c.embed_dim)


class VisionRotaryEmbedding(nn.Module):
    def __init__(self, dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)))

    def forward(self, seqlen: int) -> torch.Tensor:
        inv_freq: torch.Tensor = self.inv_freq  # type: ignore[assignment]
        seq = torch.arange(seqlen, device=inv_freq.device, dtype=inv_freq.dtype)
        return torch.outer(seq, inv_freq)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb_vision(tensor: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    orig_dtype = tensor.dtype
    tensor = tensor.float()
    cos = freqs.cos().unsqueeze(1).repeat(1, 1, 2).unsqueeze(0).float()
    sin = freqs.sin().unsqueeze(1).repeat(1, 1, 2).unsqueeze(0).float()
    return ((tensor * cos) + (rotate_half(tensor) * sin)).to(orig_dtype)


class VisionAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, cu_seqlens: list[int], rotary_pos_emb: torch.Tensor) -> torch.Tensor:
        seq = x.shape[0]
        q, k, v = self.qkv(x).reshape(seq, 3, self.heads, -1).permute(1, 0, 2, 3).unbind(0)
        q = apply_rotary_pos_emb_vision(q.unsqueeze(0), rotary_pos_emb).squeeze(0)
        k = apply_rotary_pos_emb_vision(k.unsqueeze(0), rotary_pos_emb).squeeze(0)
        mask = torch.full([1, seq, seq], torch.finfo(q.dtype).min, dtype=q.dtype)
        for start, end in itertools.pairwise(cu_seqlens):
            mask[..., start:end, start:end] = 0
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        attn = torch.matmul(q, k.transpose(1, 2)) / (self.head_dim**0.5) + mask
        attn = F.softmax(attn, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(attn, v).transpose(0, 1).reshape(seq, -1)
        return self.proj(out)


class QuickGELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class VisionBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = VisionAttention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), QuickGELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, cu_seqlens: list[int], rotary_pos_emb: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cu_seqlens, rotary_pos_emb)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    def __init__(self, dim: int, context_dim: int, merge: int) -> None:
        super().__init__()
        self.hidden = context_dim * merge**2
        self.ln_q = nn.LayerNorm(context_dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(self.hidden, self.hidden), nn.GELU(), nn.Linear(self.hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.hidden))


class Qwen2VisionTransformer(nn.Module):
    def __init__(self, cfg: QwenVisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.rotary_pos_emb = VisionRotaryEmbedding(cfg.embed_dim // cfg.heads // 2)
        self.blocks = nn.ModuleList(VisionBlock(cfg.embed_dim, cfg.heads) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg.hidden_size, cfg.embed_dim, cfg.merge)

    def forward(self, pixel_values: torch.Tensor, pos_ids: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(pixel_values)
        rotary_pos_emb = self.rotary_pos_emb(self.cfg.max_grid)[pos_ids].flatten(1)
        cu_seqlens = [0, x.shape[0]]
        for block in self.blocks:
            x = block(x, cu_seqlens, rotary_pos_emb)
        return self.merger(x)


def patch_position_ids(t: int, h: int, w: int, merge: int = 2) -> torch.Tensor:
    """(row, column) of every patch in the processor's order (2 x 2 merge windows), as ``rot_pos_emb``."""
    hpos = torch.arange(h).unsqueeze(1).expand(-1, w)
    hpos = hpos.reshape(h // merge, merge, w // merge, merge).permute(0, 2, 1, 3).flatten()
    wpos = torch.arange(w).unsqueeze(0).expand(h, -1)
    wpos = wpos.reshape(h // merge, merge, w // merge, merge).permute(0, 2, 1, 3).flatten()
    return torch.stack([hpos, wpos], dim=-1).repeat(t, 1)


def _example(cfg: QwenVisionConfig) -> tuple[torch.Tensor, torch.Tensor]:
    patches = cfg.grid * cfg.grid
    pixel_values = torch.randn(patches, 3 * cfg.temporal_patch * cfg.patch * cfg.patch)
    return pixel_values, patch_position_ids(1, cfg.grid, cfg.grid, cfg.merge)


def _patch_count(cfg: QwenVisionConfig) -> tuple[dict[int, object], dict[int, object]]:
    """Dynamic shapes for a dynamic patch count: a multiple of 4 (the merge windows), up to 4x the example's."""
    windows = torch.export.Dim("merge_windows", min=1, max=cfg.grid * cfg.grid)  # N = 4 * windows
    patches = cfg.merge**2 * windows
    return {0: patches}, {0: patches}


def build(size: str = "bench") -> Built:
    """Qwen2-VL vision tower and one image's patches with their (row, column) ids.

    The tower has no batch dim (one image per call): what varies from call to call is the patch count,
    so that is what ``network_report --batch dynamic`` makes dynamic (``model.dynamic_batch_shapes``).
    """
    cfg = pick(size, CONFIGS)

    def make() -> Built:
        return reinit_norms(Qwen2VisionTransformer(cfg)), _example(cfg)

    model, inputs = seeded(8, make)
    model.dynamic_batch_shapes = _patch_count(cfg)  # type: ignore[assignment]
    return model, inputs


def build_dynamic(size: str = "bench") -> Built:
    """The same tower, always exported with a dynamic patch count (``model.export_dynamic_shapes``)."""
    model, inputs = build(size)
    model.export_dynamic_shapes = _patch_count(pick(size, CONFIGS))  # type: ignore[assignment]
    return model, inputs
