"""A causal video VAE decoder in the style of Wan 2.1's ``Decoder3d`` (with CogVideoX/LTX choices noted).

What is kept (Wan 2.1 ``wan/modules/vae.py``): ``CausalConv3d``, a Conv3d with no padding of its own
after an ``F.pad`` that puts all temporal padding in front (2 * pad frames) and pads space on both sides;
an RMS norm over channels with a learned gain (written with ``x.pow(2).mean(dim=1)`` and ``rsqrt`` as
LTX-Video's PixelNorm does; Wan's ``F.normalize(x) * sqrt(C)`` is the same function); SiLU; residual
blocks (norm, SiLU, causal conv k3, norm, SiLU, causal conv k3, plus a 1x1x1 causal conv shortcut where
the channels change); the middle block (residual, attention, residual) whose attention runs per frame
over H*W tokens (frames folded into the batch, norm, 1x1 Conv2d to q, k, v, single-head
``F.scaled_dot_product_attention``, 1x1 Conv2d projection, residual); up-blocks of residual blocks
followed by a resample; the head (norm, SiLU, causal conv to 3 channels).

Resampling, following the brief's "nearest in time and space": spatial upsampling as Wan's
``upsample2d`` (frames folded into the batch, ``nn.Upsample(scale_factor=2, mode="nearest-exact")``,
Conv2d k3 halving the channels); temporal upsampling by nearest interpolation of the 5-D tensor
(``F.interpolate(scale_factor=(2, 1, 1))``, as CogVideoX's ``compress_time`` does for the frames after
the first) followed by a causal conv, instead of Wan's ``time_conv`` + reshape.

What is simplified: no feature cache (Wan decodes chunk by chunk with a cache of the last frames; here
the whole latent clip is decoded at once, which is the same causal function); the first frame is not
treated apart when upsampling time; at "bench", widths (base 8 at "bench" instead of 96) and the latent
(16 x 2 x 6 x 6 -> a 3 x 8 x 48 x 48 clip) are reduced; "full" has Wan's widths and depth on a 16 x 2 x 16 x 16
latent (a 3 x 8 x 128 x 128 clip: Wan decodes 480p clips chunk by chunk, each chunk far larger).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from testbed.networks._common import Built, pick, seeded


@dataclass(frozen=True)
class VAEConfig:
    base: int
    mult: tuple[int, ...]  # channel multipliers, deepest first (the decoder's order)
    temporal_up: tuple[bool, ...]  # per up-stage: does it also double time?
    latent_frames: int
    latent_size: int
    z_dim: int = 16
    res_blocks: int = 1


CONFIGS = {
    "bench": VAEConfig(base=8, mult=(4, 4, 2, 1), temporal_up=(True, True, False), latent_frames=2,
                       latent_size=6),
    # one residual block a stage, one up-sampling in time and space and one in space only
    "test": VAEConfig(base=4, mult=(2, 2, 1), temporal_up=(True, False), latent_frames=2, latent_size=4,
                      res_blocks=0),
    # Wan 2.1's widths (96 x (4, 4, 2, 1)) and num_res_blocks=2 (three residual blocks an up-stage); a
    # 2 x 16 x 16 latent, an 8 x 128 x 128 clip (0.6 T multiply-adds; Wan decodes 480p chunk by chunk)
    "full": VAEConfig(base=96, mult=(4, 4, 2, 1), temporal_up=(True, True, False), latent_frames=2,
                      latent_size=16, res_blocks=2),
}


class CausalConv3d(nn.Conv3d):
    """Conv3d that sees only current and past frames: all temporal padding goes in front, by F.pad."""

    def __init__(self, c_in: int, c_out: int, kernel: int, padding: int = 0) -> None:
        super().__init__(c_in, c_out, kernel, padding=0)
        self._padding = (padding, padding, padding, padding, 2 * padding, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, self._padding))


class RMSNorm(nn.Module):
    """Per-position RMS norm over channels (dim 1), learned gain and bias."""

    def __init__(self, channels: int, images: bool = False, eps: float = 1e-6) -> None:
        super().__init__()
        shape = (channels, 1, 1) if images else (channels, 1, 1, 1)
        self.eps = eps
        self.gamma = nn.Parameter(1.0 + 0.1 * torch.randn(shape))
        self.bias = nn.Parameter(0.1 * torch.randn(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + self.eps) * self.gamma + self.bias


class ResidualBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.residual = nn.Sequential(
            RMSNorm(c_in), nn.SiLU(), CausalConv3d(c_in, c_out, 3, padding=1),
            RMSNorm(c_out), nn.SiLU(), CausalConv3d(c_out, c_out, 3, padding=1),
        )
        self.shortcut = CausalConv3d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shortcut(x) + self.residual(x)


def _frames_to_batch(x: torch.Tensor) -> torch.Tensor:
    """(B, C, T, H, W) -> (B*T, C, H, W), Wan's ``rearrange(x, 'b c t h w -> (b t) c h w')``."""
    b, c, t, h, w = x.shape
    return x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)


