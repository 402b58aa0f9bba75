"""Rewrite every 3-D transposed convolution as 2-D transposed convolutions that XNNPACK delegates.

Invariant established: no 3-D transposed convolution with a parameter weight and static shapes is left;
each is replaced by view/permute/slice ops and ``conv_transpose2d``, none above 6 dims.

Tap ``j`` of input frame ``i`` lands on output frame ``i*stride - padding + j*dilation``. Two forms, each
one ``conv_transpose2d`` over H and W (so one rounding when it is quantized, as the original op has):

* **taps tile depth** (depth stride == kernel depth, the usual 2x upsampler): no two taps land on the
  same frame; the frames go to the batch, the taps to the output channels, and a permute puts them in
  place. Without groups the output channels are ordered (tap, channel), so that the output frames are
  a view of the conv's output ``(D, kd*C, H, W)`` as ``(D*kd, C, H, W)``, the layout of the 3-D convs
  around it (``xnnguard.rewrite.layout`` then concatenates a UNet's skip there, not in (N, C, D, H, W));
* **general**: along depth a transposed convolution is a correlation over the input with ``stride - 1``
  zero frames inserted after each frame and ``(k - 1)*dilation - padding`` zero frames in front
  (``+ output_padding`` behind), with the taps in reverse order. The zero frames come from a constant
  pad, and every output frame then reads the same taps, which fold into the input channels of one
  ``conv_transpose2d`` over all output frames (``xnnguard.rewrite.conv3d.tap_folding``). The overlap-add
  of the taps is part of its contraction: no partial result is ever rounded.

Over a dynamic frame count (static batch, groups 1), **frames as rows**
(``xnnguard.rewrite.conv3d.dynamic_depth.transposed_frames_as_rows``): W's columns go to the batch, (D, H)
is the plane of one ``conv_transpose2d`` whose output channels are the W taps, and a permute (taps that
tile W, the 2x upsampler) or a linear against a 0/1 matrix (any other; in int8 it rounds each tap's
result first, which the quantizer's report says) adds each tap into its output column.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from xnnguard.rewrite.conv3d.dynamic_depth import (
    taps_tile_width,
    transposed_frames_as_rows,
    transposed_rows_weight,
    width_overlap_add,
)
from xnnguard.rewrite.conv3d.operands import ConvOperands, conv_arguments
from xnnguard.rewrite.conv3d.spliced_conv import Activation, SplicedConvPass
from xnnguard.rewrite.conv3d.tap_folding import fold_frames, fold_transposed_taps
from xnnguard.rewrite.size_args import Triple, triple
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
    dynamic_depth: bool = False  # input_shape[2] then stands in for a symbolic depth: frames as rows

    @property
    def taps_tile_width(self) -> bool:
        """Over dynamic frames: each output column gets one W tap of one input column (a permute places them)."""
        return taps_tile_width(self.weight_shape[4], self.stride[2], self.dilation[2], self.output_padding[2])

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
    arguments = conv_arguments(node, allow_dynamic_batch=True, allow_dynamic_depth=True)
    if isinstance(arguments, str):
        return arguments
    kwargs = arguments.kwargs
    if isinstance(kwargs.get("padding", 0), str):
        return f"padding={kwargs['padding']!r}"
    if arguments.dynamic_depth and int(kwargs.get("groups", 1)) != 1:  # type: ignore[call-overload]
        return "grouped over dynamic frames: the frames-as-rows form takes one group"
    return ConvTranspose3dGeometry(
        arguments.input_shape,
        arguments.weight_shape,
        triple(kwargs.get("stride", 1)),
        triple(kwargs.get("padding", 0)),
        triple(kwargs.get("output_padding", 0)),
        triple(kwargs.get("dilation", 1)),
        int(kwargs.get("groups", 1)),  # type: ignore[call-overload]
        arguments.dynamic_depth,
    )


def conv_transpose2d_constants(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    geometry: ConvTranspose3dGeometry,
) -> list[torch.Tensor]:
    """The constants ``conv_transpose3d_as_2d`` reads: the 2-D weight, then the bias if there is one.

    Computed ahead of time because XNNPACK and pt2e need a conv's weight to be a parameter.
    """
    c_in, c_out_g, kd, kh, kw = weight.shape
    if geometry.dynamic_depth:
        rows = transposed_rows_weight(weight)
        if geometry.taps_tile_width:
            return [rows] + ([bias.repeat(kw)] if bias is not None else [])
        _, w = geometry.input_shape[2], geometry.input_shape[4]
        overlap = width_overlap_add(w, kw, geometry.stride[2], geometry.padding[2], geometry.dilation[2],
                                    geometry.output_padding[2], weight.dtype)
        return [rows, overlap] + ([bias.clone()] if bias is not None else [])
    if geometry.taps_tile_depth and geometry.groups == 1:  # output channels (tap, channel): frames in order
        folded = weight.permute(0, 2, 1, 3, 4).reshape(c_in, kd * c_out_g, kh, kw)
        return [folded] + ([bias.repeat(kd)] if bias is not None else [])
    if geometry.taps_tile_depth:  # a group's output channels lie together: (group, channel, tap)
        folded = weight.reshape(c_in, c_out_g * kd, kh, kw)
        return [folded] + ([bias.repeat_interleave(kd)] if bias is not None else [])
    return [fold_transposed_taps(weight, geometry.groups)] + ([bias.clone()] if bias is not None else [])


def _zero_inserted(frames: torch.Tensor, geometry: ConvTranspose3dGeometry) -> torch.Tensor:
    """Frames (N, D, F) with ``stride - 1`` zero frames after each and the borders of the correlation.

    The front border is ``(k - 1)*dilation - padding`` zero frames, the back one that plus the output
    padding; a negative border crops instead. Zeros from a constant pad: exact in int8 too.
    """
    _, d, f = frames.shape
    kd, sd, pd, od, dd = (geometry.weight_shape[2], geometry.stride[0], geometry.padding[0],
                          geometry.output_padding[0], geometry.dilation[0])
    if sd > 1:  # (N, D, 1, F) padded to (N, D, sd, F): each frame, then sd - 1 zero frames
        frames = F.pad(frames.reshape(-1, d, 1, f), (0, 0, 0, sd - 1)).reshape(-1, d * sd, f)
    front = (kd - 1) * dd - pd
    back = front + od - (sd - 1)  # the zero-insertion already put sd - 1 frames behind the last one
    if front < 0:
        frames = frames[:, -front:]
    if back < 0:
        frames = frames[:, : frames.shape[1] + back]
    if front > 0 or back > 0:
        frames = F.pad(frames, (0, 0, max(front, 0), max(back, 0)))
    return frames


def conv_transpose3d_as_2d(
    x: torch.Tensor,
    constants: Sequence[torch.Tensor],
    geometry: ConvTranspose3dGeometry,
    activation: Activation | None = None,
) -> torch.Tensor:
    """``activation(conv_transpose3d(x, weight, bias))`` with one ``conv_transpose2d`` and views (traced
    by the rewrite). ``constants`` is ``conv_transpose2d_constants(weight, bias, geometry)``.
    """
    if geometry.dynamic_depth:
        tile = geometry.taps_tile_width
        return transposed_frames_as_rows(
            x, constants[0], constants[1] if tile and len(constants) > 1 else None, None if tile else constants[1],
            constants[2] if not tile and len(constants) > 2 else None, geometry.weight_shape[2:],
            geometry.stride, geometry.padding, geometry.output_padding, geometry.dilation, activation)
    _, c_in, d, h, w = geometry.input_shape  # the batch stays as the graph has it: -1 in every reshape
    _, _, kd, _, _ = geometry.weight_shape
    _, c_out, do, ho, wo = geometry.output_shape
    _, sh, sw = geometry.stride
    pd, ph, pw = geometry.padding
    _, oh, ow = geometry.output_padding
    dd, dh, dw = geometry.dilation
    bias = constants[1] if len(constants) > 1 else None
    if geometry.taps_tile_depth:
        frames = x.permute(0, 2, 1, 3, 4).reshape(-1, c_in, h, w)
        y = F.conv_transpose2d(frames, constants[0], bias, (sh, sw), (ph, pw), (oh, ow), geometry.groups, (dh, dw))
        y = activation(y) if activation is not None else y
        if geometry.groups == 1:  # each input frame's taps are its output frames, in order: a view of them
            frames = y.reshape(-1, c_out, ho, wo)
            y = frames.reshape(-1, d * kd, c_out, ho, wo).permute(0, 2, 1, 3, 4)
        else:
            y = y.reshape(-1, d, c_out, kd, ho * wo).permute(0, 2, 1, 3, 4).reshape(-1, c_out, d * kd, ho, wo)
        return y if pd == 0 else y[:, :, pd : pd + do]
    frames = _zero_inserted(x.permute(0, 2, 1, 3, 4).reshape(-1, d, c_in * h * w), geometry)
    taps = [frames[:, j * dd : j * dd + do] for j in range(kd)]
    folded = fold_frames(taps, c_in, geometry.groups, h, w)
    y = F.conv_transpose2d(folded, constants[0], bias, (sh, sw), (ph, pw), (oh, ow), geometry.groups, (dh, dw))
    y = activation(y) if activation is not None else y
    return y.reshape(-1, do, c_out, ho, wo).permute(0, 2, 1, 3, 4)


class RewriteConvTranspose3dPass(SplicedConvPass[ConvTranspose3dGeometry]):
    """Replaces each 3-D transposed convolution by 2-D ones; what it cannot replace it tags and reports."""

    kind = ConvKind.CONV_TRANSPOSE3D
    subject = "3-D transposed convolution"

    def geometry(self, node: torch.fx.Node) -> ConvTranspose3dGeometry | str:
        return conv_transpose3d_geometry(node)

    def quantization_note(self, node: torch.fx.Node) -> str | None:
        geometry = conv_transpose3d_geometry(node)
        if not isinstance(geometry, ConvTranspose3dGeometry) or not geometry.dynamic_depth or geometry.taps_tile_width:
            return None
        return ("over dynamic frames its W taps are added by a linear after the conv_transpose2d, and quantization "
                "rounds each tap's result to int8 first; export with static frames, or a W stride equal to its kernel")

    def constants(
        self, operands: ConvOperands, geometry: ConvTranspose3dGeometry, activation: Activation | None
    ) -> list[torch.Tensor]:
        return conv_transpose2d_constants(operands.weight, operands.bias, geometry)

    def compute(
        self,
        x: torch.Tensor,
        constants: Sequence[torch.Tensor],
        geometry: ConvTranspose3dGeometry,
        activation: Activation | None,
    ) -> torch.Tensor:
        return conv_transpose3d_as_2d(x, constants, geometry, activation)
