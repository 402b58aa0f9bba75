"""Sums, means, variances and vector norms over any dims of a tensor of at most 6 dims, as linears XNNPACK runs.

Invariant established: no float32 or float16 ``sum``, ``mean``, ``var``, ``std`` or ``linalg_vector_norm``
(ord 1 or 2) over static dims of a tensor within XNNPACK's rank limit is left, except the mean XNNPACK 1.5.1 takes
itself as global average pooling (4-D, dims (2, 3), ``keepdim``; ``MeanKeepdimPass`` writes every 4-D
mean over (2, 3) so). ExecuTorch 1.5.1's XNNPACK partitioner has no config for sum, var or norms and takes a mean
in that one form only, so each ran on portable kernels between two delegates.

The form (``xnnguard.rewrite.reduce.plan``): the reduced dims permuted behind the kept ones (only when
they do not trail already), each summed by a ``linear`` against a constant vector (ones; ``1/K`` in the
last one for a mean), the last linear's output viewed as the op's output (``keepdim`` or not); a sum or
mean over dims of size 1 only (S3D's head on a small input) is a view of its input. A
variance is ``sum((x - mean)^2) / (K - correction)``, two-pass like PyTorch's, so the subtraction sees
the mean, not a cancelling difference of large sums; ``std`` its ``sqrt``; a 2-norm ``sqrt(sum(x*x))``,
a 1-norm ``sum(abs(x))``. Why it is exact: the same elements summed in another order (one rounding per
partial sum), and ``1/K`` rounded once. In float16 every stage is a scaled mean and the squares are of
``x / s`` (``xnnguard.rewrite.dtypes`` says why): a variance is ``q * K/(K - correction) * s * s``, a
2-norm ``sqrt(q) * s * sqrt(K)``, each overflowing only where PyTorch's float16 result does.

A mean over trailing dims one of which is dynamic (S3D's head over a clip's frames) is XNNPACK's global
average pooling of the input viewed as ``(K, 1, -1, I)`` (``dynamic_mean_form``). Other reductions over a
dynamic dim are left.

int8: the stock XNNPACK quantizer leaves sum, var, std and norms float, so their pieces stay float. A
mean is one of its share ops: quantized only when its input is, then at its input's scale. The pieces of
a mean stay float too, and their output is quantized at the input's scale
(``shares_input_quantization``): one rounding, where and as the original mean has it (a quantized
``linear`` would round at a scale of its own, and in dynamic mode where the original does not at all).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from xnnguard.graph.args import schema_arguments
from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.dtypes import is_half, rewritten_float
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import high_rank, user_kept_out
from xnnguard.rewrite.reduce.forms import (
    contiguous_view,
    dynamic_rows_mean,
    dynamic_rows_weights,
    reshape_to,
    second_moment,
    shifted_deviations,
    stage_rule,
    sum_weights,
    trailing_sum,
)
from xnnguard.rewrite.reduce.keepdim_mean import is_mean_over_height_and_width
from xnnguard.rewrite.reduce.plan import SumPlan, data_dims, reduced_dims, sum_plan

__all__ = ["Reduction", "RewriteSumPass", "read_reduction", "reduction_function"]

_aten = torch.ops.aten

Kind = Literal["sum", "mean", "var", "std", "norm1", "norm2"]

# op -> the reduction it computes (var/std read ``correction`` or ``unbiased``; norms read ``ord``)
_KINDS: dict[object, Kind] = {
    _aten.sum.dim_IntList: "sum",
    _aten.sum.default: "sum",
    _aten.mean.dim: "mean",
    _aten.mean.default: "mean",
    _aten.var.correction: "var",
    _aten.var.dim: "var",
    _aten.var.default: "var",
    _aten.std.correction: "std",
    _aten.std.dim: "std",
    _aten.std.default: "std",
    _aten.linalg_vector_norm.default: "norm2",
}


@dataclass(frozen=True)
class Reduction:
    kind: Kind
    dims: list[int]
    keepdim: bool
    correction: float = 0.0


def _correction(arguments: Mapping[str, object]) -> float | None:
    if "correction" in arguments:
        value = arguments["correction"]
        return 1.0 if value is None else float(value) if isinstance(value, (int, float)) else None
    return 1.0 if arguments.get("unbiased", True) else 0.0


def read_reduction(node: torch.fx.Node) -> Reduction | str:
    """What ``node`` reduces, or why this pass cannot say."""
    kind = _KINDS[node.target]
    arguments = schema_arguments(node) or {}
    x = tensor_value(arguments.get("input"))
    assert x is not None  # picks checked it
    dims = reduced_dims(arguments.get("dim"), x.dim())
    if dims is None:
        return "its dims are not constants"
    if arguments.get("dtype") not in (None, x.dtype):
        return f"it accumulates in {arguments['dtype']}"
    correction = 0.0
    if kind in ("var", "std"):
        found = _correction(arguments)
        if found is None:
            return "its correction is not a constant"
        correction = found
    if node.target is _aten.linalg_vector_norm.default:
        order = arguments.get("ord", 2)
        if order not in (1, 2, 1.0, 2.0):
            return f"a vector norm of order {order} (1 and 2 are rewritten)"
        kind = "norm1" if order in (1, 1.0) else "norm2"
    return Reduction(kind, dims, bool(arguments.get("keepdim", False)), correction)


def _output_sizes(x: torch.Tensor, reduction: Reduction) -> list[int | torch.SymInt]:
    if reduction.keepdim:
        return [1 if d in reduction.dims else x.shape[d] for d in range(x.dim())]
    return [x.shape[d] for d in range(x.dim()) if d not in reduction.dims]


def reduction_function(
    reduction: Reduction, plan: SumPlan, dtype: torch.dtype = torch.float32
) -> tuple[Callable[..., torch.Tensor], list[torch.Tensor]]:
    """``(f, constants)``: ``f(x, *constants)`` computes ``reduction`` of ``x`` (of ``dtype``) with linears
    (plain PyTorch)."""
    half = is_half(dtype)
    scale = {"sum": 1.0, "norm1": 1.0, "norm2": 1.0, "mean": 1.0 / plan.k}.get(reduction.kind)
    if half and reduction.kind in ("norm2", "var", "std"):  # means only: see second_moment
        constants = sum_weights(plan.stages, 1.0 / plan.k, dtype)
    elif scale is not None:
        constants = sum_weights(plan.stages, scale, dtype)
    else:  # var, std: a mean, then the sum of squared deviations over K - correction
        unbiased = 1.0 / (plan.k - reduction.correction)
        constants = sum_weights(plan.stages, 1.0 / plan.k, dtype) + sum_weights(plan.stages, unbiased, dtype)
    count = len(plan.stages)

    def f(x: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        out = _output_sizes(x, reduction)
        gathered = x.permute(plan.perm) if plan.perm is not None else x
        if reduction.kind in ("sum", "mean"):
            return trailing_sum(gathered, plan.sizes, weights, out)
        if reduction.kind == "norm1":
            return trailing_sum(torch.abs(gathered), plan.sizes, weights, out)
        if half:
            return reshape_to(_half_second_moment(gathered, reduction, plan, weights), out)
        if reduction.kind == "norm2":
            return torch.sqrt(trailing_sum(gathered * gathered, plan.sizes, weights, out))
        centered = gathered - trailing_sum(gathered, plan.sizes, weights[:count])
        total = trailing_sum(centered * centered, plan.sizes, weights[count:], out)
        return torch.sqrt(total) if reduction.kind == "std" else total

    return f, constants


def _half_second_moment(gathered: torch.Tensor, reduction: Reduction, plan: SumPlan,
                        means: Sequence[torch.Tensor]) -> torch.Tensor:
    """A float16 2-norm, variance or standard deviation (keepdim), from ``second_moment``."""

    def mean(t: torch.Tensor) -> torch.Tensor:
        return trailing_sum(t, plan.sizes, means)

    if reduction.kind == "norm2":
        q, s = second_moment(gathered, mean)
        return torch.sqrt(q) * s * math.sqrt(plan.k)
    centered, _ = shifted_deviations(gathered, len(plan.sizes), mean)
    q, s = second_moment(centered, mean)
    q = q * (plan.k / (plan.k - reduction.correction))
    return torch.sqrt(q) * s if reduction.kind == "std" else q * s * s


def dynamic_mean_form(
    shape: Sequence[int | torch.SymInt], reduction: Reduction, dtype: torch.dtype
) -> tuple[Callable[..., torch.Tensor], list[torch.Tensor]] | None:
    """A mean over trailing dims one of which is dynamic (a clip's frames), the others static: ``(f,
    constants)``, or None when the mean is not of that kind.

    The input viewed as ``(K, 1, -1, I)``, ``K`` the kept elements, ``I`` the static ones behind the dynamic
    dim, and ``dynamic_rows_mean`` of it.
    """
    dynamic = [d for d, size in enumerate(shape) if not isinstance(size, int)]
    dims = sorted(reduction.dims)
    if len(dynamic) != 1 or dynamic[0] not in dims or dims != list(range(dims[0], len(shape))):
        return None
    kept = math.prod(int(size) for size in shape[: dims[0]])
    inner = math.prod(int(size) for size in shape[dynamic[0] + 1:])

    def f(x: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        return dynamic_rows_mean(x.reshape(kept, 1, -1, inner), inner, weights).reshape(_output_sizes(x, reduction))

    return f, dynamic_rows_weights(inner, dtype)


class RewriteSumPass(NodeRewritePass):
    """Replaces each sum/mean/var/std/vector norm by a permute (if needed), reshape, linears, reshape."""

    rule = Rule.NOT_REWRITTEN
    subject = "reduction"
    pieces_stay_float = True  # and a mean's output keeps its input's quantization: shares_input_quantization

    def picks(self, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node.target not in _KINDS or user_kept_out(node) or high_rank(node):
            return False
        x = tensor_value(node.args[0])
        out = tensor_value(node)
        if x is None or out is None or x.dim() == 0:
            return False
        return x.dtype == out.dtype and rewritten_float(x.dtype) and not is_mean_over_height_and_width(node)

    def shares_input_quantization(self, node: torch.fx.Node) -> bool:
        return _KINDS.get(node.target) == "mean"

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        reduction = read_reduction(node)
        if isinstance(reduction, str):
            return reduction
        x = node.args[0]
        assert isinstance(x, torch.fx.Node)
        shape = x.meta["val"].shape
        if reduction.kind in ("sum", "mean") and not data_dims(shape, reduction.dims):
            output = splice_before(  # a sum or mean of one element is that element: a view
                graph_module, node, lambda x_: contiguous_view(x_, _output_sizes(x_, reduction)), [x]
            )
            node.replace_all_uses_with(output)
            return None
        dtype = x.meta["val"].dtype
        plan = sum_plan(shape, reduction.dims, *stage_rule(dtype))
        if isinstance(plan, str) and reduction.kind == "mean":
            form = dynamic_mean_form(shape, reduction, dtype)
            if form is not None:
                function, constants = form
                node.replace_all_uses_with(splice_before(graph_module, node, function, [x, *constants]))
                return None
        if isinstance(plan, str):
            return plan
        if reduction.kind in ("var", "std") and plan.k - reduction.correction <= 0:
            return f"a correction of {reduction.correction} over {plan.k} elements divides by zero or less"
        function, constants = reduction_function(reduction, plan, dtype)
        output = splice_before(graph_module, node, function, [x, *constants])
        node.replace_all_uses_with(output)
        return None
