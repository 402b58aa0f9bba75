"""XNNPACK moves int8 values (reshape, transpose, slice, pad, concatenation, max pooling) only within one quantization.

``xnn_subgraph_check_quantization_parameter_matches`` (XNNPACK ``src/subgraph/validation.c``) fails a
static reshape or copy, transpose, slice, constant pad, concatenation (every input), 2-D max pooling or
bilinear resize at load when its output is int8 and an input's scale or zero point differs from the
output's (compared exactly). ExecuTorch 1.5.1 checks this for a slice only: its other configs take such
an op int8 whenever a dequantize feeds it and a quantize reads it, whatever their parameters, so a
quantizer that observes the op's output on its own makes a program that cannot load ("Failed to create
static transpose node"). Such an op is exact in float too: taken as a float op between the dequantize
and the quantize it loads and computes the same values.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from xnnguard.graph.ops import is_op, op_of
from xnnguard.report import Rule
from xnnguard.rules.rule import Effect, RuleCheck, Scope

if TYPE_CHECKING:
    import torch

__all__ = ["RULE", "SAME_QUANTIZATION_OPS", "quantization_mismatch", "shared_dequantize"]

# Edge ops whose XNNPACK node requires one quantization on input and output (what they lower to).
SAME_QUANTIZATION_OPS = frozenset(
    {
        "view_copy",  # static reshape
        "unsqueeze_copy",  # static reshape
        "squeeze_copy",  # static reshape
        "permute_copy",  # static transpose
        "_to_dim_order_copy",  # static transpose or copy
        "slice_copy",  # static slice
        "constant_pad_nd",  # static constant pad
        "cat",  # concatenate
        "max_pool2d",  # max pooling
        "max_pool2d_with_indices",
        "upsample_bilinear2d",  # static resize bilinear
    }
)

_PER_TENSOR = frozenset({"quantize_per_tensor", "dequantize_per_tensor"})


def _parameters(node: torch.fx.Node) -> tuple[object, ...]:
    """(scale, zero point, dtype) of a per-tensor q/dq, as written in the graph: what XNNPACK compares."""
    scale, zero_point, _, _, dtype = node.args[1:6]
    return scale, zero_point, dtype


def quantization_mismatch(node: torch.fx.Node, implicit: Collection[torch.fx.Node]) -> str | None:
    """Why ``node``, taken int8 with the q/dq of ``implicit``, would fail XNNPACK's check, or None.

    None too when the match is not int8 (no quantize of ``node``'s output among ``implicit``).
    """
    found = op_of(node)
    if found is None or found[0] not in SAME_QUANTIZATION_OPS:
        return None
    outputs = [user for user in node.users if user in implicit and is_op(user, _PER_TENSOR)]
    inputs = [arg for arg in node.all_input_nodes if arg in implicit and is_op(arg, _PER_TENSOR)]
    for quantize in outputs:
        for dequantize in inputs:
            if _parameters(dequantize) != _parameters(quantize):
                scale_in, zero_in, _ = _parameters(dequantize)
                scale_out, zero_out, _ = _parameters(quantize)
                return (
                    f"int8 {found[0]} with input scale {scale_in}, zero point {zero_in} and output scale "
                    f"{scale_out}, zero point {zero_out}: XNNPACK requires them equal"
                )
    return None


def shared_dequantize(node: torch.fx.Node, implicit: Collection[torch.fx.Node]) -> str | None:
    """Why ``node`` cannot take an implicit dequantize that another op also reads, or None.

    An implicit dequantize is no node: every reader gets the int8 tensor behind it. 1.5.1 takes a slice
    int8 only when it is its dequantize's one reader; a release whose graph shares one dequantize among
    a slice and float ops (1.4.0) hands them int8 values XNNPACK refuses at load ("Failed to create
    static slice node"). A value-moving op is exact in float, so it is taken so.
    """
    found = op_of(node)
    if found is None or found[0] not in SAME_QUANTIZATION_OPS:
        return None
    for dequantize in node.all_input_nodes:
        if dequantize in implicit and is_op(dequantize, _PER_TENSOR):
            others = [user.name for user in dequantize.users if user is not node]
            if others:
                return f"int8 {found[0]} reads a dequantize that {', '.join(others)} also read"
    return None


RULE = RuleCheck(
    Rule.QUANTIZATION_MATCH,
    Scope.MATCH,
    "an op XNNPACK moves int8 within one quantization only is taken as a float op when its q/dq differ or "
    "its dequantize has other readers",
    lambda node, context: quantization_mismatch(node, context.implicit) or shared_dequantize(node, context.implicit),
    Effect.TAKE_AS_FLOAT,
)
