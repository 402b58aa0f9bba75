"""Rewrite every 3-D convolution as 2-D convolutions (or one linear) that XNNPACK delegates.

Invariant established: no 3-D (non-transposed) convolution with a parameter weight and static shapes is
left in the graph; each one is replaced by an equivalent graph of ops XNNPACK delegates (view, permute,
slice, cat, conv2d or linear), none above 6 dims. XNNPACK has no 3-D convolution and 1.5.1's portable
convolution has none either, so without this a video model cannot run at all.

Three forms, cheapest first:

* **one patch** (the input is exactly one kernel window, e.g. Qwen2-VL's patch embedding): a linear;
* **temporal** (a (k, 1, 1) kernel with spatial stride 1 and no spatial padding: the temporal half of
  R(2+1)D's and S3D's separable convs, and every 1x1x1 conv): one conv2d with a (k, 1) kernel. With a
  batch of 1 it runs over (D, W) with the rows H as its batch, on (H, C, D, W): one 4-D permute away
  from the frames-in-the-batch layout (D, C, H, W) of the spatial convs around it, which XNNPACK runs as
  one transpose of whole rows, in NHWC (``xnnguard.rewrite.layout`` leaves just that permute between
  them). Otherwise it runs over (D, H*W), on the input as it is laid out: only views around it;
* **depth tiles** (depth stride == kernel depth, no depth padding, no dilation; also kernel depth 1 with
  stride 1): one 6-D permute folds each window's frames into channels, then one conv2d;
* **general**: the depth padding becomes zero frames (a constant pad, exact also in int8), so that every
  output frame reads every tap; the tap frames are then folded into channels (``fold``, default: one
  conv2d over all output frames, with the whole weight) or convolved one by one and summed (``sum``).
  One conv2d with the whole weight is what keeps quantization as the original op has it: one weight
  quantization and one output rounding (frames at the borders taken apart with fewer taps would each
  get a weight of their own, quantized to other scales). With one clip and depth stride 1 the frames
  stay a 4-D ``(D, C, H, W)`` tensor from the input to the conv2d (``Conv3dGeometry.frames_stay_4d``):
  ExecuTorch then runs the zero frames, the taps' slices and their concatenation in NHWC, where the
  conv2d reads them, and a norm and a LeakyReLU between two such convs stay there too
  (``xnnguard.rewrite.norm.frames_layout``): the 3-D UNet's data no longer leaves NHWC from one conv
  to the next (at 128^3, float: 19 % of the forward was transposes, 4 % after).

Every form keeps a dynamic batch (its reshapes say -1 for it). A dynamic depth (frame count), with a static
batch, keeps the frames a whole spatial dim of one conv2d, which XNNPACK sizes at run time
(``xnnguard.rewrite.conv3d.dynamic_depth``): a (k, 1, 1) kernel is the temporal form with the frames
inferred, a kernel of depth 1 is **frames along height** (each frame's rows after the last one's), any
other is **frames as rows** (the taps along W as channels). Height and width must be static.

Padding modes other than zeros never reach this pass: export spells them as a pad op in front of a conv
without padding. A zero pad of D, H and W in front of a conv (a causal conv's ``F.pad``) is taken as the
conv's padding (``xnnguard.rewrite.conv3d.absorbed_pad``). A conv2d's input is what its form computes,
with no copy for quantization's sake: where 1.5.1 would lay out the wrong tensor for a dynamically
quantized conv, ``xnnguard.XNNPACKQuantizer`` gives it a ``cat`` input
(``xnnguard.quantizer.dynamic_conv_input``), in dynamic int8 only.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from xnnguard.rewrite.conv3d.absorbed_pad import absorbed_pad
from xnnguard.rewrite.conv3d.dynamic_depth import (
    HeightLayout,
    frames_along_height,
    frames_as_rows,
    height_layout,
    rows_weight,
    taps_along,
)
from xnnguard.rewrite.conv3d.operands import ConvOperands, Padding3d, conv_arguments
from xnnguard.rewrite.conv3d.spliced_conv import Activation, SplicedConvPass
from xnnguard.rewrite.conv3d.strided_select import select_every
from xnnguard.rewrite.conv3d.tap_folding import as_frames, fold_frames, fold_taps
from xnnguard.rewrite.size_args import triple
from xnnguard.rules.conv3d import ConvKind

__all__ = ["Conv3dGeometry", "RewriteConv3dPass", "conv2d_constants", "conv3d_as_conv2d", "conv3d_geometry"]

logger = logging.getLogger("xnnguard.rewrite")

DepthTaps = Literal["fold", "sum"]

_aten = torch.ops.aten


@dataclass(frozen=True)
class Conv3dGeometry:
    """Everything a rewrite needs to know about one 3-D convolution, with padding per side."""

    input_shape: tuple[int, int, int, int, int]
    weight_shape: tuple[int, int, int, int, int]
    stride: tuple[int, int, int]
    padding: Padding3d
    dilation: tuple[int, int, int]
    groups: int
    has_bias: bool = False
    dynamic_batch: bool = False  # input_shape[0] then stands in for a symbolic batch (every form keeps it)
    dynamic_depth: bool = False  # input_shape[2] then stands in for a symbolic depth (the dynamic_depth forms)

    @property
    def output_shape(self) -> tuple[int, int, int, int, int]:
        sizes = []
        for dim in range(3):
            extent = self.input_shape[2 + dim] + sum(self.padding[dim])
            window = self.dilation[dim] * (self.weight_shape[2 + dim] - 1) + 1
            sizes.append((extent - window) // self.stride[dim] + 1)
        return (self.input_shape[0], self.weight_shape[0], sizes[0], sizes[1], sizes[2])

    @property
    def form(self) -> str:
        if self.dynamic_depth:
            if self._is_temporal():
                return "temporal"
            if self.height_layout() is not None:
                return "frames along height"
            return "frames as rows"
        if self._is_one_patch():
            return "one patch"
        if self._is_temporal():
            return "temporal"
        if self._is_depth_tiles():
            return "depth tiles"
        return "general"

    def _is_one_patch(self) -> bool:
        no_padding = all(front == back == 0 for front, back in self.padding)
        kernel = self.weight_shape[2:]
        exact = all(self.input_shape[2 + d] < kernel[d] + self.stride[d] for d in range(3))
        return self.groups == 1 and no_padding and exact and all(
            self.dilation[d] == 1 or kernel[d] == 1 for d in range(3)
        )

    def _is_temporal(self) -> bool:
        """Only the depth is convolved: H and W pass through, so (H, W) can be one axis of a conv2d."""
        _, _, _, kh, kw = self.weight_shape
        no_spatial_padding = self.padding[1] == (0, 0) and self.padding[2] == (0, 0)
        return (kh, kw) == (1, 1) and self.stride[1:] == (1, 1) and no_spatial_padding

    def _is_depth_tiles(self) -> bool:
        kd = self.weight_shape[2]
        front, back = self.padding[0]
        no_depth_padding = front == 0 and (back == 0 or self.output_shape[2] * kd <= self.input_shape[2])
        return no_depth_padding and (self.dilation[0] == 1 or kd == 1) and self.stride[0] == kd

    def height_layout(self) -> HeightLayout | None:
        """For a dynamic depth: the layout of ``frames_along_height`` (a kernel of depth 1, depth stride 1,
        no depth padding), or None when it does not apply."""
        kd, kh = self.weight_shape[2:4]
        if kd != 1 or self.stride[0] != 1 or self.padding[0] != (0, 0):
            return None
        top, bottom = self.padding[1]
        return height_layout(self.input_shape[3], kh, self.stride[1], self.dilation[1], top, bottom)

    def frames_stay_4d(self) -> bool:
        """The general form's frames stay one 4-D ``(D, C, H, W)`` tensor from the input to the conv2d.

        ExecuTorch 1.5.1 runs a conv2d in NHWC and keeps the ops around it in NHWC as long as they are 4-D
        elementwise ops, slices, pads, cats or permutes; a reshape or any other rank goes back to NCHW, a
        transpose each way. With one clip (a static batch of 1) the frames are the conv2d's batch, so the
        zero frames, the taps' slices and their concatenation stay 4-D; so does the next conv's input when
        only such ops lie between them (``xnnguard.rewrite.norm.frames_layout``). A depth stride takes
        every other frame through a view, and groups interleave their channels through one: those keep the
        3-D form.
        """
        return self.input_shape[0] == 1 and not (self.dynamic_batch or self.dynamic_depth) and (
            self.stride[0] == 1 and self.groups == 1)

    def spatial_padding(self) -> tuple[int, int] | None:
        """Symmetric (H, W) padding for conv2d, or None when a side needs an explicit pad."""
        (top, bottom), (left, right) = self.padding[1], self.padding[2]
        return (top, left) if top == bottom and left == right else None


def conv3d_geometry(node: torch.fx.Node) -> Conv3dGeometry | str:
    """The geometry of the 3-D convolution ``node``, or the reason it cannot be rewritten."""
    arguments = conv_arguments(node, allow_dynamic_batch=True, allow_dynamic_depth=True)
    if isinstance(arguments, str):
        return arguments
    kwargs, shapes = arguments.kwargs, (arguments.input_shape, arguments.weight_shape)
    if kwargs.get("transposed", False):
        return "transposed convolution"
    stride = triple(kwargs.get("stride", 1))
    dilation = triple(kwargs.get("dilation", 1))
    kernel = shapes[1][2:]
    padding_arg = kwargs.get("padding", 0)
    if isinstance(padding_arg, str):
        if padding_arg == "valid":
            padding = ((0, 0),) * 3
        elif padding_arg == "same" and stride == (1, 1, 1):
            totals = [dilation[d] * (kernel[d] - 1) for d in range(3)]
            padding = tuple((t // 2, t - t // 2) for t in totals)  # type: ignore[assignment]
        else:
            return f"padding={padding_arg!r} with stride {stride} has no fixed zero padding"
    else:
        padding = tuple((p, p) for p in triple(padding_arg))  # type: ignore[assignment]
    return Conv3dGeometry(
        shapes[0],
        shapes[1],
        stride,
        padding,
        dilation,
        int(kwargs.get("groups", 1)),  # type: ignore[call-overload]
        kwargs.get("bias") is not None,
        arguments.dynamic_batch,
        arguments.dynamic_depth,
    )


def _unit_stride_taps(x: torch.Tensor, geometry: Conv3dGeometry) -> list[torch.Tensor]:
    """Each depth tap's input frames of one clip at depth stride 1, as 4-D ``(Do, C, H, W)`` slices of the
    frames ``(D, C, H, W)`` with zero frames padded on (``Conv3dGeometry.frames_stay_4d`` says why 4-D).

    A tap that reads exactly the unpadded frames takes them as they are: one copy fewer.
    """
    _, c, d, h, w = geometry.input_shape
    kd, do, dd = geometry.weight_shape[2], geometry.output_shape[2], geometry.dilation[0]
    front, back = geometry.padding[0]
    frames = x.permute(0, 2, 1, 3, 4).reshape(d, c, h, w)
    padded = F.pad(frames, (0, 0, 0, 0, 0, 0, front, back)) if front or back else frames
    return [frames if j * dd == front and do == d else padded[j * dd : j * dd + do] for j in range(kd)]


def _pad_hw(x: torch.Tensor, geometry: Conv3dGeometry) -> tuple[torch.Tensor, tuple[int, int]]:
    symmetric = geometry.spatial_padding()
    if symmetric is not None:
        return x, symmetric
    (top, bottom), (left, right) = geometry.padding[1], geometry.padding[2]
    return F.pad(x, (left, right, top, bottom)), (0, 0)


def conv2d_constants(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    geometry: Conv3dGeometry,
    depth_taps: DepthTaps = "fold",
    activation: Activation | None = None,
) -> list[torch.Tensor]:
    """The constants ``conv3d_as_conv2d`` reads, in the order it reads them, computed from the 3-D weight.

    XNNPACK and pt2e need a conv's weight to be a parameter, so the slicing and folding of the 3-D weight
    is done here, ahead of time, and every conv2d gets its own weight and bias: pt2e annotates a conv
    only when its weight and bias are not already annotated for another one.
    """
    out_c, _, _, kh, kw = weight.shape
    form = geometry.form
    with_bias = [bias.clone()] if bias is not None else []
    if form == "frames as rows":
        return [rows_weight(weight, taps_along(geometry.weight_shape[2:], geometry.stride)), *with_bias]
    if form == "frames along height":
        return [weight[:, :, 0].clone(), *with_bias]
    if form == "one patch":
        return [weight.reshape(out_c, -1), *with_bias]
    if form == "temporal":
        return [weight.reshape(out_c, -1, weight.shape[2], 1), *with_bias]
    if form == "depth tiles":
        return [weight.reshape(out_c, -1, kh, kw), *with_bias]
    if depth_taps == "fold":
        return [fold_taps(weight, range(weight.shape[2])), *with_bias]
    constants: list[torch.Tensor] = []
    for j in range(weight.shape[2]):
        constants.append(weight[:, :, j].clone())
        if j == 0:
            constants += with_bias
    return constants


def conv3d_as_conv2d(
    x: torch.Tensor,
    constants: Sequence[torch.Tensor],
    geometry: Conv3dGeometry,
    depth_taps: DepthTaps = "fold",
    activation: Activation | None = None,
) -> torch.Tensor:
    """``activation(conv3d(x, weight, bias))`` computed with view/permute/slice/cat and conv2d or linear.

    ``constants`` is ``conv2d_constants(weight, bias, geometry, depth_taps, activation)``. This is the
    function the rewrite traces into the graph, so its eager result is exactly what the rewritten program
    computes. ``activation`` runs right after each conv2d or linear, where quantization fuses it.
    """
    _, c, d, h, w = geometry.input_shape  # the batch stays as the graph has it: -1 in every reshape
    out_c, _, kd, kh, kw = geometry.weight_shape
    _, _, do, ho, wo = geometry.output_shape
    sd, sh, sw = geometry.stride
    dd, dh, dw = geometry.dilation
    groups = geometry.groups
    form = geometry.form
    read = iter(constants)

    def bias() -> torch.Tensor | None:
        return next(read) if geometry.has_bias else None

    def act(y: torch.Tensor) -> torch.Tensor:
        return activation(y) if activation is not None else y

    if form == "frames as rows":
        along = taps_along((kd, kh, kw), geometry.stride)
        return act(frames_as_rows(x, next(read), bias(), (kd, kh, kw), geometry.stride, geometry.padding,
                                  geometry.dilation, groups, along))
    if form == "frames along height":
        layout = geometry.height_layout()
        assert layout is not None
        return frames_along_height(x, next(read), bias(), layout, (sh, sw), geometry.padding[2], (dh, dw), groups,
                                   activation)
    if form == "one patch":  # batch-agnostic (-1): the one form that keeps a dynamic batch
        patch = x[:, :, :kd, :kh, :kw] if (d, h, w) != (kd, kh, kw) else x
        y = act(F.linear(patch.reshape(-1, c * kd * kh * kw), next(read), bias()))
        return y.reshape(-1, out_c, 1, 1, 1)
    if form == "temporal":
        front, back = geometry.padding[0]
        rows = geometry.input_shape[0] == 1 and not geometry.dynamic_batch
        # one size to infer (-1): the frames when they are dynamic (the batch is static then), else the batch
        n, d, do = (geometry.input_shape[0], -1, -1) if geometry.dynamic_depth else (-1, d, do)
        # rows: (1, C, D, H, W) -> (H, C, D, W); else (N, C, D, H, W) is (N, C, D, H*W) as it lies in memory
        planes = x.permute(0, 3, 1, 2, 4).reshape(h, c, d, w) if rows else x.reshape(n, c, d, h * w)
        if front != back:  # conv2d pads both sides alike; an uneven "same" padding is an explicit pad
            planes, front = F.pad(planes, (0, 0, front, back)), 0
        y = act(F.conv2d(planes, next(read), bias(), (sd, 1), (front, 0), (dd, 1), groups))
        return y.reshape(1, ho, out_c, do, wo).permute(0, 2, 3, 1, 4) if rows else y.reshape(n, out_c, do, ho, wo)
    if form == "depth tiles":
        tiles = x if do * kd == d else x[:, :, : do * kd]
        folded = tiles.reshape(-1, c, do, kd, h, w).permute(0, 2, 1, 3, 4, 5).reshape(-1, c * kd, h, w)
        folded, padding = _pad_hw(folded, geometry)
        y = act(F.conv2d(folded, next(read), bias(), (sh, sw), padding, (dh, dw), groups))
        return y.reshape(-1, do, out_c, ho, wo).permute(0, 2, 1, 3, 4)
    front, back = geometry.padding[0]
    if geometry.frames_stay_4d():
        tap_frames = _unit_stride_taps(x, geometry)
    else:
        frames = x.permute(0, 2, 1, 3, 4).reshape(-1, d, c * h * w)
        if front or back:  # zero frames: every output frame then reads every tap
            frames = F.pad(frames, (0, 0, front, back))
        tap_frames = [select_every(frames, j * dd, sd, do) for j in range(kd)]
    if depth_taps == "fold":
        folded, padding = _pad_hw(fold_frames(tap_frames, c, groups, h, w), geometry)
        y = act(F.conv2d(folded, next(read), bias(), (sh, sw), padding, (dh, dw), groups))
    else:
        summed: torch.Tensor | None = None
        for tap in tap_frames:
            one, padding = _pad_hw(as_frames(tap, c, h, w), geometry)
            part = F.conv2d(one, next(read), bias() if summed is None else None, (sh, sw), padding, (dh, dw), groups)
            summed = part if summed is None else summed + part
        assert summed is not None
        y = act(summed)
    return y.reshape(-1, do, out_c, ho, wo).permute(0, 2, 1, 3, 4)


class RewriteConv3dPass(SplicedConvPass[Conv3dGeometry]):
    """Replaces each 3-D convolution by conv2d/linear ops; what it cannot replace it tags and reports.

    ``depth_taps`` picks the general form (see module doc).
    """

    kind = ConvKind.CONV3D
    subject = "3-D convolution"

    def __init__(self, depth_taps: DepthTaps = "fold") -> None:
        super().__init__()
        self.depth_taps = depth_taps

    def quantization_note(self, node: torch.fx.Node) -> str | None:
        geometry = self.geometry(node)
        if self.depth_taps != "sum" or not isinstance(geometry, Conv3dGeometry) or geometry.form != "general":
            return None
        return (
            "the 'sum' form adds one conv2d per depth tap, and quantization rounds each partial sum to int8; "
            "rewrite with RewriteConv3dPass(depth_taps='fold') (the default) for int8"
        )

    def geometry(self, node: torch.fx.Node) -> Conv3dGeometry | str:
        geometry = conv3d_geometry(node)
        pad = absorbed_pad(node)
        if isinstance(geometry, str) or pad is None:
            return geometry
        unpadded = pad.unpadded(geometry.input_shape, geometry.dynamic_depth)
        return dataclasses.replace(geometry, input_shape=unpadded, padding=pad.widen(geometry.padding))

    def source(self, node: torch.fx.Node, operands: ConvOperands) -> torch.fx.Node:
        pad = absorbed_pad(node)
        return pad.source if pad is not None else operands.input

    def constants(
        self, operands: ConvOperands, geometry: Conv3dGeometry, activation: Activation | None
    ) -> list[torch.Tensor]:
        return conv2d_constants(operands.weight, operands.bias, geometry, self.depth_taps, activation)

    def compute(
        self,
        x: torch.Tensor,
        constants: Sequence[torch.Tensor],
        geometry: Conv3dGeometry,
        activation: Activation | None,
    ) -> torch.Tensor:
        return conv3d_as_conv2d(x, constants, geometry, self.depth_taps, activation)
