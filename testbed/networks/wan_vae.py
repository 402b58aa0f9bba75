"""Wan 2.1's causal video VAE decoder (``wan/modules/vae.py``, ``Decoder3d``), written as Wan writes it.

``video_vae`` follows the same design with other choices (an RMS norm as ``pow(2).mean`` and ``rsqrt``,
temporal upsampling by interpolation); this module keeps Wan's own code, so its idioms are there as users
export them:

* ``RMS_norm``: ``F.normalize(x, dim=1) * sqrt(C) * gamma + bias``, where ``F.normalize`` divides by the
  clamped 2-norm ``expand_as(x)``;
* ``CausalConv3d``: a Conv3d without padding of its own after ``F.pad`` with all temporal padding in front;
* ``Upsample``: ``nn.Upsample(scale_factor=(2., 2.), mode="nearest-exact")`` on ``x.float()`` cast back
  with ``type_as``, on the frames folded into the batch (``rearrange 'b c t h w -> (b t) c h w'``);
* ``Resample("upsample3d")``: ``time_conv`` (a causal (3, 1, 1) conv to twice the channels), the result
  viewed as ``(b, 2, c, t, h, w)`` and the two halves ``torch.stack``-ed after the frames, which doubles
  time (what Wan's cached decode does for every chunk after the first);
* ``AttentionBlock``: per frame, ``to_qkv`` 1x1 Conv2d, ``reshape(b*t, 1, 3c, -1).permute(0, 1, 3, 2)
  .contiguous().chunk(3, -1)``, single-head ``F.scaled_dot_product_attention``, ``squeeze(1).permute``;
* ``ResidualBlock``: norm, SiLU, causal conv, norm, SiLU, dropout, causal conv, plus a 1x1x1 shortcut.

What is simplified: no feature cache (the whole latent clip decodes at once: the same causal function for
the frames after the first; Wan treats the first latent frame apart, keeping it at one output frame);
widths and the latent size are reduced. ``unpatchify`` and the ``conv2``/``clamp`` of ``WanVAE.decode`` are
left out: they are not the decoder's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from testbed.networks._common import Built, pick, reinit_norms, seeded


@dataclass(frozen=True)
class WanVAEConfig:
    dim: int
    z_dim: int
    dim_mult: tuple[int, ...]
    num_res_blocks: int
    temporal_upsample: tuple[bool, ...]
    latent_frames: int
    latent_size: int


CONFIGS = {
    # Wan 2.1: dim 96, z_dim 16, dim_mult (1, 2, 4, 4), 2 res blocks, temporal (False, True, True) reversed
    "bench": WanVAEConfig(dim=8, z_dim=16, dim_mult=(1, 2, 4, 4), num_res_blocks=1,
                          temporal_upsample=(True, True, False), latent_frames=2, latent_size=6),
    "test": WanVAEConfig(dim=4, z_dim=4, dim_mult=(1, 2, 2), num_res_blocks=0,
                         temporal_upsample=(True, False), latent_frames=2, latent_size=4),
    # the published decoder; a latent of 3 frames at 32x32 decodes to 9 frames of 256x256
    "full": WanVAEConfig(dim=96, z_dim=16, dim_mult=(1, 2, 4, 4), num_res_blocks=2,
                         temporal_upsample=(True, True, False), latent_frames=3, latent_size=32),
}


class CausalConv3d(nn.Conv3d):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._padding = (self.padding[2], self.padding[2], self.padding[1], self.padding[1],  # type: ignore[misc]
                         2 * self.padding[0], 0)  # type: ignore[misc]
        self.padding = (0, 0, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, self._padding))


class RMS_norm(nn.Module):
    def __init__(self, dim: int, channel_first: bool = True, images: bool = True, bias: bool = False) -> None:
        super().__init__()
        broadcastable_dims = (1, 1, 1) if not images else (1, 1)
        shape = (dim, *broadcastable_dims) if channel_first else (dim,)
        self.channel_first = channel_first
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape)) if bias else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=(1 if self.channel_first else -1)) * self.scale * self.gamma + self.bias


class Upsample(nn.Upsample):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.float()).type_as(x)


def _frames_in_batch(x: torch.Tensor) -> torch.Tensor:
    """``rearrange(x, 'b c t h w -> (b t) c h w')``."""
    b, c, t, h, w = x.shape
    return x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)


def _frames_out_of_batch(x: torch.Tensor, t: int) -> torch.Tensor:
    """``rearrange(x, '(b t) c h w -> b c t h w', t=t)``."""
    bt, c, h, w = x.shape
    return x.reshape(bt // t, t, c, h, w).permute(0, 2, 1, 3, 4)


class Resample(nn.Module):
    def __init__(self, dim: int, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.resample = nn.Sequential(Upsample(scale_factor=(2.0, 2.0), mode="nearest-exact"),
                                      nn.Conv2d(dim, dim // 2, 3, padding=1))
        if mode == "upsample3d":
            self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.size()
        if self.mode == "upsample3d":
            x = self.time_conv(x)
            x = x.reshape(b, 2, c, t, h, w)
            x = torch.stack((x[:, 0, :, :, :, :], x[:, 1, :, :, :, :]), 3)
            x = x.reshape(b, c, t * 2, h, w)
        t = x.shape[2]
        x = self.resample(_frames_in_batch(x))
        return _frames_out_of_batch(x, t)


class ResidualBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.residual = nn.Sequential(
            RMS_norm(in_dim, images=False), nn.SiLU(), CausalConv3d(in_dim, out_dim, 3, padding=1),
            RMS_norm(out_dim, images=False), nn.SiLU(), nn.Dropout(dropout),
            CausalConv3d(out_dim, out_dim, 3, padding=1))
        self.shortcut = CausalConv3d(in_dim, out_dim, 1) if in_dim != out_dim else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.residual(x) + self.shortcut(x)


class AttentionBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = RMS_norm(dim)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        b, c, t, h, w = x.size()
        x = self.norm(_frames_in_batch(x))
        q, k, v = self.to_qkv(x).reshape(b * t, 1, c * 3, -1).permute(0, 1, 3, 2).contiguous().chunk(3, dim=-1)
        x = F.scaled_dot_product_attention(q, k, v)
        x = x.squeeze(1).permute(0, 2, 1).reshape(b * t, c, h, w)
        return _frames_out_of_batch(self.proj(x), t) + identity


class Decoder3d(nn.Module):
    def __init__(self, cfg: WanVAEConfig) -> None:
        super().__init__()
        dims = [cfg.dim * u for u in [cfg.dim_mult[-1], *cfg.dim_mult[::-1]]]
        self.conv1 = CausalConv3d(cfg.z_dim, dims[0], 3, padding=1)
        self.middle = nn.Sequential(ResidualBlock(dims[0], dims[0]), AttentionBlock(dims[0]),
                                    ResidualBlock(dims[0], dims[0]))
        upsamples: list[nn.Module] = []
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):  # noqa: RUF007 (Wan's words)
            if i >= 1:  # the previous resample halved the channels
                in_dim = in_dim // 2
            for _ in range(cfg.num_res_blocks + 1):
                upsamples.append(ResidualBlock(in_dim, out_dim))
                in_dim = out_dim
            if i != len(cfg.dim_mult) - 1:
                mode = "upsample3d" if cfg.temporal_upsample[i] else "upsample2d"
                upsamples.append(Resample(out_dim, mode=mode))
        self.upsamples = nn.Sequential(*upsamples)
        self.head = nn.Sequential(RMS_norm(out_dim, images=False), nn.SiLU(), CausalConv3d(out_dim, 3, 3, padding=1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.head(self.upsamples(self.middle(self.conv1(z))))


def _perturbed(model: nn.Module) -> nn.Module:
    """Random gains and biases of the RMS norms (fresh ones are 1 and 0), as a trained decoder has."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, RMS_norm):
                module.gamma.uniform_(0.5, 1.5)
    return reinit_norms(model)


def build(size: str = "bench") -> Built:
    """Wan 2.1's decoder at ``size``: ``(model, (latent,))``, a latent of (1, z_dim, T, S, S)."""
    cfg = pick(size, CONFIGS)

    def make() -> Built:
        model = _perturbed(Decoder3d(cfg))
        latent = torch.randn(1, cfg.z_dim, cfg.latent_frames, cfg.latent_size, cfg.latent_size)
        return model, (latent,)

    return seeded(7, make)
