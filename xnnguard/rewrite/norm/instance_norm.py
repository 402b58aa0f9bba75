"""Instance norms, and batch norms that normalize with the batch's own statistics, as ops XNNPACK runs.

Invariant established: no float32 or float16 ``instance_norm``, ``batch_norm`` with ``training=True`` and no
running statistics, or ``_native_batch_norm_legit.no_stats`` (what both decompose to; its statistics
unused), with static channels and positions, of a tensor within XNNPACK's rank limit, is left.
ExecuTorch 1.5.1's XNNPACK partitioner takes a batch norm only with running statistics, so nnU-Net's
``InstanceNorm3d`` ran on portable kernels, with the ``repeat`` of its affine weights, between two
delegates.

* An instance norm with input statistics is a group norm with one group per channel
  (``group_norm_form``: rows of one channel's positions, per-channel affine). The decomposed form (a
  view to ``(1, N*C, ...)`` and a batch norm of the ``repeat``-ed weights) is the same with ``N = 1``:
  the repeated weights are computed from parameters alone, so they become constants.
* A batch norm with batch statistics normalizes each channel over the batch and the positions: with a
  batch of 1 that is the instance norm again; with more, the mean and variance sum each sample's
  positions (trailing: no permute), then transpose the small ``(N, C)`` sums and sum the batch (a
  dynamic batch: declined, that sum would have a dynamic length), and ``d * scale + bias`` is computed
  per channel on the deviations, as in a group norm (``group_norm_form`` says why). The input itself
  is never permuted: in static int8 a permute of a quantized conv's output makes XNNPACK 1.5.1 fail to
  propagate shapes at run time.
* An instance norm with running statistics (``use_input_stats=False``: ``track_running_stats`` in eval)
  is ``x * scale + shift`` per channel, with ``scale = weight / sqrt(running_var + eps)`` and ``shift =
  bias - running_mean * scale`` computed once (PyTorch's inference batch norm computes the same).

One with input statistics and running statistics (exported in training mode, it would update them) is
left as it was.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import torch

from xnnguard.graph.args import schema_arguments
from xnnguard.rewrite.constants import constant_value
from xnnguard.rewrite.dtypes import is_half
from xnnguard.rewrite.norm.base import (
    Form,
    NormRewritePass,
    Operand,
    affine_operand,
    dtype_of,
    eps_constant,
    shaped,
)
from xnnguard.rewrite.norm.group_norm import group_norm_form
from xnnguard.rewrite.reduce.forms import second_moment, stage_rule, sum_weights, trailing_sum
from xnnguard.rewrite.reduce.plan import chain_stages, stages

__all__ = ["RewriteInstanceNormPass"]

_aten = torch.ops.aten


def _channel_shape(x: torch.fx.Node) -> list[int]:
    """``(C, 1, ..., 1)``: a per-channel operand broadcast against ``x``'s ``(N, C, *S)``."""
    shape = x.meta["val"].shape
    return [int(shape[1]), *([1] * (len(shape) - 2))]


def _running_stats_form(graph_module: torch.fx.GraphModule, arguments: Mapping[str, object]) -> Form | str:
    x = arguments["input"]
    assert isinstance(x, torch.fx.Node)
    mean, var = (constant_value(graph_module, arguments[name]) for name in ("running_mean", "running_var"))
    weight, bias = (arguments.get(name) for name in ("weight", "bias"))
    dtype = dtype_of(x)
    weight_value = constant_value(graph_module, weight) if weight is not None else torch.ones(1)
    bias_value = constant_value(graph_module, bias) if bias is not None else torch.zeros(1)
    eps = arguments.get("eps")
    if mean is None or var is None or weight_value is None or bias_value is None:
        return "its running statistics or affine weights are not computed from parameters alone"
    if not isinstance(eps, float | int):
        return "its eps is not a constant"
    shape = _channel_shape(x)
    with torch.no_grad():  # in float32, as PyTorch computes a float16 batch norm, rounded once to x's dtype
        weight_value, bias_value, mean, var = (v.to(torch.float32) for v in (weight_value, bias_value, mean, var))
        scale = weight_value / torch.sqrt(var + float(eps))
        shift = bias_value - mean * scale
    scale, shift = (value.to(dtype).reshape(shape).clone() for value in (scale, shift))
    return (lambda x_, scale_, shift_: x_ * scale_ + shift_), [x, scale, shift]


