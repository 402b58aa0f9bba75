"""The int arguments of an ATen op (a dim, a size), read off its FX node as ``int``.

torch.fx types every argument of a node as the whole ``Argument`` union (nodes, tensors, lists, dtypes,
...); that a dim or a size is an int is known from the op's schema only. These helpers are where the
rules and passes turn that knowledge into a type. They convert with ``int()`` (a ``SymInt`` gives its
value) and raise ``TypeError`` on a value the schema does not allow there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.fx.node import Argument

__all__ = ["int_arg", "int_list"]


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
