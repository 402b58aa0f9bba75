"""MViT-v2-S (Li et al., "MViTv2", 2022), following torchvision's ``mvit_v2_s`` op for op.

What is kept: the Conv3d patch stem (3, 7, 7) / (2, 4, 4); a class token and no absolute position
embedding; pooling attention whose Q, K and V are each pooled by a depthwise Conv3d (3, 3, 3) with a
LayerNorm after it (the class token split off with ``tensor_split`` and concatenated back); K/V pooled
with stride (1, 8, 8) at the first stage, halved at each stage; Q pooled by (1, 2, 2) at the first block
of a stage, whose attention also widens the channels (``proj_after_attn``); decomposed relative position
embeddings added to the scores (``_add_rel_pos``: two 6-D einsums, a temporal matmul and an 8-D
broadcast sum, added in place into ``attn[:, :, 1:, 1:]``); residual pooling (``x[:, :, 1:] += q[:, :, 1:]``);
a MaxPool3d skip at the pooled blocks; pre-norm blocks with a GELU MLP; LayerNorm and a class-token head.

What is simplified at "bench" ("full" is ``mvit_v2_s`` itself): widths (48 instead of 96 at the first stage),
depths ((1, 2, 3, 1) instead of (1, 2, 11, 2)) and resolution (8 x 96 x 96 instead of 16 x 224 x 224); dropout
and stochastic depth are inactive in eval mode and left out; the relative position tables always match the
scores, so torchvision's ``_interpolate`` of them (a no-op at the trained resolution) is left out too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from testbed.networks._common import Built, Mlp, pick, reinit_norms, seeded

Thw = tuple[int, int, int]


@dataclass(frozen=True)
class MViTConfig:
    dims: tuple[int, ...]
    depths: tuple[int, ...]
    heads: tuple[int, ...]
    frames: int
    resolution: int
    num_classes: int = 400


CONFIGS = {
    "bench": MViTConfig(dims=(48, 96, 192, 384), depths=(1, 2, 3, 1), heads=(1, 2, 4, 8), frames=8, resolution=96),
    # one block per stage keeps both block kinds (stage 1: neither pooling Q nor widening; later: both)
    "test": MViTConfig(dims=(16, 32, 64), depths=(1, 1, 1), heads=(1, 2, 2), frames=4, resolution=64),
    "full": MViTConfig(dims=(96, 192, 384, 768), depths=(1, 2, 11, 2), heads=(1, 2, 4, 8), frames=16,
                       resolution=224),
}


@dataclass(frozen=True)
class BlockConfig:
    """One ``MultiscaleBlock``: torchvision's per-block lists, one entry each."""

    input_channels: int
    output_channels: int
    num_heads: int
    stride_q: Thw
    stride_kv: Thw
    kernel: Thw = (3, 3, 3)


def _prod(values: tuple[int, ...]) -> int:
    return math.prod(values)


class Pool(nn.Module):
    """Pool the tokens (all but the class token) of a (B, heads, N, C) tensor as a 3-D volume, then norm."""

    def __init__(self, pool: nn.Module, norm: nn.Module | None) -> None:
        super().__init__()
        self.pool = pool
        self.norm = norm

    def forward(self, x: torch.Tensor, thw: Thw) -> tuple[torch.Tensor, Thw]:
        squeeze = x.dim() == 3
        if squeeze:
            x = x.unsqueeze(1)
        class_token, x = torch.tensor_split(x, indices=(1,), dim=2)
        x = x.transpose(2, 3)
        b, n, c = x.shape[:3]
        x = x.reshape((b * n, c, *thw)).contiguous()
        x = self.pool(x)
        t, h, w = x.shape[2:]
        x = x.reshape(b, n, c, -1).transpose(2, 3)
        x = torch.cat((class_token, x), dim=2)
        if self.norm is not None:
            x = self.norm(x)
        if squeeze:
            x = x.squeeze(1)
        return x, (t, h, w)


def _rel_distance(q_size: int, k_size: int) -> torch.Tensor:
    """Index into a relative-position table for every (query, key) pair, scaled when q and k differ in size."""
    q_ratio = max(k_size / q_size, 1.0)
    k_ratio = max(q_size / k_size, 1.0)
    return torch.arange(q_size)[:, None] * q_ratio - (torch.arange(k_size)[None, :] + (1.0 - k_size)) * k_ratio


