"""A 3-D convolution whose depth (frame count) is known only at run time, as one conv2d XNNPACK reshapes.

XNNPACK sizes every operator at run time from its input: a conv2d takes any height, a reshape infers one
dim written -1, a slice along a static dim of a tensor with a dynamic one is clamped to the run's sizes
(``xnnguard.partition.symbolic_slice``). What it cannot do is a slice along the dynamic dim, a reshape with
two unknown dims, or a 3-D convolution at all. So the frames must stay a whole dim of every tensor and
become a *spatial* dim of a conv2d, never cut and never merged with another unknown (a dynamic batch with a
dynamic depth is left: every form below would need two dims inferred in one reshape).

The form, **frames as rows**: the taps along W (or along H, whichever kernel is smaller) are stacked as
channels, W's output positions go to the batch, and (D, H) is the conv2d's plane:
``(N, C, D, H, W) -> (N*Wo, kw*C, D, H)``, one conv2d with a (kd, kh) kernel over it, and back. The depth
padding (``padding``, or front-only as a causal conv pads) and the depth stride and dilation are the
conv2d's own. It costs ``kw`` copies of the input (``kh`` when taking the taps along H). Folding the
frames into the batch instead (for a (1, kh, kw) kernel) would be cheaper, but export's fake convolution
then guards the folded batch below 16 (its backend choice), which narrows the program's range of lengths.

Why it is exact: the sum a 3-D convolution makes for an output element is the same sum, over the same
products, regrouped: the W taps are input channels of the conv2d (channel order (group, tap, channel),
as the weight is laid out here), the (D, H) window its kernel.

Two cheaper forms cover the common kernels, with no copy per tap: a kernel that convolves only the depth
(a (k, 1, 1) kernel: the temporal half of R(2+1)D's and S3D's separable convs) is the ``temporal`` form
of ``xnnguard.rewrite.conv3d.conv3d`` with the frames inferred, and a kernel of depth 1 (their spatial
half) is **frames along height** (``frames_along_height``): each frame's rows are laid one after another,
with zero rows between them, as the one plane of a conv2d (``(N, C, D*Hp, W)``), laid out so that every
output row reads one frame only (``height_layout``). Both keep the batch a static size, so that no
convolution's batch is the (dynamic) frames: see ``xnnguard.rules.conv_batch_range``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from xnnguard.rewrite.conv3d.operands import Padding3d
from xnnguard.rewrite.reduce.forms import reshape_to

__all__ = [
    "HeightLayout", "TapsAlong", "frames_along_height", "frames_as_rows", "height_layout", "rows_weight",
    "taps_along", "taps_tile_width", "transposed_frames_as_rows",
    "transposed_rows_weight", "width_overlap_add",
]

TapsAlong = Literal["h", "w"]


def taps_along(kernel: tuple[int, int, int], stride: tuple[int, int, int]) -> TapsAlong:
    """Which spatial dim's taps become channels: the one with fewer (then the one with stride 1)."""
    _, kh, kw = kernel
    if kh != kw:
        return "h" if kh < kw else "w"
    return "h" if stride[1] == 1 and stride[2] != 1 else "w"


def rows_weight(weight: torch.Tensor, along: TapsAlong) -> torch.Tensor:
    """The conv2d weight of ``frames_as_rows``: (O, C/g, kd, kh, kw) -> (O, k*C/g, kd, k'), channels (tap, C).

    ``k`` is the kernel along ``along`` (its taps become channels), ``k'`` the other spatial kernel.
    """
    out_c, c_g, kd, kh, kw = weight.shape
    if along == "w":
        return weight.permute(0, 4, 1, 2, 3).reshape(out_c, kw * c_g, kd, kh)
    return weight.permute(0, 3, 1, 2, 4).reshape(out_c, kh * c_g, kd, kw)


def _taps(z: torch.Tensor, count: int, out: int, stride: int, dilation: int) -> list[torch.Tensor]:
    """Each tap's input positions of ``z`` (N, P, C, R), P the padded tapped dim: (N, out, C, R) each.

    A stride above 1 takes every ``stride``-th position by a view of ``stride`` positions as one and a
    slice of the first (a step slice XNNPACK has not); the slices are along static dims only.
    """
    n, _, c, _ = z.shape
    taps = []
    for j in range(count):
        first = j * dilation
        if stride == 1:
            taps.append(z if (first, out) == (0, z.shape[1]) else z[:, first : first + out])
            continue
        block = z[:, first : first + stride * out] if (first, stride * out) != (0, z.shape[1]) else z
        if block.shape[1] < stride * out:  # the last window reads no further than the padded end
            block = F.pad(block, (0, 0, 0, 0, 0, stride * out - block.shape[1]))
        taps.append(block.reshape(n, out, stride, -1)[:, :, :1].reshape(n, out, c, -1))
    return taps


