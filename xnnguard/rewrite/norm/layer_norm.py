"""Layer norms and RMS norms as fully connected, elementwise and ``rsqrt`` ops XNNPACK runs.

Invariant established: no float32 or float16 ``layer_norm`` / ``native_layer_norm`` (its mean and rstd
unused) or ``rms_norm`` over static normalized dims of a tensor within XNNPACK's rank limit is left. ExecuTorch
1.5.1's XNNPACK partitioner has no config for either, so every transformer block (MViT, Swin3D,
VideoMAE, Hiera, Qwen2-VL's vision tower) ran two of them on portable kernels, each between two
delegates.

A layer norm normalizes its trailing ``normalized_shape`` dims: ``statistics``
(``xnnguard.rewrite.norm.base``) over them, on the input as it is (the linears take any leading dims, a
dynamic batch or sequence too), then ``(x - mean) * rstd * weight + bias``; over single elements
(fuzz seed 157) ``(x - x) / sqrt(eps) * weight + bias``, its bias where ``x`` is finite and NaN where
not, as PyTorch's. An RMS norm is
``x * rsqrt(sum(x * x, 1/K) + eps) * weight`` (over single elements, fuzz seed 38, the mean of the
squares is the square itself; ``eps`` None: float32's machine epsilon, as PyTorch
does, also in float16, which it computes in float32); in float16 the mean of squares is taken without
overflow (``xnnguard.rewrite.norm.base``). Above 6 dims, ``ReduceRankPass`` (which runs first) merges the leading dims.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from xnnguard.graph.args import int_list, schema_arguments
from xnnguard.rewrite.dtypes import is_half
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
from xnnguard.rewrite.reduce.forms import second_moment, stage_rule, sum_weights, trailing_sum
from xnnguard.rewrite.reduce.plan import SumPlan

__all__ = ["RewriteLayerNormPass", "RewriteRmsNormPass"]

_aten = torch.ops.aten


def _trailing_plan(node: torch.fx.Node, normalized: list[int]) -> SumPlan | str:
    x = node.args[0]
    assert isinstance(x, torch.fx.Node)
    rule = stage_rule(dtype_of(x))
    shape = x.meta["val"].shape
    trailing = list(shape[len(shape) - len(normalized) :]) if len(normalized) <= len(shape) else None
    if not normalized or trailing != normalized:
        return f"its normalized shape {normalized} is not the input's trailing shape"
    if 0 in normalized or any(size == 0 for size in shape if isinstance(size, int)):
        return "it normalizes an empty tensor"
    if math.prod(normalized) == 1:
        return _SINGLE
    return SumPlan(None, tuple(normalized), *rule)


# A norm over one element has no sum to plan: its statistics are the element itself (a mean of one, a
# variance of 0), which the single-element forms below write directly.
_SINGLE = "it normalizes single elements"


def _eps(value: object, default: float) -> float | None:
    if value is None:
        return default
    return float(value) if isinstance(value, float | int) else None


class RewriteLayerNormPass(NormRewritePass):
    """Replaces each layer norm by linears against ``1/K``, ``sub``, ``mul``, ``add``, ``rsqrt``."""

    subject = "layer norm"
    targets: ClassVar[dict[object, bool]] = {_aten.layer_norm.default: False, _aten.native_layer_norm.default: True}

    def form(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> Form | str:
        arguments = schema_arguments(node) or {}
        normalized = int_list(arguments["normalized_shape"])
        plan = _trailing_plan(node, normalized)
        eps = _eps(arguments.get("eps"), 1e-5)
        if eps is None:
            return "its eps is not a constant"
        weight = affine_operand(graph_module, arguments.get("weight"), normalized)
        bias = affine_operand(graph_module, arguments.get("bias"), normalized)
        present: list[Operand] = [operand for operand in (weight, bias) if operand is not None]
        if plan == _SINGLE:
            # (x - mean) * rstd is 0 (NaN where x is not finite, as in PyTorch): x - x, times 1 / sqrt(eps)
            def single(x: torch.Tensor, rstd_: torch.Tensor, *affine: torch.Tensor) -> torch.Tensor:
                return _affine((x - x) * rstd_, list(affine), weight is not None, bias is not None, normalized)

            rstd = eps_constant(1.0 / math.sqrt(eps), dtype_of(node.args[0]))
            return single, [node.args[0], rstd, *present]  # type: ignore[list-item]
        if isinstance(plan, str):
            return plan
        dtype = dtype_of(node.args[0])
        averages = sum_weights(plan.stages, 1.0 / plan.k, dtype)
        count = len(averages)

        def layer_norm(x: torch.Tensor, eps_: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
            weights, affine = rest[:count], list(rest[count:])
            _, centered, rstd = statistics(x, plan, weights, eps_)
            return _affine(centered * rstd, affine, weight is not None, bias is not None, normalized)

        return layer_norm, [node.args[0], eps_constant(eps, dtype), *averages, *present]  # type: ignore[list-item]


def _affine(
    y: torch.Tensor, affine: list[torch.Tensor], weight: bool, bias: bool, normalized: list[int]
) -> torch.Tensor:
    """``y * weight + bias``, each if present (``affine`` holds the present ones, weight first)."""
    if weight:
        y = y * shaped(affine.pop(0), normalized)
    if bias:
        y = y + shaped(affine.pop(0), normalized)
    return y


class RewriteRmsNormPass(NormRewritePass):
    """Replaces each ``rms_norm`` by linears against ``1/K`` of the squares, ``add``, ``rsqrt``, ``mul``."""

    subject = "RMS norm"
    targets: ClassVar[dict[object, bool]] = {_aten.rms_norm.default: False}

    def form(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> Form | str:
        arguments = schema_arguments(node) or {}
        normalized = int_list(arguments["normalized_shape"])
        plan = _trailing_plan(node, normalized)
        eps = _eps(arguments.get("eps"), torch.finfo(torch.float32).eps)
        if isinstance(plan, str) and plan != _SINGLE:
            return plan
        if eps is None:
            return "its eps is not a constant"
        weight = affine_operand(graph_module, arguments.get("weight"), normalized)
        dtype = dtype_of(node.args[0])
        # over single elements (fuzz seed 6) the mean of the squares is the square itself
        averages = sum_weights(plan.stages, 1.0 / plan.k, dtype) if isinstance(plan, SumPlan) else []
        count = len(averages)

        def rms_norm(x: torch.Tensor, eps_: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
            weights, affine = rest[:count], rest[count:]

            def mean(t: torch.Tensor) -> torch.Tensor:
                return trailing_sum(t, plan.sizes, weights) if isinstance(plan, SumPlan) else t

            if is_half(x.dtype):
                q, s = second_moment(x, mean)
                y = x * (torch.rsqrt(q + eps_ / s / s) / s)
            else:
                y = x * torch.rsqrt(mean(x * x) + eps_)
            return y * shaped(affine[0], normalized) if weight is not None else y

        present: list[Operand] = [weight] if weight is not None else []
        return rms_norm, [node.args[0], eps_constant(eps, dtype), *averages, *present]  # type: ignore[list-item]
