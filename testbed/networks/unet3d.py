"""3-D UNets for volumetric segmentation, in the two common styles.

``build`` (registered as ``unet3d``) follows nnU-Net's ``PlainConvUNet`` (Isensee et al., 2021) as
``dynamic_network_architectures`` builds it for 3d_fullres: per stage two (Conv3d k3 + InstanceNorm3d
(affine, eps 1e-5) + LeakyReLU(0.01)) with the first conv of every stage after the first strided by 2
(downsampling by strided conv, no pooling); a decoder of ConvTranspose3d (kernel = stride = 2), skip
concatenation and two conv blocks per stage; a 1x1x1 Conv3d segmentation head on the last stage (deep
supervision off, as at inference).

``build_gn`` (registered as ``unet3d_gn``) follows MONAI's ``BasicUNet`` wiring with the other common
choices: Conv3d + GroupNorm(8) + PReLU, downsampling by strided conv, upsampling by nearest
``nn.Upsample(scale_factor=2)`` followed by a Conv3d, skip concatenation.

What is simplified at "bench" ("full" is nnU-Net's 3d_fullres plan, six stages of 32..320 channels on a
128^3 patch, for both styles): 4 stages with 8..64 channels at "bench" (nnU-Net: 6 stages, 32..320) and a 1 x 1 x
16 x 32 x 32 volume instead of a 128^3 patch; no anisotropic first-stage kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from testbed.networks._common import Built, pick, reinit_norms, seeded


@dataclass(frozen=True)
class UNetConfig:
    features: tuple[int, ...]
    depth: int
    resolution: int
    in_channels: int = 1
    num_classes: int = 3


CONFIGS = {
    "bench": UNetConfig(features=(8, 16, 32, 64), depth=16, resolution=32),
    # three stages: the same blocks, skips and up-sampling at every level as four
    "test": UNetConfig(features=(4, 8, 16), depth=8, resolution=16),
    # nnU-Net's 3d_fullres plan for an isotropic volume: six stages, 32..320 channels, a 128^3 patch
    "full": UNetConfig(features=(32, 64, 128, 256, 320, 320), depth=128, resolution=128),
}

NormAct = Callable[[int], list[nn.Module]]


def instance_leaky(channels: int) -> list[nn.Module]:
    """nnU-Net's norm and nonlinearity."""
    return [nn.InstanceNorm3d(channels, eps=1e-5, affine=True), nn.LeakyReLU(0.01, inplace=True)]


def group_prelu(channels: int) -> list[nn.Module]:
    """GroupNorm + PReLU, the MONAI-style alternative."""
    return [nn.GroupNorm(min(8, channels), channels), nn.PReLU()]


class ConvBlock(nn.Sequential):
    """Conv3d k3 (stride 1 or 2) + norm + nonlinearity, then the same at stride 1."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm_act: NormAct) -> None:
        super().__init__(
            nn.Conv3d(c_in, c_out, 3, stride=stride, padding=1), *norm_act(c_out),
            nn.Conv3d(c_out, c_out, 3, stride=1, padding=1), *norm_act(c_out),
        )


def transposed_up(c_in: int, c_out: int) -> nn.Module:
    """nnU-Net's upsampling: ConvTranspose3d, kernel = stride = 2, no bias."""
    return nn.ConvTranspose3d(c_in, c_out, 2, stride=2, bias=False)


def nearest_up(c_in: int, c_out: int) -> nn.Module:
    """Nearest ``Upsample(scale_factor=2)`` then a k3 Conv3d to the skip's channels."""
    return nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv3d(c_in, c_out, 3, padding=1))


class UNet3d(nn.Module):
    def __init__(self, cfg: UNetConfig, norm_act: NormAct, up: Callable[[int, int], nn.Module]) -> None:
        super().__init__()
        f = cfg.features
        self.encoder = nn.ModuleList(
            ConvBlock(cfg.in_channels if i == 0 else f[i - 1], f[i], 1 if i == 0 else 2, norm_act)
            for i in range(len(f)))
        self.upsample = nn.ModuleList(up(f[i], f[i - 1]) for i in range(len(f) - 1, 0, -1))
        self.decoder = nn.ModuleList(ConvBlock(2 * f[i - 1], f[i - 1], 1, norm_act) for i in range(len(f) - 1, 0, -1))
        self.seg = nn.Conv3d(f[0], cfg.num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for stage in self.encoder:
            x = stage(x)
            skips.append(x)
        x = skips.pop()
        for up, stage in zip(self.upsample, self.decoder):
            x = stage(torch.cat((up(x), skips.pop()), dim=1))
        return self.seg(x)


def _build(size: str, norm_act: NormAct, up: Callable[[int, int], nn.Module], seed: int) -> Built:
    cfg = pick(size, CONFIGS)

    def make() -> Built:
        model = reinit_norms(UNet3d(cfg, norm_act, up))
        return model, (torch.randn(1, cfg.in_channels, cfg.depth, cfg.resolution, cfg.resolution),)

    return seeded(seed, make)


def build(size: str = "bench") -> Built:
    """nnU-Net-style 3-D UNet (InstanceNorm3d, LeakyReLU, ConvTranspose3d) and a 1 x 1 x D x H x W volume."""
    return _build(size, instance_leaky, transposed_up, seed=4)


def build_gn(size: str = "bench") -> Built:
    """MONAI-style 3-D UNet (GroupNorm, PReLU, nearest Upsample + conv) and a 1 x 1 x D x H x W volume."""
    return _build(size, group_prelu, nearest_up, seed=5)
