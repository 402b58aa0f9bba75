"""A zero pad of depth, height and width in front of a 3-D convolution is taken as the convolution's padding.

Causal video convs (Wan's and CogVideoX's ``CausalConv3d``) pad with ``F.pad`` (all temporal padding in
front, space on both sides) and convolve without padding of their own. Left as an op, that pad is one more
copy of the activations per conv, a 5-D one ExecuTorch runs in NCHW, and in an int8 program it runs in
float: the stock quantizer annotates no pad, so the conv's quantize comes after it. Taken into the
conv's geometry (padding per side), the 2-D form pads where it pads anyway: H and W become the conv2d's
own padding (no copy) and the depth the zero frames of its taps, which share the quantization of the
conv's input. Zeros are what the conv's own padding adds, so the result is the same to the last bit in
float, and an int8 program keeps its one rounding, the quantize of the conv's input.
"""

from __future__ import annotations

import dataclasses

import torch

from xnnguard.graph.pads import zero_pad_widths
from xnnguard.rewrite.conv3d.operands import Padding3d, Shape5

__all__ = ["AbsorbedPad", "absorbed_pad"]


@dataclasses.dataclass(frozen=True)
class AbsorbedPad:
    """The zero pad in front of a 3-D convolution: its input node and its widths as (front, back) per D, H, W."""

    source: torch.fx.Node
    padding: Padding3d

    def widen(self, padding: Padding3d) -> Padding3d:
        """``padding`` with this pad's widths added side by side."""
        return tuple((a + c, b + d) for (a, b), (c, d) in zip(padding, self.padding))  # type: ignore[return-value]

    def unpadded(self, shape: Shape5, dynamic_depth: bool) -> Shape5:
        """The convolution's input ``shape`` without this pad (a dynamic depth's stand-in stays as it is)."""
        n, c, *spatial = shape
        sizes = [size if dim == 0 and dynamic_depth else size - sum(self.padding[dim])
                 for dim, size in enumerate(spatial)]
        return (n, c, sizes[0], sizes[1], sizes[2])


def absorbed_pad(conv: torch.fx.Node) -> AbsorbedPad | None:
    """The zero pad that 3-D convolution ``conv`` reads, when it pads only D, H and W, by non-negative widths.

    A pad of the channels or the batch, or a crop (negative widths), is left as it is.
    """
    pad = conv.args[0] if conv.args else conv.kwargs.get("input")
    widths = zero_pad_widths(pad)
    if widths is None or len(widths) > 6 or any(width < 0 for width in widths):
        return None
    assert isinstance(pad, torch.fx.Node)
    source = pad.args[0]
    if not isinstance(source, torch.fx.Node):
        return None
    value = source.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dim() != 5:
        return None
    padded = list(widths) + [0] * (6 - len(widths))  # (W, H, D), before and after each
    padding = ((padded[4], padded[5]), (padded[2], padded[3]), (padded[0], padded[1]))
    return AbsorbedPad(source, padding)
