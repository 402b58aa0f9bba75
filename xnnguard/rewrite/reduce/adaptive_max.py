"""Adaptive max pooling over (H, W) or (D, H, W) as a max pooling, or as maxima of its windows, which XNNPACK runs.

Invariant established: no ``adaptive_max_pool2d`` or ``adaptive_max_pool3d`` whose indices are unused and
whose pooled dims are static is left. Neither is in PyTorch's core ATen opset and nothing decomposes them:
ExecuTorch 1.5.1's ``to_edge`` refuses the program (``SpecViolationError: aten.adaptive_max_pool2d.default
is not in Core ATen opset``, the same for 3-D), stock too, so an ``nn.AdaptiveMaxPool2d`` or
``nn.AdaptiveMaxPool3d`` could not be lowered at all.

Output cell ``i`` of a dim of length ``L`` pooled to ``n`` is the max over ``[floor(i L / n), ceil((i + 1) L / n))``
(PyTorch's windows). Where ``n`` divides ``L`` in every pooled dim the windows are those of a max pooling
with kernel and stride ``L / n``: for 2-D the form 1.5.1's ``MaxPool2dConfig`` takes, for 3-D a
``max_pool3d`` that ``RewritePool3dPass`` (which runs after this pass) writes as 2-D poolings. Elsewhere
each dim is pooled in turn (a window of the grid is the product of one window per dim), each cell an
``amax`` over its window's slice and the cells concatenated, and ``RewriteExtremumPass`` then writes each
``amax`` as ``maximum`` of slices. Exact: a max is one of its elements. int8: the stock XNNPACK quantizer
leaves an adaptive max pooling float, so the pieces stay float.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xnnguard.graph.ops import values_only_users
from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import user_kept_out

__all__ = ["RewriteAdaptiveMaxPoolPass", "adaptive_max_form", "adaptive_output_size", "adaptive_windows"]

_aten = torch.ops.aten


def adaptive_windows(length: int, out: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive pooling windows ``[start, end)`` of a dim of ``length`` pooled to ``out`` cells."""
    return [((i * length) // out, -((-(i + 1) * length) // out)) for i in range(out)]


def _max_over_windows(x: torch.Tensor, dim: int, out: int) -> torch.Tensor:
    length = x.shape[dim]
    if out == length:
        return x
    cells = [x.narrow(dim, start, end - start).amax(dim, keepdim=True) for start, end in adaptive_windows(length, out)]
    return cells[0] if len(cells) == 1 else torch.cat(cells, dim)


def adaptive_max_form(x: torch.Tensor, output_size: tuple[int, ...]) -> torch.Tensor:
    """``F.adaptive_max_pool2d`` / ``3d(x, output_size)`` (values, by ``len(output_size)``) with a max pooling,
    or maxima of slices."""
    pooled = len(output_size)
    lengths = x.shape[-pooled:]
    if all(length % out == 0 for length, out in zip(lengths, output_size, strict=True)):
        kernel = tuple(length // out for length, out in zip(lengths, output_size, strict=True))
        if any(k != 1 for k in kernel):
            return F.max_pool2d(x, kernel, kernel) if pooled == 2 else F.max_pool3d(x, kernel, kernel)
    for i, out in enumerate(output_size):
        x = _max_over_windows(x, x.dim() - pooled + i, out)
    return x.contiguous()


def adaptive_output_size(node: torch.fx.Node, x: torch.Tensor, pooled: int) -> tuple[int, ...] | None:
    """The static output size of an adaptive pooling over ``pooled`` trailing dims of ``x`` (None kept at the
    input's size), or None when it is not static."""
    size = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
    sizes = list(size) if isinstance(size, (list, tuple)) else [size] * pooled
    if len(sizes) != pooled:
        return None
    resolved = [x.shape[x.dim() - pooled + i] if s is None else s for i, s in enumerate(sizes)]
    static = [s for s in resolved if isinstance(s, int) and s > 0]
    return tuple(static) if len(static) == pooled else None


_POOLED_DIMS = {_aten.adaptive_max_pool2d.default: 2, _aten.adaptive_max_pool3d.default: 3}


class RewriteAdaptiveMaxPoolPass(NodeRewritePass):
    """Replaces ``adaptive_max_pool2d`` / ``3d(x, size)[0]`` by a max pooling or by the maxima of its windows."""

    rule = Rule.NOT_REWRITTEN
    subject = "adaptive max pooling"
    pieces_stay_float = True  # the XNNPACK quantizer leaves adaptive max pooling float
    left_op_fails = "ExecuTorch 1.5.1's to_edge refuses it (not in the core ATen opset)"

    def picks(self, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and node.target in _POOLED_DIMS and not user_kept_out(node)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        values_users = values_only_users(node)
        if values_users is None:
            return "its indices are used"
        pooled = _POOLED_DIMS[node.target]  # type: ignore[index]
        x = node.args[0]
        value = tensor_value(x)
        if not isinstance(x, torch.fx.Node) or value is None or value.dim() not in (pooled + 1, pooled + 2):
            return f"its input is not a {pooled + 1}-D or {pooled + 2}-D tensor"
        if not all(isinstance(s, int) for s in value.shape[-pooled:]):
            return f"dynamic pooled dims {tuple(value.shape[-pooled:])}: its windows need static sizes"
        size = adaptive_output_size(node, value, pooled)
        if size is None:
            return "its output size is not static"
        output = splice_before(graph_module, node, lambda x_: adaptive_max_form(x_, size), [x])
        for user in values_users:
            user.replace_all_uses_with(output)
            graph_module.graph.erase_node(user)
        return None
