"""Which operator an FX node calls, in every dialect xnnguard meets, without importing torch.

A node's target names itself differently per dialect: ``conv3d.default`` (an ATen ``OpOverload``),
``aten.convolution.default`` (an edge op), ``quantized_decomposed.quantize_per_tensor.default``,
``dequantize_affine.default`` (torchao). The operator and its overload are the last two parts in all
of them, so every rule and rewrite asks here instead of splitting names its own way.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["is_op", "op_of", "target_name", "values_only_users"]


def op_of(node: object) -> tuple[str, str] | None:
    """``(operator, overload)`` of a ``call_function`` node (``("max", "dim")``); None for anything else."""
    if getattr(node, "op", None) != "call_function":
        return None
    parts = getattr(getattr(node, "target", None), "__name__", "").split(".")
    if len(parts) < 2:
        return None
    return parts[-2], parts[-1]


def is_op(node: object, name: str | frozenset[str], overload: str | None = None) -> bool:
    """True when ``node`` calls operator ``name`` (or one of ``name``), with ``overload`` if given."""
    found = op_of(node)
    if found is None:
        return False
    names = {name} if isinstance(name, str) else name
    return found[0] in names and (overload is None or found[1] == overload)


def target_name(node: torch.fx.Node) -> str:
    """A readable operator name for reports: ``aten.permute_copy.default``, or ``get_attr:weight``."""
    target = node.target
    name = getattr(target, "__name__", None) or str(target)
    return name if node.op == "call_function" else f"{node.op}:{name}"


def values_only_users(node: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The ``getitem(node, 0)`` users of a (values, indices) op when nothing reads its indices, else None.

    An exported graph may hold an unread ``getitem(node, 1)``; it does not count as reading them.
    """
    def is_getitem(user: torch.fx.Node, index: int) -> bool:
        return user.target is operator.getitem and bool(user.args[1] == index)

    users = [user for user in node.users if user.users or not is_getitem(user, 1)]
    return users if all(is_getitem(user, 0) for user in users) else None
