"""The int arguments of an ATen op (a dim, a size), read off its FX node as ``int``.

torch.fx types every argument of a node as the whole ``Argument`` union (nodes, tensors, lists, dtypes,
...); that a dim or a size is an int is known from the op's schema only. These helpers are where the
rules and passes turn that knowledge into a type. They convert with ``int()`` (a ``SymInt`` gives its
value) and raise ``TypeError`` on a value the schema does not allow there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch.fx.node import Argument

__all__ = ["int_arg", "int_list", "schema_arguments"]


def int_arg(value: Argument) -> int:
    """``value``, an ``int`` argument of an op, as an int."""
    import torch

    if not isinstance(value, (int, torch.SymInt)):
        raise TypeError(f"expected an int argument, got {type(value).__name__}")
    return int(value)


def int_list(value: Argument) -> list[int]:
    """``value``, an ``int[]`` argument of an op, as a list of ints."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"expected a list of ints, got {type(value).__name__}")
    return [int_arg(item) for item in value]


def schema_arguments(node: torch.fx.Node) -> dict[str, Argument] | None:
    """Every argument of an ATen op's node by its schema name, defaults filled in; None if it has no schema."""
    from torch.fx.operator_schemas import normalize_function

    if node.op != "call_function" or not callable(node.target):
        return None
    found = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
    return dict(found.kwargs) if found is not None else None
