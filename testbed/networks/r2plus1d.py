"""R(2+1)D-18 (Tran et al., "A Closer Look at Spatiotemporal Convolutions", 2018), after torchvision's ``r2plus1d_18``.

What is kept: torchvision's ``VideoResNet`` with ``R2Plus1dStem`` (Conv3d (1, 7, 7) s(1, 2, 2) to 45
channels, BN, ReLU, Conv3d (3, 1, 1) to 64, BN, ReLU), four stages of two ``BasicBlock`` each, every 3-D
conv a ``Conv2Plus1D`` ((1, 3, 3) spatial conv to ``midplanes``, BN, ReLU, (3, 1, 1) temporal conv, the
stride split between them), ``midplanes = in*out*27 // (in*9 + 3*out)`` as torchvision computes it, a
1x1x1 strided Conv3d + BN downsample where the shape changes, in-place residual add + ReLU,
AdaptiveAvgPool3d(1), flatten, fc.

What is simplified at "bench" ("full" is ``r2plus1d_18`` on its 16 x 112 x 112 clip): channel widths scaled by
``width`` (0.5 at "bench": 32..256 instead of 64..512, stem 22 -> 32), and the clip is 8 x 64 x 64 instead of
16 x 112 x 112.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from testbed.networks._common import Built, pick, reinit_norms, seeded


@dataclass(frozen=True)
class R2Plus1DConfig:
    width: float
    frames: int
    resolution: int
    layers: tuple[int, ...] = (2, 2, 2, 2)
    num_classes: int = 400


CONFIGS = {
    "bench": R2Plus1DConfig(width=0.5, frames=8, resolution=64),
    # one block a layer keeps both kinds (layer 1: identity skip; later: strided, with a downsample)
    "test": R2Plus1DConfig(width=0.125, frames=4, resolution=32, layers=(1, 1, 1, 1)),
    "full": R2Plus1DConfig(width=1.0, frames=16, resolution=112),
}


class Conv2Plus1D(nn.Sequential):
    """A 3x3x3 conv factorized into a (1, 3, 3) spatial conv, BN, ReLU and a (3, 1, 1) temporal conv."""

    def __init__(self, in_planes: int, out_planes: int, midplanes: int, stride: int = 1, padding: int = 1) -> None:
        super().__init__(
            nn.Conv3d(in_planes, midplanes, (1, 3, 3), stride=(1, stride, stride), padding=(0, padding, padding),
                      bias=False),
            nn.BatchNorm3d(midplanes),
            nn.ReLU(inplace=True),
            nn.Conv3d(midplanes, out_planes, (3, 1, 1), stride=(stride, 1, 1), padding=(padding, 0, 0), bias=False),
        )


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        midplanes = (inplanes * planes * 3 * 3 * 3) // (inplanes * 3 * 3 + 3 * planes)
        self.conv1 = nn.Sequential(Conv2Plus1D(inplanes, planes, midplanes, stride), nn.BatchNorm3d(planes),
                                   nn.ReLU(inplace=True))
        self.conv2 = nn.Sequential(Conv2Plus1D(planes, planes, midplanes), nn.BatchNorm3d(planes))
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x if self.downsample is None else self.downsample(x)
        out = self.conv2(self.conv1(x))
        out += residual
        return self.relu(out)


class R2Plus1dStem(nn.Sequential):
    """(1, 7, 7) spatial conv to 45 channels (scaled), then (3, 1, 1) temporal conv to the stem width."""

    def __init__(self, mid: int, out: int) -> None:
        super().__init__(
            nn.Conv3d(3, mid, (1, 7, 7), stride=(1, 2, 2), padding=(0, 3, 3), bias=False),
            nn.BatchNorm3d(mid),
            nn.ReLU(inplace=True),
            nn.Conv3d(mid, out, (3, 1, 1), stride=(1, 1, 1), padding=(1, 0, 0), bias=False),
            nn.BatchNorm3d(out),
            nn.ReLU(inplace=True),
        )


class VideoResNet(nn.Module):
    def __init__(self, cfg: R2Plus1DConfig) -> None:
        super().__init__()
        widths = [max(8, int(c * cfg.width)) for c in (64, 128, 256, 512)]
        self.inplanes = widths[0]
        self.stem = R2Plus1dStem(max(8, int(45 * cfg.width)), widths[0])
        self.layer1 = self._make_layer(widths[0], cfg.layers[0], stride=1)
        self.layer2 = self._make_layer(widths[1], cfg.layers[1], stride=2)
        self.layer3 = self._make_layer(widths[2], cfg.layers[2], stride=2)
        self.layer4 = self._make_layer(widths[3], cfg.layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool3d((1, 1, 1))
        self.fc = nn.Linear(widths[3], cfg.num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv3d(self.inplanes, planes, 1, stride=(stride, stride, stride), bias=False),
                                       nn.BatchNorm3d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.avgpool(x)
        return self.fc(x.flatten(1))


def build(size: str = "bench") -> Built:
    """R(2+1)D-18-structured network and a 1 x 3 x T x H x W clip."""
    cfg = pick(size, CONFIGS)

    def make() -> Built:
        return reinit_norms(VideoResNet(cfg)), (torch.randn(1, 3, cfg.frames, cfg.resolution, cfg.resolution),)

    return seeded(2, make)
