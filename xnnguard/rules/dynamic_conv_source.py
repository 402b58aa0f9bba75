"""A dynamically quantized convolution must quantize a graph input or a ``cat``: where 1.5.1 looks for it.

Before serializing a delegate, 1.5.1's ``ChannelsLastTaggedReshapePass`` gives a convolution's input
the NHWC layout XNNPACK needs. For a dynamically quantized input (its dequantize reads scales a
``choose_qparams`` picked at run time) it does not convert the tensor the conv reads: it walks up from
the dequantize through each node's first argument while that is a node, converts the tensor where the
walk stops, and redirects *every* use of that tensor to the converted copy. The walk stops at the
tensor the conv quantizes only when that tensor is a graph input or a node whose first argument is not
a node (a ``cat``, which takes a list). Anywhere else it overshoots: behind a view it reaches a tensor
of another rank and the lowering fails ("required rank 4 tensor to use channels_last format") or the
delegate fails at init; behind any other op (``conv -> add -> conv``) it converts an earlier tensor
whose readers were already laid out, and the program runs with wrong numbers (measured: 76 % of the
output range off, stock and xnnguard alike, before this rule).

The overshoot is harmless only where the tensor the conv quantizes is NHWC already, since the pass then
converts nothing: where it comes from a conv or pooling, whose output XNNPACK holds channels-last,
through ops the pass keeps in their input's layout (unary elementwise ops, q/dq, slices, and binary ops
whose operands are all 4-D, which it converts to NHWC together). Anything else is taken to break the program,
and the convolution is not delegated as a dynamically quantized op: it runs on ExecuTorch's portable
kernels, with its quantization, and computes the right numbers. Measured breakages: a view (the
delegate fails at init, or its conv reads a tensor of other channels: a video VAE's norm behind a
frame fold), a scalar operand (``conv -> +1 -> conv``: 76 % of the range off), a per-channel gain of
shape (C, 1, 1) (``conv -> * gain -> conv``: 86 % off, with the same channel count, so XNNPACK reads
the NCHW tensor as NHWC without a word).
``xnnguard.XNNPACKQuantizer`` gives such a conv a ``cat`` input instead (``xnnguard.quantizer.dynamic_conv_input``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xnnguard.graph.ops import is_op
from xnnguard.report import Rule
from xnnguard.rules.rule import RuleCheck, Scope

if TYPE_CHECKING:
    import torch

__all__ = ["RULE", "dynamic_conv_source_violation", "is_dynamic_dequantize", "walk_misplaces"]

_DEQUANTIZE_OPS = frozenset({"dequantize_per_tensor", "dequantize_per_token", "dequantize_affine"})
_CHOOSE_QPARAMS_OPS = frozenset({"choose_qparams", "choose_qparams_affine", "choose_qparams_per_token_asymmetric"})


def is_dynamic_dequantize(node: object) -> bool:
    """A dequantize whose scale and zero point come from a ``choose_qparams`` (ExecuTorch's ``is_dynamic_qdq``)."""
    if not is_op(node, _DEQUANTIZE_OPS):
        return False
    params = getattr(node, "args", ())[1:3]
    return len(params) == 2 and all(_chosen_at_run_time(param) for param in params)


def _chosen_at_run_time(param: object) -> bool:
    sources = getattr(param, "all_input_nodes", ())
    return any(is_op(source, _CHOOSE_QPARAMS_OPS) for source in sources)


def _walk_ends_at(node: torch.fx.Node) -> torch.fx.Node:
    """Where ``ChannelsLastTaggedReshapePass`` stops walking up first arguments from ``node``."""
    while node.args and _is_node(node.args[0]):
        node = node.args[0]  # type: ignore[assignment]
    return node


def _is_node(value: object) -> bool:
    return hasattr(value, "all_input_nodes")


def _first_arg(node: object) -> object:
    args = getattr(node, "args", ())
    return args[0] if args else None


# Ops 1.5.1's pass keeps in the layout of their input: unary elementwise ops (ATen and edge names), q/dq,
# and a slice (its serializer moves the sliced dim to NHWC: a crop between two convs runs right, measured).
_KEEPS_LAYOUT = frozenset({
    "relu", "relu_", "hardtanh", "hardtanh_", "clamp", "sigmoid", "tanh", "gelu", "silu", "silu_", "hardswish",
    "hardswish_", "leaky_relu", "leaky_relu_", "elu", "neg", "abs",
    "quantize_per_tensor", "dequantize_per_tensor", "slice", "slice_copy",
})
_BINARY = frozenset({"add", "sub", "mul", "div", "add_", "sub_", "mul_", "div_"})
# XNNPACK's NHWC ops, in the edge program and (conv2d) in the ATen graph the quantizer sees
_CHANNELS_LAST = frozenset({"convolution", "conv2d", "max_pool2d", "max_pool2d_with_indices", "avg_pool2d"})


def _overshoot_breaks(quantized: torch.fx.Node, end: torch.fx.Node) -> bool:
    """False only where ``quantized`` is certainly NHWC when 1.5.1's pass reaches its conv, so nothing is converted.

    That is where the walk from ``quantized`` reaches a conv or pooling through ops that keep its NHWC
    output NHWC (``_keeps_layout``). A binary op with an operand that is not 4-D (a scalar, a gain of
    shape (C, 1, 1)) cannot be converted, so the pass lays the op out NCHW; a view, a permute, a linear
    and any op not known to keep the layout are taken to break it too (measured cases in the docstring).
    """
    node: object = quantized
    while node is not end and _is_node(node):
        if is_op(node, _CHANNELS_LAST):
            return False  # what it reads from here on is laid out already
        if not _keeps_layout(node):
            return True
        node = _first_arg(node)
    return True  # the walk reached where it converts without passing a conv: another tensor is converted


def _keeps_layout(node: object) -> bool:
    if is_op(node, _KEEPS_LAYOUT):
        return True
    if not is_op(node, _BINARY):
        return False
    operands = getattr(node, "args", ())[:2]
    return all(_is_node(operand) and getattr(operand.meta.get("val"), "ndim", None) == 4
               for operand in operands)


def walk_misplaces(quantized: torch.fx.Node) -> bool:
    """True when 1.5.1's walk up from a dynamically quantized conv input ``quantized`` breaks the program.

    Asked of the edge program by the partitioner, and of the ATen graph before annotation by the
    quantizer (``xnnguard.quantizer.dynamic_conv_input``), which then gives the conv a ``cat`` input.
    """
    end = _walk_ends_at(quantized)
    return end is not quantized and _overshoot_breaks(quantized, end)


def dynamic_conv_source_violation(node: torch.fx.Node) -> str | None:
    """Why ``node``, a convolution reading a dynamically quantized input, cannot be delegated; else None."""
    if not is_op(node, "convolution") or not is_dynamic_dequantize(_first_arg(node)):
        return None
    dequantize: torch.fx.Node = node.args[0]  # type: ignore[assignment]
    quantized = _first_arg(_first_arg(dequantize))
    if not _is_node(quantized) or not walk_misplaces(quantized):  # type: ignore[arg-type]
        return None
    end = _walk_ends_at(dequantize)
    return (
        f"its input {getattr(quantized, 'name', '?')} is dynamically quantized but is neither a graph input nor "
        "a cat: ExecuTorch 1.5.1 would lay out another tensor for XNNPACK (ChannelsLastTaggedReshapePass walks "
        f"up to {end.name}), which fails or computes wrong numbers; xnnguard.XNNPACKQuantizer gives such a conv "
        "a cat input and keeps it on XNNPACK"
    )


RULE = RuleCheck(
    Rule.DYNAMIC_CONV_SOURCE,
    Scope.MATCH,
    "a dynamically quantized conv is taken only where 1.5.1 lays out its input right (NHWC already)",
    lambda node, _context: dynamic_conv_source_violation(node),
)
