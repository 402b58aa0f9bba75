"""A convolution is 3-D when its weight has rank 5.

This module is the one place that rule lives. The weight's rank is what the XNNPACK partitioner sees
(stride, padding and dilation may be single values that ATen broadcasts), and it is the same in every
dialect the library meets: a pt2e graph (``aten.conv3d``, ``aten.conv_transpose3d.input``), an
exported program (``aten.convolution``) and an edge program (``aten.convolution`` edge op), and in a
serialized program, where the verifier reads it off the kernel call's weight argument. torch is
imported only by the functions that look at graph nodes, so the verifier can ask this module without it.
"""

from __future__ import annotations

from enum import Enum
from functools import cache
from typing import TYPE_CHECKING

from xnnguard.graph.ops import op_of
from xnnguard.report import Rule
from xnnguard.rules.rule import RuleCheck, Scope

if TYPE_CHECKING:
    import torch

__all__ = [
    "CONV3D_WEIGHT_RANK",
    "RULE",
    "ConvKind",
    "conv3d_kind",
    "conv3d_violation",
    "is_3d_convolution",
    "is_3d_convolution_operator",
    "is_3d_convolution_weight",
]

CONV3D_WEIGHT_RANK = 5  # (out, in / groups, depth, height, width); transposed: (in, out / groups, ...)


def is_3d_convolution_weight(weight_rank: int) -> bool:
    """True when a convolution with a weight of ``weight_rank`` dims is 3-D (transposed or not)."""
    return weight_rank == CONV3D_WEIGHT_RANK

_CONV_TARGET_NAMES = frozenset(
    {
        "convolution",
        "_convolution",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
    }
)


class ConvKind(str, Enum):
    CONV3D = "conv3d"
    CONV_TRANSPOSE3D = "conv_transpose3d"

    @property
    def description(self) -> str:
        return "3-D convolution" if self is ConvKind.CONV3D else "3-D transposed convolution"


def _op_name(node: torch.fx.Node) -> str | None:
    """``"conv3d"`` for ``aten.conv3d.default``, ``conv3d.padding`` and their edge twins; else None."""
    found = op_of(node)
    return found[0] if found is not None and found[0] in _CONV_TARGET_NAMES else None


def _is_transposed(node: torch.fx.Node, op_name: str) -> bool:
    if op_name.startswith("conv_transpose"):
        return True
    if op_name in ("convolution", "_convolution"):
        transposed = node.args[6] if len(node.args) > 6 else node.kwargs.get("transposed", False)
        return bool(transposed)
    return False


def conv3d_kind(node: torch.fx.Node) -> ConvKind | None:
    """The kind of 3-D convolution ``node`` is, or None when it is not one."""
    op_name = _op_name(node)
    if op_name is None or len(node.args) < 2:
        return None
    weight = node.args[1]
    import torch

    value = weight.meta.get("val") if isinstance(weight, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or not is_3d_convolution_weight(value.dim()):
        return None
    return ConvKind.CONV_TRANSPOSE3D if _is_transposed(node, op_name) else ConvKind.CONV3D


def is_3d_convolution(node: torch.fx.Node) -> bool:
    """True for a 3-D convolution or 3-D transposed convolution (weight of rank 5)."""
    return conv3d_kind(node) is not None


@cache
def _3d_convolution_operators() -> frozenset[object]:
    import torch

    return frozenset({torch.ops.aten.conv3d, torch.ops.aten.conv_transpose3d})


def is_3d_convolution_operator(operator: object) -> bool:
    """True for an operator that only computes 3-D convolutions (``aten.conv3d``, ``aten.conv_transpose3d``).

    For configuration keyed by operator type (a quantizer's ``set_operator_type``), where there is no
    node whose weight could be looked at. Packets and their overloads (``conv_transpose3d.input``)
    alike; ``aten.convolution`` serves every rank, so it is not one.
    """
    import torch

    packet = getattr(operator, "overloadpacket", operator)
    return isinstance(packet, torch._ops.OpOverloadPacket) and packet in _3d_convolution_operators()


def conv3d_violation(node: torch.fx.Node) -> str | None:
    """Why ``node`` cannot go to XNNPACK as a 3-D convolution, or None when it is not one."""
    kind = conv3d_kind(node)
    return None if kind is None else f"{kind.description}: XNNPACK has no 3-D convolution"


RULE = RuleCheck(
    Rule.CONV3D,
    Scope.NODE,
    "a convolution is 3-D when its weight has rank 5, and XNNPACK has no 3-D convolution",
    lambda node, _context: conv3d_violation(node),
)
