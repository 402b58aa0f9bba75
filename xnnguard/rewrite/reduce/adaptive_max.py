"""Adaptive max pooling over (H, W) as a max pooling, or as maxima of its windows, which XNNPACK runs.

Invariant established: no ``adaptive_max_pool2d`` whose indices are unused and whose height and width are
static is left. It is not in PyTorch's core ATen opset and nothing decomposes it: ExecuTorch 1.5.1's
``to_edge`` refuses the program (``SpecViolationError: aten.adaptive_max_pool2d.default is not in Core
ATen opset``), stock too, so an ``nn.AdaptiveMaxPool2d`` head could not be lowered at all.

Output cell ``i`` of a dim of length ``L`` pooled to ``n`` is the max over ``[floor(i L / n), ceil((i + 1) L / n))``
(PyTorch's windows). Where ``n`` divides ``L`` in both dims the windows are those of a max pooling with
kernel and stride ``L / n``, the form 1.5.1's ``MaxPool2dConfig`` takes; elsewhere each dim is pooled in
turn (a window of the (H, W) grid is a row window times a column window), each cell an ``amax`` over
its window's slice and the cells concatenated, and ``RewriteExtremumPass`` then writes each ``amax`` as
``maximum`` of slices. Exact: a max is one of its elements. int8: the stock XNNPACK quantizer leaves an
adaptive max pooling float, so the pieces stay float.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import user_kept_out

__all__ = ["RewriteAdaptiveMaxPoolPass", "adaptive_max_form", "adaptive_windows"]

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


def adaptive_max_form(x: torch.Tensor, output_size: tuple[int, int]) -> torch.Tensor:
    """``F.adaptive_max_pool2d(x, output_size)`` (values) with a max pooling, or maxima of slices."""
    (h, w), (oh, ow) = x.shape[-2:], output_size
    if h % oh == 0 and w % ow == 0 and (h // oh, w // ow) != (1, 1):
        kernel = (h // oh, w // ow)
        return F.max_pool2d(x, kernel, kernel)
    return _max_over_windows(_max_over_windows(x, x.dim() - 2, oh), x.dim() - 1, ow).contiguous()


def _output_size(node: torch.fx.Node, x: torch.Tensor) -> tuple[int, int] | None:
    size = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
    sizes = list(size) if isinstance(size, (list, tuple)) else [size, size]
    if len(sizes) != 2:
        return None
    resolved = [x.shape[x.dim() - 2 + i] if s is None else s for i, s in enumerate(sizes)]
    height, width = resolved
    if isinstance(height, int) and isinstance(width, int) and height > 0 and width > 0:
        return height, width
    return None


class RewriteAdaptiveMaxPoolPass(NodeRewritePass):
    """Replaces ``adaptive_max_pool2d(x, size)[0]`` by a max pooling or by the maxima of its windows."""

    rule = Rule.NOT_REWRITTEN
    subject = "adaptive max pooling"
    pieces_stay_float = True  # the XNNPACK quantizer leaves adaptive_max_pool2d float
    left_op_fails = "ExecuTorch 1.5.1's to_edge refuses it (not in the core ATen opset)"

    def picks(self, node: torch.fx.Node) -> bool:
        return (node.op == "call_function" and node.target is _aten.adaptive_max_pool2d.default
                and not user_kept_out(node))

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        used = [user for user in node.users if user.users or user.op != "call_function"]
        if any(user.target is not operator.getitem or user.args[1] != 0 for user in used):
            return "its indices are used"
        x = node.args[0]
        value = tensor_value(x)
        if not isinstance(x, torch.fx.Node) or value is None or value.dim() not in (3, 4):
            return "its input is not a 3-D or 4-D tensor"
        if not all(isinstance(s, int) for s in value.shape[-2:]):
            return f"dynamic height or width {tuple(value.shape[-2:])}: its windows need static sizes"
        size = _output_size(node, value)
        if size is None:
            return "its output size is not static"
        output = splice_before(graph_module, node, lambda x_: adaptive_max_form(x_, size), [x])
        for user in [user for user in node.users if user.target is operator.getitem and user.args[1] == 0]:
            user.replace_all_uses_with(output)
            graph_module.graph.erase_node(user)
        return None
