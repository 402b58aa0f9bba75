"""XNNPACK runs bfloat16 in a few ops only: fully connected, elementwise and data movement.

This module is the one place that rule lives. ExecuTorch 1.5.1's XNNPACK configs take a bfloat16 node
only from a partitioner made with ``enable_bf16=True`` (``XNNPartitionerConfig``: "XNNPACK only supports
bf16 fully-connected on new enough revisions, so this stays off by default"; 1.4 has no such option and
takes none). With it, every config takes bfloat16 where it takes float32, and ``XNNCompiler.cpp`` maps
``xnn_datatype_bf16`` through, but the XNNPACK it pins (92a7ad501b, July 2026) has bfloat16 kernels for
few node types: a fully connected (``bf16_f32``, to which ExecuTorch's runtime adds a conversion back to
bfloat16), elementwise ops and moves. A convolution, softmax, batch matrix multiply, pooling, mean or
bilinear resize in bfloat16 is delegated and then fails at load (``Failed to create convolution node 1
with code: xnn_status_invalid_parameter``). Measured on 1.5.1, each op alone, with ``enable_bf16=True``:
``BFLOAT16_OPS`` loaded, ran and matched eager bfloat16; the others failed at load (or were not taken).

So a bfloat16 node whose op is not in ``BFLOAT16_OPS`` is kept out, whatever the partitioner's options;
one whose op is, the stock config decides: refused ("invalid dtype") unless ``enable_bf16=True``, which
``not_enabled`` says in the partitioner's record of it (``xnnguard.partition.outside``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xnnguard.graph.ops import is_op, op_of
from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rules.rule import RuleCheck, Scope

if TYPE_CHECKING:
    from torch.fx import Node

__all__ = ["BFLOAT16_OPS", "RULE", "is_bfloat16", "no_bfloat16_kernel", "not_enabled"]

# The ops ExecuTorch 1.5.1's XNNPACK ran in bfloat16 (each lowered alone with enable_bf16=True, loaded, run,
# matched): a fully connected; binary and unary elementwise ops; views, permutes, slices, cats, pads. And a
# linear's decomposition, addmm and mm, which no config takes in bfloat16 (so none fails either): a linear
# decomposes when its config refuses it, and its record then says why (``not_enabled``).
BFLOAT16_OPS = frozenset({
    "linear", "addmm", "mm", "add", "sub", "mul", "div", "maximum", "minimum",
    "relu", "hardtanh", "clamp", "abs", "neg", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "pow",
    "ceil", "floor", "sin", "cos", "gelu", "leaky_relu", "hardswish",
    "view_copy", "permute_copy", "slice_copy", "cat", "constant_pad_nd", "unsqueeze_copy",
    "_to_dim_order_copy", "_clone_dim_order", "clone",
})


def is_bfloat16(node: Node) -> bool:
    """True when ``node`` reads or computes a bfloat16 tensor."""
    import torch

    values = [tensor_value(node), *(tensor_value(arg) for arg in node.all_input_nodes)]
    return any(value is not None and value.dtype == torch.bfloat16 for value in values)


def no_bfloat16_kernel(node: Node) -> str | None:
    """Why XNNPACK cannot run the bfloat16 ``node``, or None (no bfloat16, or an op it runs in bfloat16)."""
    found = op_of(node)
    if found is None or is_op(node, BFLOAT16_OPS) or not is_bfloat16(node):
        return None
    return (f"bfloat16 {found[0]}: ExecuTorch 1.5.1's XNNPACK runs bfloat16 only in fully connected, elementwise "
            "and data-movement ops (a bfloat16 convolution, softmax, pooling or mean is taken with enable_bf16=True "
            "and fails at load)")


def not_enabled(node: Node, enable_bf16: bool | None) -> str | None:
    """Why a stock config refused the bfloat16 ``node`` as of an "invalid dtype", given its ``enable_bf16``
    (None: a release without that option), or None when that is not why."""
    if not is_bfloat16(node) or enable_bf16:
        return None
    if enable_bf16 is None:
        return "bfloat16: this ExecuTorch release's XNNPACK configs take no bfloat16 (1.5 does, with enable_bf16=True)"
    return ("bfloat16: ExecuTorch's XNNPACK configs take bfloat16 only from XnnpackPartitioner(enable_bf16=True); "
            f"XNNPACK then runs {op_of(node)[0]} in it")  # type: ignore[index]


RULE = RuleCheck(
    Rule.BFLOAT16,
    Scope.NODE,
    "a bfloat16 op XNNPACK has no bfloat16 kernel for (a convolution, softmax, pooling) is never delegated",
    lambda node, _context: no_bfloat16_kernel(node),
)