def _batch_to_frames(x: torch.Tensor, b: int) -> torch.Tensor:
    bt, c, h, w = x.shape
    return x.reshape(b, bt // b, c, h, w).permute(0, 2, 1, 3, 4)


class AttentionBlock(nn.Module):
    """Single-head self-attention over the H*W positions of each frame."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = RMSNorm(dim, images=True)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        b, c, t, h, w = x.shape
        x = self.norm(_frames_to_batch(x))
        q, k, v = self.to_qkv(x).reshape(b * t, 1, c * 3, h * w).permute(0, 1, 3, 2).contiguous().chunk(3, dim=-1)
        x = F.scaled_dot_product_attention(q, k, v)
        x = x.squeeze(1).permute(0, 2, 1).reshape(b * t, c, h, w)
        return _batch_to_frames(self.proj(x), b) + identity


class Upsample(nn.Module):
    """Double H and W (nearest-exact on frames, Conv2d halving channels) and optionally T (nearest + causal conv)."""

    def __init__(self, dim: int, temporal: bool) -> None:
        super().__init__()
        self.time_conv = CausalConv3d(dim, dim, 3, padding=1) if temporal else None
        self.spatial = nn.Sequential(nn.Upsample(scale_factor=2.0, mode="nearest-exact"),
                                     nn.Conv2d(dim, dim // 2, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.time_conv is not None:
            x = self.time_conv(F.interpolate(x, scale_factor=(2.0, 1.0, 1.0), mode="nearest"))
        return _batch_to_frames(self.spatial(_frames_to_batch(x)), x.shape[0])


class Decoder3d(nn.Module):
    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        dims = [cfg.base * m for m in cfg.mult]
        self.conv_in = CausalConv3d(cfg.z_dim, dims[0], 3, padding=1)
        self.middle = nn.Sequential(ResidualBlock(dims[0], dims[0]), AttentionBlock(dims[0]),
                                    ResidualBlock(dims[0], dims[0]))
        stages: list[nn.Module] = []
        c_in = dims[0]
        for i, c_out in enumerate(dims):
            if i > 0:
                c_in //= 2  # the previous stage's upsample halved the channels, as in Wan
            blocks: list[nn.Module] = [ResidualBlock(c_in if j == 0 else c_out, c_out)
                                       for j in range(cfg.res_blocks + 1)]
            if i < len(dims) - 1:
                blocks.append(Upsample(c_out, cfg.temporal_up[i]))
            stages.append(nn.Sequential(*blocks))
            c_in = c_out
        self.upsamples = nn.Sequential(*stages)
        self.head = nn.Sequential(RMSNorm(dims[-1]), nn.SiLU(), CausalConv3d(dims[-1], 3, 3, padding=1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.head(self.upsamples(self.middle(self.conv_in(z))))


def build(size: str = "bench") -> Built:
    """Video-VAE decoder and a 1 x 16 x T x h x w latent."""
    cfg = pick(size, CONFIGS)

    def make() -> Built:
        z = torch.randn(1, cfg.z_dim, cfg.latent_frames, cfg.latent_size, cfg.latent_size)
        return Decoder3d(cfg), (z,)

    return seeded(6, make)
