"""A convolution's depth taps folded into channels: the sum over taps becomes part of one 2-D convolution.

A 3-D convolution sums, for each output frame, a 2-D convolution of each tap's input frame with that
tap's 2-D weight. Concatenating those input frames along the channels, and the taps' weights along the
weight's input channels in the same order, makes the sum part of the contraction of one 2-D
convolution (and of one rounding when it is quantized). With groups, the order is (group, tap, channel),
so that each group still reads its own channels.
"""

from __future__ import annotations

import torch

__all__ = ["as_frames", "fold_frames", "fold_taps", "fold_transposed_taps"]


def as_frames(t: torch.Tensor, channels: int, h: int, w: int) -> torch.Tensor:
    """Tap frames, ``(A, count, C*h*w)`` or already ``(count, C, h, w)``, as ``(A*count, C, h, w)``.

    Frames already 4-D are returned as they are, not through a view of the same shape: ExecuTorch 1.5.1
    takes every view out of NHWC.
    """
    return t if t.dim() == 4 else t.reshape(-1, channels, h, w)


def fold_frames(tap_frames: list[torch.Tensor], channels: int, groups: int, h: int, w: int) -> torch.Tensor:
    """Tap frames (A, count, C*h*w) -> 2-D conv input (A*count, taps*C, h, w), channels (group, tap, C).

    Without groups, the tap frames may also be 4-D ``(count, C, h, w)`` already (one clip's).

    ``channels`` is C, the channels of one frame; the frames' count stays as the graph has it (a dynamic
    batch too). Without groups, the taps are concatenated along the channel dim of 4-D tensors.
    """
    taps = len(tap_frames)
    if taps == 1:
        return as_frames(tap_frames[0], channels, h, w)
    if groups == 1:
        return torch.cat([as_frames(t, channels, h, w) for t in tap_frames], 1)
    grouped = [t.reshape(-1, groups, channels // groups * h * w) for t in tap_frames]
    return torch.cat(grouped, 2).reshape(-1, taps * channels, h, w)


def fold_taps(weight: torch.Tensor, taps: range) -> torch.Tensor:
    """Conv weight (O, C/g, kd, kh, kw) -> (O, len(taps)*C/g, kh, kw), input channels (tap, channel)."""
    part = weight[:, :, taps.start : taps.stop]
    return part.permute(0, 2, 1, 3, 4).reshape(weight.shape[0], -1, weight.shape[3], weight.shape[4])


def fold_transposed_taps(weight: torch.Tensor, groups: int) -> torch.Tensor:
    """Transposed-conv weight (C, O/g, kd, kh, kw) -> (C*kd, O/g, kh, kw), rows (group, tap, channel).

    The taps come last first: as a correlation over the zero-inserted input, output frame ``t`` reads
    tap ``kd - 1 - j`` at frame ``t + j`` (``xnnguard.rewrite.conv3d.conv_transpose3d``).
    """
    c_in, c_out_g, kd, kh, kw = weight.shape
    flipped = weight.flip(2).reshape(groups, c_in // groups, c_out_g, kd, kh, kw)
    return flipped.permute(0, 3, 1, 2, 4, 5).reshape(c_in * kd, c_out_g, kh, kw)