def frames_as_rows(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    kernel: tuple[int, int, int],
    stride: tuple[int, int, int],
    padding: Padding3d,
    dilation: tuple[int, int, int],
    groups: int,
    along: TapsAlong,
) -> torch.Tensor:
    """``conv3d(x)`` for ``x`` (N, C, D, H, W), N static, D dynamic; ``weight`` is ``rows_weight``'s."""
    if along == "h":  # the same with H and W swapped: the conv2d's plane is then (D, W)
        swapped = frames_as_rows(
            x.transpose(3, 4), weight, bias, (kernel[0], kernel[2], kernel[1]), (stride[0], stride[2], stride[1]),
            (padding[0], padding[2], padding[1]), (dilation[0], dilation[2], dilation[1]), groups, "w",
        )
        return swapped.transpose(3, 4)
    n, c, _, _, w = x.shape
    kw = kernel[2]
    (front, back), (top, bottom), (left, right) = padding
    wo = (w + left + right - dilation[2] * (kw - 1) - 1) // stride[2] + 1
    depth_pad = front if front == back else 0
    height_pad = top if top == bottom else 0
    pads = (left, right, 0 if top == bottom else top, 0 if top == bottom else bottom,
            0 if front == back else front, 0 if front == back else back)
    if any(pads):
        x = F.pad(x, pads)
    hp = x.shape[3]
    z = x.permute(0, 4, 1, 2, 3).reshape(n, x.shape[4], c, -1)  # (N, Wp, C, D*Hp): D*Hp the one unknown
    taps = _taps(z, kw, wo, stride[2], dilation[2])
    if kw == 1:
        rows = taps[0].reshape(n * wo, c, -1, hp)
    else:
        # (N, Wo, g, kw, C/g * D*Hp) by a cat (a stack would decompose into a view of symbolic sizes)
        grouped = torch.cat([t.reshape(n, wo, groups, 1, -1) for t in taps], 3)
        rows = grouped.reshape(n * wo, kw * c, -1, hp)
    y = F.conv2d(rows, weight, bias, (stride[0], stride[1]), (depth_pad, height_pad),
                 (dilation[0], dilation[1]), groups)
    return y.reshape(n, wo, y.shape[1], -1, y.shape[3]).permute(0, 2, 3, 4, 1)


@dataclass(frozen=True)
class HeightLayout:
    """How ``frames_along_height`` lays each frame's rows into the conv2d's plane, and reads them back.

    Each frame is ``top`` zero rows, its ``h`` rows and ``bottom`` zero rows (``rows`` in all); the conv2d
    pads the plane with ``conv_padding`` rows on both ends. Output row ``c + j`` of a frame's
    ``rows // stride`` is its row ``j`` (``skip`` = c), for ``j < out_rows``.
    """

    top: int
    bottom: int
    conv_padding: int
    skip: int
    rows: int
    out_rows: int