def _batch_stats_form(graph_module: torch.fx.GraphModule, arguments: Mapping[str, object]) -> Form | str:
    """``d * scale + bias`` per channel, the statistics of each channel over batch and positions."""
    x = arguments["input"]
    assert isinstance(x, torch.fx.Node)
    shape = x.meta["val"].shape
    eps = arguments.get("eps")
    if len(shape) < 2 or not all(isinstance(size, int) for size in shape):
        return "its batch is dynamic: the statistics span the batch"
    if not isinstance(eps, float | int):
        return "its eps is not a constant"
    if shape[0] == 1:
        return group_norm_form(graph_module, x, int(shape[1]), arguments.get("weight"), arguments.get("bias"), eps)
    batch, channels = int(shape[0]), int(shape[1])
    positions = tuple(int(size) for size in shape[2:])
    channel = _channel_shape(x)
    dtype = dtype_of(x)
    rule = stage_rule(dtype)
    scale = affine_operand(graph_module, arguments.get("weight"), channel)
    shift = affine_operand(graph_module, arguments.get("bias"), channel)
    inner = len(chain_stages(positions, *rule))
    averages = sum_weights([*chain_stages(positions, *rule), *stages(batch, *rule)],
                           1.0 / (batch * math.prod(positions)), dtype)
    constants: list[Operand] = [torch.ones(channel, dtype=dtype) if scale is None else scale,
                                torch.zeros(channel, dtype=dtype) if shift is None else shift]

    def channel_mean(t: torch.Tensor, weights: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The mean of each channel of ``(N, C, *S)`` over batch and positions, at ``(C, 1, ..., 1)``."""
        per_sample = trailing_sum(t, positions, weights[:inner], [batch, channels])
        return trailing_sum(per_sample.permute(1, 0), (batch,), weights[inner:], channel)

    def batch_norm(x_: torch.Tensor, eps_: torch.Tensor, weight_: torch.Tensor, bias_: torch.Tensor,
                   *weights: torch.Tensor) -> torch.Tensor:
        if is_half(x_.dtype):  # as xnnguard.rewrite.norm.base.statistics: shifted, scaled, d * scale + bias
            shifted = x_ - x_[(slice(0, 1), slice(None), *[slice(0, 1)] * len(positions))]
            centered = shifted - channel_mean(shifted, weights)
            q, s = second_moment(centered, lambda t: channel_mean(t, weights))
            per_channel = torch.rsqrt(q + eps_ / s / s) / s * shaped(weight_, channel)
            return centered * per_channel + shaped(bias_, channel)
        centered = x_ - channel_mean(x_, weights)
        per_channel = torch.rsqrt(channel_mean(centered * centered, weights) + eps_) * shaped(weight_, channel)
        return centered * per_channel + shaped(bias_, channel)

    return batch_norm, [x, eps_constant(float(eps), dtype), *constants, *averages]


class RewriteInstanceNormPass(NormRewritePass):
    """Replaces each instance norm and each batch norm with batch statistics by linears and elementwise ops."""

    subject = "instance norm"
    targets: ClassVar[dict[object, bool]] = {
        _aten.instance_norm.default: False,
        _aten.batch_norm.default: False,
        _aten._native_batch_norm_legit.no_stats: True,
    }

    def picks(self, node: torch.fx.Node) -> bool:
        if not super().picks(node):
            return False
        if node.target is _aten.batch_norm.default:  # only with batch statistics: inference ones are XNNPACK's
            arguments = schema_arguments(node) or {}
            return bool(arguments.get("training")) and arguments.get("running_mean") is None
        return True

    def form(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> Form | str:
        arguments = schema_arguments(node) or {}
        x = arguments["input"]
        assert isinstance(x, torch.fx.Node)
        has_running_stats = arguments.get("running_mean") is not None or arguments.get("running_var") is not None
        if node.target is _aten.instance_norm.default:
            if not arguments.get("use_input_stats"):
                return _running_stats_form(graph_module, arguments)
            if has_running_stats:
                return "it normalizes with input statistics and updates running ones (a model in training mode)"
            shape = x.meta["val"].shape
            if len(shape) < 2 or not isinstance(shape[1], int):
                return "its channels are dynamic"
            return group_norm_form(graph_module, x, int(shape[1]), arguments.get("weight"), arguments.get("bias"),
                                   arguments.get("eps"))
        if node.target is _aten._native_batch_norm_legit.no_stats and not arguments.get("training"):
            return "a batch norm without statistics that does not use the batch's own"
        return _batch_stats_form(graph_module, arguments)
