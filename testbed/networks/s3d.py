"""S3D (Xie et al., "Rethinking Spatiotemporal Feature Learning", 2018), following torchvision's ``s3d``.

What is kept: every separable 3-D convolution is a (1, k, k) spatial Conv3d + BatchNorm3d + ReLU followed
by a (k, 1, 1) temporal Conv3d + BatchNorm3d + ReLU (``TemporalSeparableConv``); the stem (k7 s2), the
1x1x1 conv, the k3 separable conv, the (1, 3, 3) / (3, 3, 3) / (2, 2, 2) max pools in torchvision's order;
the nine four-branch ``SepInceptionBlock3D`` blocks (1x1x1; 1x1x1 -> separable k3; 1x1x1 -> separable
k3; MaxPool3d k3 s1 -> 1x1x1, concatenated on channels); BatchNorm3d(eps=1e-3); the AvgPool3d over the
final volume, the 1x1x1 Conv3d classifier and the mean over (2, 3, 4).

What is simplified at "bench" ("full" is torchvision's widths on a 16 x 224 x 224 clip): every channel count
is scaled by ``width`` (0.5 at "bench", rounded to multiples of 8) and the clip is 8 x 112 x 112 instead of 16
x 224 x 224 ("test" keeps one inception block per resolution); the AvgPool3d kernel is the final volume's size
(torchvision's (2, 7, 7) is that size at 16 x 224 x 224); dropout is inactive in eval mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from testbed.networks._common import Built, pick, reinit_norms, seeded

# torchvision's SepInceptionBlock3D arguments: in, b0_out, b1_mid, b1_out, b2_mid, b2_out, b3_out
INCEPTION = {
    "3b": (192, 64, 96, 128, 16, 32, 32),
    "3c": (256, 128, 128, 192, 32, 96, 64),
    "4b": (480, 192, 96, 208, 16, 48, 64),
    "4c": (512, 160, 112, 224, 24, 64, 64),
    "4d": (512, 128, 128, 256, 24, 64, 64),
    "4e": (512, 112, 144, 288, 32, 64, 64),
    "4f": (528, 256, 160, 320, 32, 128, 128),
    "5b": (832, 256, 160, 320, 32, 128, 128),
    "5c": (832, 384, 192, 384, 48, 128, 128),
}


@dataclass(frozen=True)
class S3DConfig:
    width: float
    frames: int
    resolution: int
    blocks: tuple[str, ...] = tuple(INCEPTION)  # which inception blocks to keep, in order
    num_classes: int = 400


CONFIGS = {
    "bench": S3DConfig(width=0.5, frames=8, resolution=112),
    # one inception block per resolution: the same ops, a third of the graph (lowering time is per node)
    "test": S3DConfig(width=0.125, frames=8, resolution=32, blocks=("3b", "4b", "5b")),
    "full": S3DConfig(width=1.0, frames=16, resolution=224),
}


class Conv3dNormActivation(nn.Sequential):
    """Conv3d (no bias) + BatchNorm3d(eps=1e-3) + ReLU, torchvision's ``ops.Conv3dNormActivation``."""

    def __init__(self, c_in: int, c_out: int, kernel: tuple[int, int, int], stride: tuple[int, int, int],
                 padding: tuple[int, int, int]) -> None:
        super().__init__(
            nn.Conv3d(c_in, c_out, kernel, stride=stride, padding=padding, bias=False),
            nn.BatchNorm3d(c_out, eps=0.001, momentum=0.001),
            nn.ReLU(inplace=True),
        )


def pointwise(c_in: int, c_out: int) -> Conv3dNormActivation:
    return Conv3dNormActivation(c_in, c_out, (1, 1, 1), (1, 1, 1), (0, 0, 0))