def height_layout(h: int, kernel: int, stride: int, dilation: int, top: int, bottom: int) -> HeightLayout | None:
    """The layout that makes one conv2d over the frames' rows the per-frame 2-D convolution, or None.

    The conv2d's output must be exactly ``rows // stride`` rows per frame, so that a reshape with the
    frames inferred splits it: with ``q`` its own padding that holds when ``span - stride <= 2q <= span - 1``
    (``span`` the dilated kernel), which no ``q`` meets for an even span at stride 1. The zero rows between
    frames then serve as the bottom padding of one frame and the top padding of the next.
    """
    span = dilation * (kernel - 1) + 1
    out_rows = (h + top + bottom - span) // stride + 1
    q = max(0, -(-(span - stride) // 2))
    if not span - stride <= 2 * q <= span - 1 or out_rows < 1:
        return None
    skip = -(-max(0, q - top) // stride)
    above = skip * stride + top - q  # a frame's row 0 is read by the output row skip, as by the 3-D conv
    below = max(bottom, top - above, 0)
    while (above + h + below) % stride or (above + h + below) // stride < skip + out_rows:
        below += 1
    return HeightLayout(above, below, q, skip, above + h + below, out_rows)


def frames_along_height(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    layout: HeightLayout,
    stride: tuple[int, int],
    width_padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
    activation: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``activation(conv3d(x))`` for a kernel of depth 1 (stride 1, no depth padding) of ``x`` (N, C, D, H, W),
    N static, D dynamic; ``weight`` is the 3-D weight's only depth tap (O, C/g, kh, kw)."""
    n, c = x.shape[:2]
    left, right = width_padding
    pads = (0, 0) if left == right else (left, right)
    if any(pads) or layout.top or layout.bottom:
        x = F.pad(x, (*pads, layout.top, layout.bottom))
    plane = x.reshape(n, c, -1, x.shape[4])  # (N, C, D*rows, W): D*rows the one unknown
    y = F.conv2d(plane, weight, bias, stride, (layout.conv_padding, left if left == right else 0), dilation, groups)
    if activation is not None:
        y = activation(y)  # right after the conv, where quantization fuses it
    per_frame = layout.rows // stride[0]
    y = y.reshape(n, y.shape[1], -1, per_frame, y.shape[3])
    if (layout.skip, layout.out_rows) != (0, per_frame):
        y = y[:, :, :, layout.skip : layout.skip + layout.out_rows]
    return y


def transposed_rows_weight(weight: torch.Tensor) -> torch.Tensor:
    """The conv_transpose2d weight of ``transposed_frames_as_rows``: (C, O, kd, kh, kw) -> (C, kw*O, kd, kh),
    output channels ordered (tap, O)."""
    c, out_c, kd, kh, kw = weight.shape
    return weight.permute(0, 4, 1, 2, 3).reshape(c, kw * out_c, kd, kh)


def taps_tile_width(kernel_w: int, stride_w: int, dilation_w: int, output_padding_w: int) -> bool:
    """Each output column gets exactly one W tap of one input column: placing them is a permute."""
    return stride_w == kernel_w and (dilation_w == 1 or kernel_w == 1) and output_padding_w == 0


def width_overlap_add(w: int, kernel_w: int, stride_w: int, padding_w: int, dilation_w: int,
                      output_padding_w: int, dtype: torch.dtype) -> torch.Tensor:
    """The (Wo, W*kw) 0/1 matrix that adds tap ``k`` of input column ``i`` into output column
    ``i*stride - padding + k*dilation`` (a transposed convolution's overlap-add along W)."""
    wo = (w - 1) * stride_w - 2 * padding_w + dilation_w * (kernel_w - 1) + output_padding_w + 1
    matrix = torch.zeros(wo, w * kernel_w, dtype=dtype)
    for i in range(w):
        for k in range(kernel_w):
            column = i * stride_w - padding_w + k * dilation_w
            if 0 <= column < wo:
                matrix[column, i * kernel_w + k] = 1
    return matrix


def transposed_frames_as_rows(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    overlap: torch.Tensor | None,
    bias: torch.Tensor | None,
    kernel: tuple[int, int, int],
    stride: tuple[int, int, int],
    padding: tuple[int, int, int],
    output_padding: tuple[int, int, int],
    dilation: tuple[int, int, int],
    activation: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``activation(conv_transpose3d(x))`` (groups 1) of ``x`` (N, C, D, H, W), N static, D dynamic: frames as rows.

    W's columns go to the batch and ``(D, H)`` is the plane of one ``conv_transpose2d`` whose output
    channels are the W taps (``transposed_rows_weight``); then each tap's column is placed in the output
    by a permute when the taps tile W (``conv_bias`` is then the bias, repeated per tap, and
    ``activation`` runs right after the conv, where quantization fuses it), or added into it by a
    linear against ``width_overlap_add`` (``overlap``; ``bias`` and ``activation`` after it).
    """
    act = activation if activation is not None else (lambda t: t)
    n, c, _, h, w = x.shape
    kw = kernel[2]
    rows = reshape_to(x.permute(0, 4, 1, 2, 3), [n * w, c, x.shape[2], h])
    y = F.conv_transpose2d(rows, weight, conv_bias, stride[:2], padding[:2], output_padding[:2], 1, dilation[:2])
    if overlap is None:
        y = act(y)
    out_c, ho = y.shape[1] // kw, y.shape[3]
    taps = reshape_to(y, [n, w, kw, out_c, y.shape[2], ho]).permute(0, 3, 4, 5, 1, 2)
    columns = reshape_to(taps, [n, out_c, y.shape[2], ho, w * kw])  # column i*kw + k: tap k of input column i
    if overlap is None:
        wo = (w - 1) * stride[2] - 2 * padding[2] + kw
        return columns[..., padding[2]: padding[2] + wo] if (padding[2], wo) != (0, w * kw) else columns
    out = F.linear(columns, overlap)
    return act(out + bias.reshape(out_c, 1, 1, 1) if bias is not None else out)
