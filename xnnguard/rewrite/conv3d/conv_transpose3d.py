"""Rewrite every 3-D transposed convolution as 2-D transposed convolutions that XNNPACK delegates.

Invariant established: no 3-D transposed convolution with a parameter weight and static shapes is left;
each is replaced by view/permute/slice ops and ``conv_transpose2d``, none above 6 dims.

The frames go to the batch and the kernel's depth taps to the output channels of one
``conv_transpose2d``: tap ``j`` of input frame ``i`` lands on output frame ``i*stride - padding +
j*dilation``. Where no two taps land on the same frame (depth stride == kernel depth, the usual 2x
upsampler) putting them in place is a permute. Otherwise the overlap-add along depth is itself a 1-D
transposed convolution with a one-hot weight (tap ``j`` -> output ``j``), run as a tiny
``conv_transpose2d`` over every (channel, pixel) column: it does the strides, the padding, the output
padding and the dilation along depth exactly as PyTorch does, with no bookkeeping here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from xnnguard.rewrite.conv3d.conv_input_cat import as_cat
from xnnguard.rewrite.conv3d.operands import ConvOperands, conv_arguments
from xnnguard.rewrite.conv3d.size_args import Triple, triple
from xnnguard.rewrite.conv3d.spliced_conv import SplicedConvPass
from xnnguard.rules.conv3d import ConvKind

__all__ = [
    "ConvTranspose3dGeometry",
    "RewriteConvTranspose3dPass",
    "conv_transpose2d_constants",
    "conv_transpose3d_as_2d",
    "conv_transpose3d_geometry",
]

logger = logging.getLogger("xnnguard.rewrite")


@dataclass(frozen=True)
class ConvTranspose3dGeometry:
    input_shape: tuple[int, int, int, int, int]
    weight_shape: tuple[int, int, int, int, int]  # (C_in, C_out / groups, kd, kh, kw)
    stride: Triple
    padding: Triple
    output_padding: Triple
    dilation: Triple
    groups: int

    @property
    def output_shape(self) -> tuple[int, int, int, int, int]:
        sizes = [
            (self.input_shape[2 + d] - 1) * self.stride[d]
            - 2 * self.padding[d]
            + self.dilation[d] * (self.weight_shape[2 + d] - 1)
            + self.output_padding[d]
            + 1
            for d in range(3)
        ]
        return (self.input_shape[0], self.weight_shape[1] * self.groups, sizes[0], sizes[1], sizes[2])

    @property
    def taps_tile_depth(self) -> bool:
        """Each output frame gets exactly one tap of one input frame: placing them is a permute."""
        kd = self.weight_shape[2]
        return self.stride[0] == kd and (self.dilation[0] == 1 or kd == 1) and self.output_padding[0] == 0


def conv_transpose3d_geometry(node: torch.fx.Node) -> ConvTranspose3dGeometry | str:
    """The geometry of the 3-D transposed convolution ``node``, or why it cannot be rewritten."""
    arguments = conv_arguments(node)
    if isinstance(arguments, str):
        return arguments
    kwargs = arguments.kwargs
    if isinstance(kwargs.get("padding", 0), str):
        return f"padding={kwargs['padding']!r}"
    return ConvTranspose3dGeometry(
        arguments.input_shape,
        arguments.weight_shape,
        triple(kwargs.get("stride", 1)),
        triple(kwargs.get("padding", 0)),
        triple(kwargs.get("output_padding", 0)),
        triple(kwargs.get("dilation", 1)),
        int(kwargs.get("groups", 1)),  # type: ignore[call-overload]
    )


def conv_transpose2d_constants(
    weight: torch.Tensor, bias: torch.Tensor | None, geometry: ConvTranspose3dGeometry
) -> list[torch.Tensor]:
    """The constants ``conv_transpose3d_as_2d`` reads: [2-D weight, bias or depth weight, (bias)].

    Computed ahead of time because XNNPACK and pt2e need a conv's weight to be a parameter.
    """
    c_in, c_out_g, kd, kh, kw = weight.shape
    folded = weight.reshape(c_in, c_out_g * kd, kh, kw)  # output channels ordered (channel, tap)
    if geometry.taps_tile_depth:
        return [folded] + ([bias.repeat_interleave(kd)] if bias is not None else [])
    one_hot = torch.eye(kd, dtype=weight.dtype).reshape(kd, 1, kd, 1)
    c_out = c_out_g * geometry.groups
    return [folded, one_hot] + ([bias.reshape(1, c_out, 1, 1, 1)] if bias is not None else [])


def conv_transpose3d_as_2d(
    x: torch.Tensor, constants: Sequence[torch.Tensor], geometry: ConvTranspose3dGeometry
) -> torch.Tensor:
    """``conv_transpose3d(x, weight, bias)`` with ``conv_transpose2d`` and views (traced by the rewrite).

    ``constants`` is ``conv_transpose2d_constants(weight, bias, geometry)``.
    """
    n, c_in, d, h, w = geometry.input_shape
    _, _, kd, _, _ = geometry.weight_shape
    _, c_out, do, ho, wo = geometry.output_shape
    sd, sh, sw = geometry.stride
    pd, ph, pw = geometry.padding
    od, oh, ow = geometry.output_padding
    dd, dh, dw = geometry.dilation
    frames = as_cat(x.permute(0, 2, 1, 3, 4).reshape(n * d, c_in, h, w))
    if geometry.taps_tile_depth:
        bias = constants[1] if len(constants) > 1 else None
        y = F.conv_transpose2d(frames, constants[0], bias, (sh, sw), (ph, pw), (oh, ow), geometry.groups, (dh, dw))
        y = y.reshape(n, d, c_out, kd, ho * wo).permute(0, 2, 1, 3, 4).reshape(n, c_out, d * kd, ho, wo)
        return y if pd == 0 else y[:, :, pd : pd + do]
    y = F.conv_transpose2d(frames, constants[0], None, (sh, sw), (ph, pw), (oh, ow), geometry.groups, (dh, dw))
    columns = y.reshape(n, d, c_out, kd, ho * wo).permute(0, 2, 4, 3, 1).reshape(n * c_out * ho * wo, kd, d, 1)
    columns = as_cat(columns)
    depth = F.conv_transpose2d(columns, constants[1], None, (sd, 1), (pd, 0), (od, 0), 1, (dd, 1))
    y = depth.reshape(n, c_out, ho * wo, do).permute(0, 1, 3, 2).reshape(n, c_out, do, ho, wo)
    return y + constants[2] if len(constants) > 2 else y


class RewriteConvTranspose3dPass(SplicedConvPass[ConvTranspose3dGeometry]):
    """Replaces each 3-D transposed convolution by 2-D ones; what it cannot replace it tags and reports."""

    kind = ConvKind.CONV_TRANSPOSE3D
    subject = "3-D transposed convolution"

    def geometry(self, node: torch.fx.Node) -> ConvTranspose3dGeometry | str:
        return conv_transpose3d_geometry(node)

    def constants(self, operands: ConvOperands, geometry: ConvTranspose3dGeometry) -> list[torch.Tensor]:
        return conv_transpose2d_constants(operands.weight, operands.bias, geometry)

    def compute(
        self, x: torch.Tensor, constants: Sequence[torch.Tensor], geometry: ConvTranspose3dGeometry
    ) -> torch.Tensor:
        return conv_transpose3d_as_2d(x, constants, geometry)