def _add_rel_pos(attn: torch.Tensor, q: torch.Tensor, q_thw: Thw, k_thw: Thw, rel_pos_h: torch.Tensor,
                 rel_pos_w: torch.Tensor, rel_pos_t: torch.Tensor) -> torch.Tensor:
    """Add decomposed (t, h, w) relative position terms to the token-token scores, as torchvision does."""
    q_t, q_h, q_w = q_thw
    k_t, k_h, k_w = k_thw
    rh = rel_pos_h[_rel_distance(q_h, k_h).long()]
    rw = rel_pos_w[_rel_distance(q_w, k_w).long()]
    rt = rel_pos_t[_rel_distance(q_t, k_t).long()]
    b, n_head, _, dim = q.shape
    r_q = q[:, :, 1:].reshape(b, n_head, q_t, q_h, q_w, dim)
    rel_h_q = torch.einsum("bythwc,hkc->bythwk", r_q, rh)
    rel_w_q = torch.einsum("bythwc,wkc->bythwk", r_q, rw)
    r_q = r_q.permute(2, 0, 1, 3, 4, 5).reshape(q_t, b * n_head * q_h * q_w, dim)
    rel_q_t = torch.matmul(r_q, rt.transpose(1, 2)).transpose(0, 1)
    rel_q_t = rel_q_t.view(b, n_head, q_h, q_w, q_t, k_t).permute(0, 1, 4, 2, 3, 5)
    rel_pos = (
        rel_h_q[:, :, :, :, :, None, :, None]
        + rel_w_q[:, :, :, :, :, None, None, :]
        + rel_q_t[:, :, :, :, :, :, None, None]
    ).reshape(b, n_head, q_t * q_h * q_w, k_t * k_h * k_w)
    attn[:, :, 1:, 1:] += rel_pos
    return attn


