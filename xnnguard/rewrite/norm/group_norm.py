"""Group norms as fully connected, elementwise and ``rsqrt`` ops XNNPACK runs.

Invariant established: no float32 or float16 ``group_norm`` / ``native_group_norm`` (its mean and rstd unused) with
static channels and positions, of a tensor within XNNPACK's rank limit, is left. ExecuTorch 1.5.1's XNNPACK
partitioner has no config for it, so every block of a MONAI-style 3-D UNet or a video VAE ran one on
portable kernels between two delegates.

A group norm of ``(N, C, *S)`` in ``G`` groups normalizes each group's ``C/G * prod(S)`` elements: the
input viewed as ``(N, G, C/G, *S)`` (a split of the channels: a view for any strides; not needed for
one group or one channel per group), ``statistics`` (``xnnguard.rewrite.norm.base``) over its trailing
dims, then ``y = d * scale + bias`` on the deviations ``d`` the variance was taken of, with ``scale =
rstd * weight`` per channel: one multiply and one add over the tensor. PyTorch's CPU kernel computes
``x * scale + (bias - mean * scale)`` in one fused multiply-add; XNNPACK's multiply rounds ``x * scale``
first, at ``|x| / std``, which a group of nearly equal values makes far larger than the result (fuzz
seed 455: 2e-5 off at an output of 1). A dynamic batch is kept (written ``-1``); dynamic positions (a
clip's frames) take ``dynamic_group_norm_form``. ``group_norm_form`` is shared with instance norm (``G = C``).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from xnnguard.graph.args import int_arg, schema_arguments
from xnnguard.rewrite.norm.base import (
    Form,
    NormRewritePass,
    Operand,
    affine_operand,
    dtype_of,
    eps_constant,
    shaped,
    statistics,
)
from xnnguard.rewrite.norm.dynamic_positions import dynamic_group_norm_form
from xnnguard.rewrite.norm.frames_layout import frames_group_norm_form, frames_source
from xnnguard.rewrite.reduce.forms import reshape_to, stage_rule, sum_weights
from xnnguard.rewrite.reduce.plan import SumPlan
from xnnguard.rules.rank_limit import exceeds_rank_limit

__all__ = ["RewriteGroupNormPass", "group_norm_form"]

_aten = torch.ops.aten


def group_norm_form(
    graph_module: torch.fx.GraphModule, x: torch.fx.Node, groups: int, weight: object, bias: object, eps: object
) -> Form | str:
    """The form of ``group_norm(x, groups, weight, bias, eps)``, or why there is none."""
    shape = x.meta["val"].shape
    if len(shape) < 3 and not all(isinstance(size, int) for size in shape[1:]):
        return "its channels or positions are dynamic"
    if not isinstance(eps, float | int):
        return "its eps is not a constant"
    if not all(isinstance(size, int) for size in shape[1:]):
        return dynamic_group_norm_form(graph_module, x, groups, weight, bias, float(eps))
    channels, positions = int(shape[1]), [int(size) for size in shape[2:]]
    if groups <= 0 or channels % groups:
        return f"{channels} channels do not split into {groups} groups"
    per_group = channels // groups
    if per_group * math.prod(positions) == 0:
        return "it normalizes groups of no element"
    if per_group * math.prod(positions) == 1:
        return _bias_form(graph_module, x, channels, len(positions), bias)
    frames = frames_source(x) if dtype_of(x) == torch.float32 else None
    if frames is not None:
        affine = [1, channels, 1, 1]
        weight_operand = affine_operand(graph_module, weight, affine)
        bias_operand = affine_operand(graph_module, bias, affine)
        return frames_group_norm_form(
            *frames, groups, float(eps),
            torch.ones(affine) if weight_operand is None else weight_operand,
            torch.zeros(affine) if bias_operand is None else bias_operand)
    split = 1 < groups < channels
    if split and exceeds_rank_limit(len(shape) + 1):
        return f"its channels split into groups make {len(shape) + 1} dims"
    ones = [1] * len(positions)
    dtype = dtype_of(x)
    rule = stage_rule(dtype)
    if split:  # statistics over the trailing (C/G, *S) of (N, G, C/G, *S)
        plan, affine_shape = SumPlan(None, (per_group, *positions), *rule), [groups, per_group, *ones]
    else:  # over (C, *S) for one group, over S for one channel per group
        plan = SumPlan(None, (channels, *positions) if groups == 1 else tuple(positions), *rule)
        affine_shape = [channels, *ones]
    scale = affine_operand(graph_module, weight, affine_shape)
    shift = affine_operand(graph_module, bias, affine_shape)
    if scale is None:
        scale = torch.ones(affine_shape, dtype=dtype)
    if shift is None:
        shift = torch.zeros(affine_shape, dtype=dtype)
    averages = sum_weights(plan.stages, 1.0 / plan.k, dtype)

    def group_norm(x_: torch.Tensor, eps_: torch.Tensor, weight_: torch.Tensor, bias_: torch.Tensor,
                   *weights: torch.Tensor) -> torch.Tensor:
        batch = x_.shape[0]
        grouped = reshape_to(x_, [batch, groups, per_group, *positions]) if split else x_
        _, centered, rstd = statistics(grouped, plan, weights, eps_)
        y = centered * (rstd * shaped(weight_, affine_shape)) + shaped(bias_, affine_shape)
        return reshape_to(y, list(x_.shape)) if split else y

    operands: list[Operand] = [x, eps_constant(float(eps), dtype), scale, shift, *averages]
    return group_norm, operands


def _bias_form(graph_module: torch.fx.GraphModule, x: torch.fx.Node, channels: int, spatial: int,
               bias: object) -> Form:
    """A group of one element is its own mean: eager computes ``(x - x) * rstd * weight + bias``, exactly
    the bias (NaN where ``x`` is not finite). ``x * 0 + bias`` is that, where the portable kernel's mean,
    summed in another way, left a residue that ``rstd = 1/sqrt(eps)`` magnified (3e-5 at eps 1e-5)."""
    affine_shape = [channels, *[1] * spatial]
    shift = affine_operand(graph_module, bias, affine_shape)
    if shift is None:
        shift = torch.zeros(affine_shape, dtype=dtype_of(x))

    def bias_only(x_: torch.Tensor, bias_: torch.Tensor) -> torch.Tensor:
        return x_ * 0 + shaped(bias_, affine_shape)

    return bias_only, [x, shift]


class RewriteGroupNormPass(NormRewritePass):
    """Replaces each group norm by linears against ``1/K`` over its groups and a per-channel ``d * scale + bias``."""

    subject = "group norm"
    targets: ClassVar[dict[object, bool]] = {_aten.group_norm.default: False, _aten.native_group_norm.default: True}

    def form(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> Form | str:
        arguments = schema_arguments(node) or {}
        x = arguments["input"]
        assert isinstance(x, torch.fx.Node)
        groups = int_arg(arguments["num_groups"] if "num_groups" in arguments else arguments["group"])
        return group_norm_form(graph_module, x, groups, arguments.get("weight"), arguments.get("bias"),
                               arguments.get("eps"))
