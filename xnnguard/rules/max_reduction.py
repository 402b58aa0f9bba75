"""XNNPACK's max over one dim keeps that dim, and the dim is written 2 or 3 of a 4-D tensor.

This module is the one place that rule lives. ExecuTorch 1.5.1 lowers a ``max.dim`` whose indices are
unused as a 2-D max pooling over H or W: its partitioner takes any such ``max.dim`` on a 4-D tensor,
``RemoveGetItemPass`` turns it into ``amax``, and the ``amax`` visitor then refuses it unless
``keepdim`` is set ("amax.default only supports keep_dim == True") and the dim, as written, is 2 or 3
("amax.default only supports dim == 2 or dim == 3": ``dim=-1`` is refused too).

``max_over_height_or_width`` says which written form XNNPACK does take, so a rewrite can produce it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xnnguard.graph.args import int_arg
from xnnguard.graph.ops import is_op
from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rules.rule import RuleCheck, Scope

if TYPE_CHECKING:
    import torch
    from torch.fx.node import Argument

__all__ = ["RULE", "is_max_dim", "max_dim_arguments", "max_over_height_or_width", "max_reduction_violation"]

_POOLED_DIMS = (2, 3)  # H and W of NCHW


def is_max_dim(node: torch.fx.Node) -> bool:
    """True for ``aten.max.dim`` in any dialect (ATen ``max.dim``, edge ``aten.max.dim``)."""
    return is_op(node, "max", "dim")


def max_dim_arguments(node: torch.fx.Node) -> tuple[Argument, int, bool]:
    """``(input, dim as written, keepdim)`` of a ``max.dim`` node; the input is a node in any exported graph."""
    dim = node.args[1] if len(node.args) > 1 else node.kwargs["dim"]
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    return node.args[0], int_arg(dim), bool(keepdim)


def max_over_height_or_width(rank: int, dim: int) -> int | None:
    """The written dim (2 or 3) XNNPACK pools over for a max over ``dim`` of a ``rank``-D tensor, or None."""
    if rank != 4 or not -rank <= dim < rank:
        return None
    positive = dim % rank
    return positive if positive in _POOLED_DIMS else None


def max_reduction_violation(node: torch.fx.Node) -> str | None:
    """Why XNNPACK 1.5.1 fails to lower the ``max.dim`` ``node``, or None when it lowers (or is no max.dim)."""
    if not is_max_dim(node):
        return None
    source, dim, keepdim = max_dim_arguments(node)
    value = tensor_value(source)
    if value is None:
        return None
    if max_over_height_or_width(value.dim(), dim) is None:
        return f"max over dim {dim} of a {value.dim()}-D tensor: XNNPACK's max pools only dim 2 or 3 of a 4-D tensor"
    if dim not in _POOLED_DIMS:
        return f"max over dim {dim}: XNNPACK 1.5.1 takes the dim only written as 2 or 3"
    if not keepdim:
        return "max without keepdim: XNNPACK 1.5.1 lowers max over a dim only with keepdim=True"
    return None


RULE = RuleCheck(
    Rule.MAX_REDUCTION,
    Scope.NODE,
    "a max over one dim is taken only keeping its dim, over H or W of a 4-D tensor",
    lambda node, _context: max_reduction_violation(node),
)