class MultiscaleAttention(nn.Module):
    """Pooling attention with relative position embeddings and residual pooling (MViTv2)."""

    def __init__(self, input_size: list[int], embed_dim: int, output_dim: int, num_heads: int,
                 kernel_q: Thw, kernel_kv: Thw, stride_q: Thw, stride_kv: Thw) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.output_dim = output_dim
        self.head_dim = output_dim // num_heads
        self.scaler = 1.0 / math.sqrt(self.head_dim)
        self.qkv = nn.Linear(embed_dim, 3 * output_dim)
        self.project = nn.Sequential(nn.Linear(output_dim, output_dim))
        self.pool_q = self._pool(kernel_q, stride_q) if _prod(kernel_q) > 1 or _prod(stride_q) > 1 else None
        pool_kv = _prod(kernel_kv) > 1 or _prod(stride_kv) > 1
        self.pool_k = self._pool(kernel_kv, stride_kv) if pool_kv else None
        self.pool_v = self._pool(kernel_kv, stride_kv) if pool_kv else None
        size = max(input_size[1:])
        spatial_dim = 2 * max(size // stride_q[1], size // stride_kv[1]) - 1
        self.rel_pos_h = nn.Parameter(torch.randn(spatial_dim, self.head_dim) * 0.02)
        self.rel_pos_w = nn.Parameter(torch.randn(spatial_dim, self.head_dim) * 0.02)
        self.rel_pos_t = nn.Parameter(torch.randn(2 * input_size[0] - 1, self.head_dim) * 0.02)

    def _pool(self, kernel: Thw, stride: Thw) -> Pool:
        """Depthwise Conv3d over each head's channels, then LayerNorm: MViTv2's conv pooling."""
        padding = tuple(k // 2 for k in kernel)
        conv = nn.Conv3d(self.head_dim, self.head_dim, kernel, stride=stride, padding=padding,  # type: ignore[arg-type]
                         groups=self.head_dim, bias=False)
        return Pool(conv, nn.LayerNorm(self.head_dim))

    def forward(self, x: torch.Tensor, thw: Thw) -> tuple[torch.Tensor, Thw]:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).transpose(1, 3).unbind(dim=2)
        k_thw = thw
        if self.pool_k is not None and self.pool_v is not None:
            k, k_thw = self.pool_k(k, thw)
            v = self.pool_v(v, thw)[0]
        if self.pool_q is not None:
            q, thw = self.pool_q(q, thw)
        attn = torch.matmul(self.scaler * q, k.transpose(2, 3))
        attn = _add_rel_pos(attn, q, thw, k_thw, self.rel_pos_h, self.rel_pos_w, self.rel_pos_t)
        attn = attn.softmax(dim=-1)
        x = torch.matmul(attn, v)
        x[:, :, 1:, :] += q[:, :, 1:, :]  # residual pooling, class token excluded (residual_with_cls_embed=False)
        x = x.transpose(1, 2).reshape(b, -1, self.output_dim)
        return self.project(x), thw


class MultiscaleBlock(nn.Module):
    """Pre-norm block: pooled attention with a (max-pooled, projected) skip, then the MLP."""

    def __init__(self, input_size: list[int], cnf: BlockConfig) -> None:
        super().__init__()
        self.pool_skip: Pool | None = None
        if _prod(cnf.stride_q) > 1:
            kernel_skip = tuple(s + 1 if s > 1 else s for s in cnf.stride_q)
            padding_skip = tuple(k // 2 for k in kernel_skip)
            self.pool_skip = Pool(nn.MaxPool3d(kernel_skip, stride=cnf.stride_q, padding=padding_skip), None)
        attn_dim = cnf.output_channels  # proj_after_attn=True in mvit_v2_s
        self.norm1 = nn.LayerNorm(cnf.input_channels)
        self.norm2 = nn.LayerNorm(attn_dim)
        self.attn = MultiscaleAttention(input_size, cnf.input_channels, attn_dim, cnf.num_heads, cnf.kernel,
                                        cnf.kernel, cnf.stride_q, cnf.stride_kv)
        self.mlp = Mlp(attn_dim, 4 * attn_dim, cnf.output_channels)
        self.project = (nn.Linear(cnf.input_channels, cnf.output_channels)
                        if cnf.input_channels != cnf.output_channels else None)

    def forward(self, x: torch.Tensor, thw: Thw) -> tuple[torch.Tensor, Thw]:
        x_norm1 = self.norm1(x)
        x_attn, thw_new = self.attn(x_norm1, thw)
        x = x if self.project is None else self.project(x_norm1)
        x_skip = x if self.pool_skip is None else self.pool_skip(x, thw)[0]
        x = x_skip + x_attn
        return x + self.mlp(self.norm2(x)), thw_new


def block_configs(cfg: MViTConfig) -> list[BlockConfig]:
    """torchvision's per-block lists for mvit_v2_s, generated from stage widths and depths.

    The first block of each later stage pools Q by (1, 2, 2), widens to the stage's channels and halves
    the K/V stride, exactly where mvit_v2_s's config does.
    """
    blocks = []
    stride_kv = 8
    for stage, (dim, depth, heads) in enumerate(zip(cfg.dims, cfg.depths, cfg.heads)):
        for index in range(depth):
            first = stage > 0 and index == 0
            if first:
                stride_kv = max(stride_kv // 2, 1)
            blocks.append(BlockConfig(
                input_channels=cfg.dims[stage - 1] if first else dim, output_channels=dim, num_heads=heads,
                stride_q=(1, 2, 2) if first else (1, 1, 1), stride_kv=(1, stride_kv, stride_kv)))
    return blocks


class MViT(nn.Module):
    """Conv3d patch stem, class token, multiscale blocks, LayerNorm, class-token head."""

    def __init__(self, cfg: MViTConfig) -> None:
        super().__init__()
        self.conv_proj = nn.Conv3d(3, cfg.dims[0], (3, 7, 7), stride=(2, 4, 4), padding=(1, 3, 3))
        self.class_token = nn.Parameter(torch.randn(cfg.dims[0]) * 0.02)
        input_size = [cfg.frames // 2, cfg.resolution // 4, cfg.resolution // 4]
        self.blocks = nn.ModuleList()
        for cnf in block_configs(cfg):
            self.blocks.append(MultiscaleBlock(input_size, cnf))
            input_size = [size // stride for size, stride in zip(input_size, cnf.stride_q)]
        self.norm = nn.LayerNorm(cfg.dims[-1])
        self.head = nn.Sequential(nn.Linear(cfg.dims[-1], cfg.num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x)
        thw = (x.shape[2], x.shape[3], x.shape[4])
        x = x.flatten(2).transpose(1, 2)
        class_token = self.class_token.expand(x.size(0), -1).unsqueeze(1)
        x = torch.cat((class_token, x), dim=1)
        for block in self.blocks:
            x, thw = block(x, thw)
        x = self.norm(x)
        return self.head(x[:, 0])


def build(size: str = "bench") -> Built:
    """MViT-v2-S-structured network and a 1 x 3 x T x H x W clip."""
    cfg = pick(size, CONFIGS)

    def make() -> Built:
        model = reinit_norms(MViT(cfg))
        return model, (torch.randn(1, 3, cfg.frames, cfg.resolution, cfg.resolution),)

    return seeded(0, make)
