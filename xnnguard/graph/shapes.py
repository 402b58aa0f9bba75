"""The static shape of a node's tensor, or None when it is unknown or has a dynamic size."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "dynamic_broadcast_dim", "same_size", "shape_with_inferred_batch", "shape_with_one_inferred", "static_shape",
    "tensor_value",
]


def tensor_value(node: object) -> torch.Tensor | None:
    """The (fake) tensor ``node`` computes (``meta["val"]``), or None for a non-tensor or a non-node."""
    import torch

    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def static_shape(node: object) -> tuple[int, ...] | None:
    """The shape of ``node``'s single tensor when every size is a plain int, else None."""
    value = tensor_value(node)
    if value is None or not all(isinstance(size, int) for size in value.shape):
        return None
    return tuple(int(size) for size in value.shape)


def shape_with_inferred_batch(node: object) -> list[int] | None:
    """``node``'s shape with -1 for a dynamic batch (dim 0), the one size a view may infer; None when it
    is no tensor or another size is dynamic."""
    value = tensor_value(node)
    if value is None:
        return None
    sizes = list(value.shape)
    if sizes and not isinstance(sizes[0], int):
        sizes[0] = -1
    return [int(size) for size in sizes] if all(isinstance(size, int) for size in sizes) else None


def shape_with_one_inferred(node: object) -> list[int] | None:
    """``node``'s shape with -1 for its one dynamic size (a batch, a clip's frames), the one size a view may
    infer; None when it is no tensor or more than one size is dynamic."""
    value = tensor_value(node)
    if value is None:
        return None
    sizes = list(value.shape)
    if sum(not isinstance(size, int) for size in sizes) > 1:
        return None
    return [int(size) if isinstance(size, int) else -1 for size in sizes]


def dynamic_broadcast_dim(source: Sequence[object], target: Sequence[object]) -> int | None:
    """The first dim along which broadcasting ``source`` to ``target`` turns a size 1 into a symbolic size
    (the batch of a program exported with a dynamic one), or None when every broadcast size is static."""
    lead = len(target) - len(source)
    for dim, size in enumerate(target):
        before = source[dim - lead] if dim >= lead else 1
        if isinstance(before, int) and before == 1 and not isinstance(size, int):
            return dim
    return None


def same_size(a: int | torch.SymInt, b: int | torch.SymInt) -> bool:
    """Sizes known equal without adding a guard (a dynamic size equals only the same symbol)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, int) or isinstance(b, int):
        return False
    return bool(a.node.expr == b.node.expr)  # two SymInts: their symbolic expressions
