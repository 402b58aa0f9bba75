"""A zero constant pad of a dequantized tensor runs int8 in XNNPACK, so its input must be the int8 tensor.

ExecuTorch 1.5.1 lowers a ``constant_pad_nd`` that reads a per-tensor ``dequantize`` as an int8 pad:
before serializing a delegate, its ``InsertPadQDQPass`` adds an implicit quantize/dequantize with the
dequantize's parameters after every such pad (pad value 0, no negative padding, no quantize reading it
already). XNNPACK's static constant pad then needs the same datatype, scale and zero point on its
input (``xnn_subgraph_check_quantization_parameter_matches``). The input is that int8 tensor only when
the dequantize is implicit in the pad's own partition, which happens when a quantized convolution takes
the pad into its match (its "same" padding). Taken as the float op ``ConstantPadConfig`` offers, the pad
gets a float input and an int8 output: the program fails at load ("Failed to create StaticConstantPad
node ... xnn_status_invalid_parameter"), or, when the pad is the partition's output, the delegate
outputs the skipped dequantize, which nothing writes.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from xnnguard.graph.ops import is_op
from xnnguard.report import Rule
from xnnguard.rules.rule import RuleCheck, Scope

if TYPE_CHECKING:
    import torch

__all__ = ["QUANTIZE_OPS", "RULE", "quantized_by_xnnpack", "unquantized_pad_violation"]

_CLONE_OPS = frozenset({"clone", "_clone_dim_order"})

# The quantize ops of ExecuTorch's quant_utils._Q_OPS, by operator name.
QUANTIZE_OPS = frozenset(
    {
        "quantize_per_tensor",
        "quantize_per_channel",
        "quantize_per_channel_group",
        "quantize_per_token",
        "quantize_affine",
    }
)


def _pad_value(node: torch.fx.Node) -> object:
    return node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0.0)


def _behind_identity_clones(node: object) -> object:
    """``node``, or what it copies when it is a clone that keeps the layout.

    XNNPACK's preprocessing removes such clones (``XNNPACKRemoveCloneOpsTransform``) before
    ``InsertPadQDQPass`` runs, so a pad reading ``clone(dequantize(...))`` is then a pad of the dequantize.
    """
    while is_op(node, _CLONE_OPS) and _keeps_layout(node):
        node = node.args[0]  # type: ignore[attr-defined]
    return node


def _keeps_layout(clone: object) -> bool:
    kwargs = getattr(clone, "kwargs", {})
    args = getattr(clone, "args", ())
    value = getattr(args[0], "meta", {}).get("val") if args else None
    rank = getattr(value, "ndim", None)
    if rank is None or value is None or not value.is_contiguous():
        return False
    import torch  # here, not at module import: the rules stay importable without torch

    dim_order, memory_format = kwargs.get("dim_order"), kwargs.get("memory_format")
    return (dim_order is None or list(dim_order) == list(range(rank))) and memory_format in (
        None, torch.contiguous_format, torch.preserve_format
    )


def quantized_by_xnnpack(node: torch.fx.Node) -> bool:
    """True for a pad that ``InsertPadQDQPass`` turns into an int8 pad (the pass's own conditions)."""
    if not is_op(node, "constant_pad_nd", "default") or not node.args:
        return False
    source, padding = _behind_identity_clones(node.args[0]), node.args[1] if len(node.args) > 1 else ()
    if not is_op(source, "dequantize_per_tensor", "default"):
        return False
    if _pad_value(node) != 0.0 or not isinstance(padding, (list, tuple)) or any(p < 0 for p in padding):
        return False
    return not any(is_op(user, QUANTIZE_OPS) for user in node.users)


def unquantized_pad_violation(node: torch.fx.Node, implicit: Collection[torch.fx.Node]) -> str | None:
    """Why ``node`` cannot be taken by a match whose implicit q/dq are ``implicit``, or None."""
    if not quantized_by_xnnpack(node) or _behind_identity_clones(node.args[0]) in implicit:
        return None
    return (
        "a zero pad of a dequantized tensor: ExecuTorch's InsertPadQDQPass makes it an int8 pad, which XNNPACK "
        "takes only with an int8 input (a quantized convolution's padding); alone it fails to load"
    )


RULE = RuleCheck(
    Rule.QUANTIZED_PAD,
    Scope.MATCH,
    "a pad ExecuTorch makes int8 needs its dequantize implicit in the same match",
    lambda node, context: unquantized_pad_violation(node, context.implicit),
)
