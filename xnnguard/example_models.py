"""Small models that stock ExecuTorch 1.5.1 lowers to XNNPACK without a word and then cannot run right.

Used by ``make demo``, the tests and the benchmarks. Each builder returns ``(model, example_inputs)``.
"""

from __future__ import annotations

import torch

__all__ = [
    "Conv2dReLU",
    "Conv3dReLU",
    "ConvTranspose3dModel",
    "HighRankLinear",
    "LinearModel",
    "Patchify",
    "PermuteAdd",
    "Video3dCNN",
    "VideoPatchEmbed",
]


class Patchify(torch.nn.Module):
    """A vision "patchify": an 8-D reshape + permute, then back to 3-D (the seed's model)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.reshape(2, 6, 8, 2, 16, 8, 2, 16).permute(0, 2, 5, 3, 6, 1, 4, 7)
        return y.reshape(2, 64, -1) * 2

    @staticmethod
    def example_inputs() -> tuple[torch.Tensor, ...]:
        return (torch.randn(2, 6, 16, 32, 128),)


class PermuteAdd(torch.nn.Module):
    """A permute of a rank-``rank`` tensor followed by an add: 6-D is fine for XNNPACK, 7-D is not."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        order = [0, *reversed(range(1, self.rank))]
        return x.permute(*order) + 1.0

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        return (torch.randn(*([2, 3] * 5)[: self.rank]),)


class LinearModel(torch.nn.Module):
    """A Linear (optionally with a ReLU) on whatever rank its input has."""

    def __init__(self, in_features: int = 16, out_features: int = 8, relu: bool = False) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return torch.relu(y) if self.relu else y


class HighRankLinear(LinearModel):
    """A Linear on an 8-D input."""

    @staticmethod
    def example_inputs() -> tuple[torch.Tensor, ...]:
        return (torch.randn(2, 1, 2, 3, 1, 2, 3, 16),)


class Conv2dReLU(torch.nn.Module):
    def __init__(self, relu: bool = True) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return torch.relu(y) if self.relu else y

    @staticmethod
    def example_inputs() -> tuple[torch.Tensor, ...]:
        return (torch.randn(1, 3, 16, 16),)


class Conv3dReLU(torch.nn.Module):
    """A video-style Conv3d + ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))

    @staticmethod
    def example_inputs() -> tuple[torch.Tensor, ...]:
        return (torch.randn(1, 3, 4, 8, 8),)


class ConvTranspose3dModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.deconv = torch.nn.ConvTranspose3d(4, 2, 2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.deconv(x)

    @staticmethod
    def example_inputs() -> tuple[torch.Tensor, ...]:
        return (torch.randn(1, 4, 2, 4, 4),)


class Video3dCNN(torch.nn.Module):
    """An R3D/S3D-style stem: Conv3d + BatchNorm3d + ReLU + MaxPool3d, a stride-2 Conv3d, AvgPool3d.

    Stock 1.5.1 cannot run any of it: XNNPACK has no 3-D convolution or pooling and the portable
    kernels have neither.
    """

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv3d(3, 8, (3, 5, 5), stride=(1, 2, 2), padding=(1, 2, 2), bias=False)
        self.bn = torch.nn.BatchNorm3d(8)
        self.pool = torch.nn.MaxPool3d((1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))
        self.conv = torch.nn.Conv3d(8, 16, 3, stride=2, padding=1)
        self.head = torch.nn.AvgPool3d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.bn(self.stem(x))))
        return self.head(torch.relu(self.conv(x)))

    @staticmethod
    def example_inputs() -> tuple[torch.Tensor, ...]:
        return (torch.randn(1, 3, 4, 32, 32),)


class VideoPatchEmbed(torch.nn.Module):
    """A Conv3d over a clip, then a video patchify through an 8-D view, then a linear per patch.

    Stock ExecuTorch fails on both halves: the 8-D permute at load, the Conv3d when run.
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(3, 8, 3, padding=1)
        self.proj = torch.nn.Linear(256, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))  # (1, 8, 4, 16, 16)
        patches = y.reshape(1, 8, 2, 2, 4, 4, 4, 4).permute(0, 2, 4, 6, 3, 5, 7, 1)  # 8-D
        return self.proj(patches.reshape(1, 32, 256))

    @staticmethod
    def example_inputs() -> tuple[torch.Tensor, ...]:
        return (torch.randn(1, 3, 4, 16, 16),)
