"""A group or instance norm whose positions have one dynamic dim (a clip's frames), as ops XNNPACK sizes at run time.

The static form sums each group with linears against constant vectors, whose lengths are the group's
size: with a dynamic frame count there is no such vector. XNNPACK's global average pooling (``mean`` over
dims 2 and 3 of a 4-D tensor, kept: ``MeanDimConfig``) averages a plane of any size at run time, in float32
(float16 too: ``f16_f32acc_rsum``). So each group of ``(N, C, *P)``, ``P`` with one dynamic dim ``P[j]``, is
viewed as a 4-D ``(N, G, R, I)``: ``I = prod(P[j+1:])`` the static positions after the dynamic dim,
``R = C/G * prod(P[:j+1])`` the rest, dynamic (the one size the view infers, written -1: a view of the
contiguous input). The mean is a linear against ``1/I`` over ``I`` (the bulk of the sum, no layout change),
then the global average pooling of the ``(N, G, R, 1)`` row means, whose NHWC permute is ``I`` times
smaller than the tensor. Then, as the static form: ``d = x - mean``, ``rstd = rsqrt(mean(d * d) + eps)``
(float16: ``second_moment``), ``y = d * (rstd * weight) + bias`` per channel, with the deviations viewed
as ``(N, C, R', I)``, and back to the input's shape.

What differs from the static form: no shift to each block's first element (a slice along the dynamic
dim, which XNNPACK cannot size), so a block of equal values centers to a rounding off 0, not exactly 0.
A dynamic batch with dynamic positions is left: the 4-D view would infer two sizes.
"""

from __future__ import annotations

import math

import torch

from xnnguard.rewrite.dtypes import is_half
from xnnguard.rewrite.norm.base import Form, Operand, affine_operand, dtype_of, eps_constant
from xnnguard.rewrite.reduce.forms import dynamic_rows_mean, dynamic_rows_weights, reshape_to, second_moment

__all__ = ["dynamic_group_norm_form"]


def dynamic_group_norm_form(
    graph_module: torch.fx.GraphModule, x: torch.fx.Node, groups: int, weight: object, bias: object, eps: float
) -> Form | str:
    """The form of a group norm of ``x`` with one dynamic position dim, or why there is none."""
    shape = x.meta["val"].shape
    if not isinstance(shape[0], int):
        return "its batch and positions are both dynamic: the 4-D view would infer two sizes"
    if not isinstance(shape[1], int):
        return "its channels are dynamic"
    positions = list(shape[2:])
    dynamic = [i for i, size in enumerate(positions) if not isinstance(size, int)]
    if len(dynamic) != 1:
        return "more than one of its positions' dims is dynamic"
    batch, channels, j = int(shape[0]), int(shape[1]), dynamic[0]
    if groups <= 0 or channels % groups:
        return f"{channels} channels do not split into {groups} groups"
    per_group = channels // groups
    inner = math.prod(int(size) for size in positions[j + 1:])  # the static positions after the dynamic dim
    dtype = dtype_of(x)
    inner_weights = dynamic_rows_weights(inner, dtype)
    channel_shape = [channels, 1, 1]
    scale = affine_operand(graph_module, weight, channel_shape)
    shift = affine_operand(graph_module, bias, channel_shape)
    operands: list[Operand] = [
        x, eps_constant(float(eps), dtype),
        torch.ones(channel_shape, dtype=dtype) if scale is None else scale,
        torch.zeros(channel_shape, dtype=dtype) if shift is None else shift,
        *inner_weights,
    ]

    def group_norm(x_: torch.Tensor, eps_: torch.Tensor, weight_: torch.Tensor, bias_: torch.Tensor,
                   *weights: torch.Tensor) -> torch.Tensor:
        outer = math.prod(x_.shape[2:j + 3])  # the positions up to the dynamic dim: dynamic
        grouped = reshape_to(x_, [batch, groups, per_group * outer, inner])
        mean = dynamic_rows_mean(grouped, inner, weights)
        centered = grouped - mean
        if is_half(x_.dtype):
            q, s = second_moment(centered, lambda t: dynamic_rows_mean(t, inner, weights))
            rstd = torch.rsqrt(q + eps_ / s / s) / s
        else:
            rstd = torch.rsqrt(dynamic_rows_mean(centered * centered, inner, weights) + eps_)
        per_channel = (rstd.reshape(batch, groups, 1) * weight_.reshape(groups, per_group)).reshape(
            batch, channels, 1, 1)
        by_channel = reshape_to(centered, [batch, channels, outer, inner])
        y = by_channel * per_channel + bias_.reshape(channels, 1, 1)
        return reshape_to(y, list(x_.shape))

    return group_norm, operands
