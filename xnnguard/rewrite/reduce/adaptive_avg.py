"""Adaptive average pooling over (H, W), and with uneven windows over (D, H, W), in forms XNNPACK runs.

Invariant established: no ``adaptive_avg_pool2d`` over static (H, W) to a grid other than 1 x 1 (which
PyTorch computes as a mean) and no ``adaptive_avg_pool3d`` over static dims, one of which its output size
does not divide, is left. ExecuTorch 1.5.1 has no XNNPACK config for ``_adaptive_avg_pool2d``, so it
ran on portable kernels between two delegates (fuzz seeds 21 and 155, stock too); the 3-D one has no
kernel at all (an even one ``RewritePool3dPass`` writes as 2-D poolings).

Where the output size divides the input's along both dims, the windows are those of an average pooling
with kernel and stride ``L / n``: ``avg_pool2d`` in the one form 1.5.1's ``AvgPoolingConfig`` takes.
Otherwise the pooling is separable: output cell ``i`` of a dim of length ``L`` pooled to ``n`` is the mean
over ``[floor(i L / n), ceil((i + 1) L / n))``, one window per dim, so it is one ``linear`` per pooled dim
against an ``(n, L)`` matrix of ``1 / window length`` over each window (the dim moved last for it and
back). Exact up to float rounding: the same elements summed in another order, each weight rounded once.

int8: the stock XNNPACK quantizer quantizes ``adaptive_avg_pool2d`` as a share op (its output at its
input's scale); the pieces stay float and their result takes its input's quantization
(``shares_input_quantization``): the one rounding the original op has.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import user_kept_out
from xnnguard.rewrite.reduce.adaptive_max import adaptive_output_size, adaptive_windows

__all__ = ["RewriteAdaptiveAvgPoolPass", "adaptive_avg_form", "pooling_matrix"]

_aten = torch.ops.aten

_POOLED_DIMS = {
    _aten.adaptive_avg_pool2d.default: 2,
    _aten._adaptive_avg_pool2d.default: 2,
    _aten.adaptive_avg_pool3d.default: 3,
    _aten._adaptive_avg_pool3d.default: 3,
}


def pooling_matrix(length: int, out: int, dtype: torch.dtype) -> torch.Tensor:
    """The ``(out, length)`` matrix whose row ``i`` averages PyTorch's adaptive window ``i``."""
    matrix = torch.zeros(out, length, dtype=torch.float64)
    for i, (start, end) in enumerate(adaptive_windows(length, out)):
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix.to(dtype)


def adaptive_avg_form(x: torch.Tensor, dims: tuple[int, ...], *matrices: torch.Tensor) -> torch.Tensor:
    """``x`` pooled along each negative dim of ``dims`` by its ``pooling_matrix`` (the last dim first: it
    needs no move)."""
    for dim, matrix in sorted(zip(dims, matrices, strict=True), key=lambda pair: -pair[0]):
        x = F.linear(x, matrix) if dim == -1 else F.linear(x.movedim(dim, -1), matrix).movedim(-1, dim)
    return x.contiguous()


def _picked(node: torch.fx.Node) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(pooled lengths, output size) of an adaptive average pooling this pass rewrites, else None: a 2-D one
    that is not global, a 3-D one with an uneven dim, over static pooled dims."""
    if node.op != "call_function" or node.target not in _POOLED_DIMS:
        return None
    pooled = _POOLED_DIMS[node.target]
    x = tensor_value(node.args[0])
    if x is None or x.dim() not in (pooled + 1, pooled + 2):
        return None
    lengths = tuple(x.shape[-pooled:])
    size = adaptive_output_size(node, x, pooled)
    if size is None or not all(isinstance(length, int) for length in lengths):
        return None
    even = all(length % out == 0 for length, out in zip(lengths, size, strict=True))
    if (pooled == 3 and even) or all(out == 1 for out in size):  # RewritePool3dPass's; a mean
        return None
    return tuple(int(length) for length in lengths), size


class RewriteAdaptiveAvgPoolPass(NodeRewritePass):
    """Replaces each such adaptive average pooling by an average pooling (even windows) or linears."""

    rule = Rule.NOT_REWRITTEN
    subject = "adaptive average pooling"
    pieces_stay_float = True  # and the result keeps its input's quantization: shares_input_quantization

    def picks(self, node: torch.fx.Node) -> bool:
        return _picked(node) is not None and not user_kept_out(node)

    def shares_input_quantization(self, node: torch.fx.Node) -> bool:
        return True

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        found = _picked(node)
        assert found is not None
        x = node.args[0]
        assert isinstance(x, torch.fx.Node)
        dtype = x.meta["val"].dtype
        lengths, size = found
        if all(length % out == 0 for length, out in zip(lengths, size, strict=True)):  # 2-D: even windows
            kernel = tuple(length // out for length, out in zip(lengths, size, strict=True))
            output = splice_before(graph_module, node, lambda x_: F.avg_pool2d(x_, kernel, kernel), [x])
            _disown_pieces(graph_module, output, x)
            node.replace_all_uses_with(output)
            return None
        # a dim kept at its length takes no linear
        dims = tuple(i - len(size) for i, (length, out) in enumerate(zip(lengths, size, strict=True)) if out != length)
        matrices = [pooling_matrix(lengths[d], size[d], dtype) for d in dims]

        def replacement(x_: torch.Tensor, *matrices_: torch.Tensor) -> torch.Tensor:
            return adaptive_avg_form(x_, dims, *matrices_)

        output = splice_before(graph_module, node, replacement, [x, *matrices])
        _disown_pieces(graph_module, output, x)
        node.replace_all_uses_with(output)
        return None


def _disown_pieces(graph_module: torch.fx.GraphModule, output: torch.fx.Node, x: torch.fx.Node) -> None:
    """``_disown_the_pooling_module`` for every node between ``x`` and ``output`` (the form's pieces)."""
    pending, seen = [output], set()
    while pending:
        piece = pending.pop()
        if piece in seen or piece is x:
            continue
        seen.add(piece)
        _disown_the_pooling_module(piece)
        pending.extend(piece.all_input_nodes)


def _disown_the_pooling_module(piece: torch.fx.Node) -> None:
    """The stock annotator finds an ``nn.AdaptiveAvgPool2d`` by the source meta of its nodes (the module
    stack too, since torch 2.13) and raises when that source's output is not the op itself: the pieces
    keep the enclosing modules only (they stay float: no module filter needs to reach them)."""
    piece.meta.pop("source_fn_stack", None)
    piece.meta.pop("torch_fn", None)
    stack = piece.meta.get("nn_module_stack")
    if stack:
        innermost = list(stack)[-1]
        _, module_type = stack[innermost]
        if "AdaptiveAvgPool" in str(module_type):
            piece.meta["nn_module_stack"] = {k: v for k, v in stack.items() if k != innermost}