class TemporalSeparableConv(nn.Sequential):
    """(1, k, k) spatial conv then (k, 1, 1) temporal conv, each with BN + ReLU: S3D's separable conv."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, padding: int) -> None:
        super().__init__(
            Conv3dNormActivation(c_in, c_out, (1, kernel, kernel), (1, stride, stride), (0, padding, padding)),
            Conv3dNormActivation(c_out, c_out, (kernel, 1, 1), (stride, 1, 1), (padding, 0, 0)),
        )


class SepInceptionBlock3D(nn.Module):
    """Four branches concatenated on channels: 1x1x1, two separable k3 towers, max pool + 1x1x1."""

    def __init__(self, c_in: int, b0_out: int, b1_mid: int, b1_out: int, b2_mid: int, b2_out: int,
                 b3_out: int) -> None:
        super().__init__()
        self.branch0 = pointwise(c_in, b0_out)
        self.branch1 = nn.Sequential(pointwise(c_in, b1_mid), TemporalSeparableConv(b1_mid, b1_out, 3, 1, 1))
        self.branch2 = nn.Sequential(pointwise(c_in, b2_mid), TemporalSeparableConv(b2_mid, b2_out, 3, 1, 1))
        self.branch3 = nn.Sequential(nn.MaxPool3d((3, 3, 3), stride=1, padding=1), pointwise(c_in, b3_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat((self.branch0(x), self.branch1(x), self.branch2(x), self.branch3(x)), 1)


def _scaled(channels: int, width: float) -> int:
    return max(8, round(channels * width / 8) * 8)


def _inception(name: str, previous: str | None, width: float) -> SepInceptionBlock3D:
    """Block ``name`` with its outputs scaled, reading what ``previous`` (or the stem, if None) outputs."""
    c_in = _scaled(192, width) if previous is None else _outputs(previous, width)
    _, *channels = INCEPTION[name]
    return SepInceptionBlock3D(c_in, *(_scaled(c, width) for c in channels))


def _stage(names: list[str], previous: str | None, width: float) -> list[nn.Module]:
    """The inception blocks of one resolution, chained."""
    blocks: list[nn.Module] = []
    for name in names:
        blocks.append(_inception(name, previous, width))
        previous = name
    return blocks


def _outputs(name: str, width: float) -> int:
    _, b0, _, b1, _, b2, b3 = INCEPTION[name]
    return sum(_scaled(c, width) for c in (b0, b1, b2, b3))


class S3D(nn.Module):
    def __init__(self, cfg: S3DConfig) -> None:
        super().__init__()
        w = cfg.width
        stages = [[name for name in cfg.blocks if name.startswith(level)] for level in "345"]
        last = [stage[-1] for stage in stages]
        self.features = nn.Sequential(
            TemporalSeparableConv(3, _scaled(64, w), 7, 2, 3),
            nn.MaxPool3d((1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)),
            pointwise(_scaled(64, w), _scaled(64, w)),
            TemporalSeparableConv(_scaled(64, w), _scaled(192, w), 3, 1, 1),
            nn.MaxPool3d((1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)),
            *_stage(stages[0], None, w),
            nn.MaxPool3d((3, 3, 3), stride=(2, 2, 2), padding=(1, 1, 1)),
            *_stage(stages[1], last[0], w),
            nn.MaxPool3d((2, 2, 2), stride=(2, 2, 2), padding=(0, 0, 0)),
            *_stage(stages[2], last[1], w),
        )
        t, s = _final_volume(cfg.frames, cfg.resolution)
        self.avgpool = nn.AvgPool3d((t, s, s), stride=1)
        self.classifier = nn.Sequential(nn.Dropout(p=0.2), nn.Conv3d(_outputs(last[2], w), cfg.num_classes, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = self.classifier(x)
        return torch.mean(x, dim=(2, 3, 4))


def _final_volume(frames: int, resolution: int) -> tuple[int, int]:
    """(T, H) of the last feature map: time halves at the stem and two pools, space at five stages."""
    t = (frames + 1) // 2  # stem, temporal stride 2, padding 3, kernel 7
    t = (t - 1) // 2 + 1  # MaxPool3d k3 s2 p1
    t = t // 2  # MaxPool3d k2 s2
    s = resolution
    for _ in range(4):  # stem s2, two (1,3,3) s2 pools, the k3 s2 pool (all padded: ceil halving)
        s = (s - 1) // 2 + 1
    return max(t, 1), s // 2


def build(size: str = "bench") -> Built:
    """S3D-structured network and a 1 x 3 x T x H x W clip."""
    cfg = pick(size, CONFIGS)

    def make() -> Built:
        model = reinit_norms(S3D(cfg))
        # exported with a dynamic frame count, traced at a clip that leaves its last stage two frames or more
        model.dynamic_frames_example = cfg.frames * (1 if _final_volume(cfg.frames, cfg.resolution)[0] > 1 else 2)
        return model, (torch.randn(1, 3, cfg.frames, cfg.resolution, cfg.resolution),)

    return seeded(1, make)
