"""A channel norm of one clip whose frames lie in the batch of a 4-D tensor, computed on that tensor.

Invariant established (with ``group_norm_form``): a float32 group or instance norm of one static clip
``(1, C, *S)`` that is a chain of reshapes and permutes of a 4-D ``(D, C, H, W)`` tensor keeping each
channel in its place (``frames_source``) is computed on that tensor with 4-D ops only, and the chain
follows the result.

Why: the 3-D convolution rewrites leave each clip's frames in the batch of a 4-D tensor, which
ExecuTorch 1.5.1 runs in NHWC, and unfold them back to ``(1, C, D, H, W)`` after it. A norm there
(nnU-Net's and MONAI's UNets, video VAEs) read the unfolded tensor: around every norm XNNPACK transposed
the conv's output out of NHWC and to channels first, and back for the next conv (20 % of the 3-D UNet's
float forward at 128^3). ExecuTorch's NHWC pass keeps 4-D elementwise ops, slices, pads, cats and
permutes in NHWC, and runs a 4-D mean over H and W as a global average pooling in NHWC; so here:

    per_frame = mean(t, (H, W))                          # (D, C, 1, 1): an NHWC global average pooling
    mean      = mean(per_frame.permute(2, 1, 0, 3), ...) # (1, C, 1, 1): the same over the D frames

and the norm's elementwise ops run on ``(D, C, H, W)`` with ``(1, C, 1, 1)`` operands, all in NHWC.
Its chain back to ``(1, C, D, H, W)`` then meets the next conv's chain into frames and the two
collapse (``xnnguard.rewrite.layout``): from one conv to the next nothing leaves NHWC.

The arithmetic is ``statistics``' (``xnnguard.rewrite.norm.base``): deviations of ``x - x0`` from their
mean (``x0`` a group's first element: a group of equal values deviates by exactly 0), the biased
variance of them, ``d * scale + bias``. Groups of several channels average their channels' means
(equal counts: the group's mean). float16 keeps the linears' form: its sums are staged and scaled
against overflow (``xnnguard.rewrite.dtypes``), which a pooling's sum is not.
"""

from __future__ import annotations

import torch

from xnnguard.rewrite.layout.movement_chains import is_movement, keeps_channels, movement_chain, run_moves
from xnnguard.rewrite.norm.base import Form, Operand, shaped

__all__ = ["frames_group_norm_form", "frames_source"]


def frames_source(x: torch.fx.Node) -> tuple[torch.fx.Node, list[torch.fx.Node]] | None:
    """The 4-D ``(D, C, H, W)`` tensor and the moves that make ``x`` ``(1, C, *S)`` of it, keeping each
    channel ``c`` of ``x`` exactly channel ``c`` of the source; None when ``x`` is not such a view."""
    if not is_movement(x):
        return None
    chain = movement_chain(x)
    source = chain[0].args[0]
    if not isinstance(source, torch.fx.Node):
        return None
    source_value, value = source.meta.get("val"), x.meta.get("val")
    if not isinstance(source_value, torch.Tensor) or not isinstance(value, torch.Tensor):
        return None
    shape = [int(size) for size in source_value.shape]
    if len(shape) != 4 or value.dim() < 3 or int(value.shape[0]) != 1:
        return None
    return (source, chain) if keeps_channels(chain, shape) else None


def _frame_mean(t: torch.Tensor) -> torch.Tensor:
    """The mean of each channel of ``(D, C, H, W)`` over its frames and positions, at ``(1, C, 1, 1)``."""
    per_frame = t.mean((2, 3), keepdim=True)
    return per_frame if t.shape[0] == 1 else per_frame.permute(2, 1, 0, 3).mean((2, 3), keepdim=True)


def frames_group_norm_form(
    source: torch.fx.Node, chain: list[torch.fx.Node], groups: int, eps: float, weight: Operand, bias: Operand
) -> Form:
    """``group_norm`` in ``groups`` of the clip ``chain`` makes of ``source`` (``frames_source``), computed on
    ``source`` and moved by ``chain``; ``weight`` and ``bias`` are per-channel, ``(1, C, 1, 1)`` if constant."""
    channels = int(source.meta["val"].shape[1])
    per_group = channels // groups
    affine = (1, channels, 1, 1)
    eps_ = torch.full((1, 1, 1, 1), eps, dtype=torch.float32)  # 4-D: a lower rank would take the op out of NHWC
    # a group's value at each of its channels: times ones of (1, G, C/G, 1) (exact), a broadcast XNNPACK runs
    spread = torch.ones((1, groups, per_group, 1), dtype=torch.float32)

    def norm(f: torch.Tensor, eps_t: torch.Tensor, weight_: torch.Tensor, bias_: torch.Tensor,
             spread_: torch.Tensor) -> torch.Tensor:
        def per_channel(group_values: torch.Tensor) -> torch.Tensor:
            return (group_values.reshape(1, groups, 1, 1) * spread_).reshape(1, channels, 1, 1)

        def group_mean(t: torch.Tensor) -> torch.Tensor:
            channel_means = _frame_mean(t)
            if per_group == 1:
                return channel_means
            return per_channel(channel_means.reshape(1, groups, per_group, 1).mean((2, 3), keepdim=True))

        first = f[0:1, :, 0:1, 0:1]
        if per_group > 1:  # each group's first element, at each of its channels
            first = per_channel(first.reshape(1, groups, per_group, 1)[:, :, 0:1])
        shifted = f - first
        centered = shifted - group_mean(shifted)
        scale = torch.rsqrt(group_mean(centered * centered) + eps_t) * shaped(weight_, affine)
        return run_moves(chain, centered * scale + shaped(bias_, affine))

    return norm, [source, eps_, weight, bias, spread]
