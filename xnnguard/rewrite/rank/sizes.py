"""The sizes a rank reduction computes with: static ints, and one dynamic size standing in as a prime.

Why: merging dims multiplies their sizes, and a program exported with a dynamic batch has a symbol
(``s0``, or ``8*s0`` once frames or windows are folded into it) for one of them. Rather than carry
symbols through the dim arithmetic, ``operand_shapes`` gives that symbol one stand-in value,
``DYNAMIC``: a prime larger than any product of static sizes. Every shape computed from the operands
is then a plain tuple, and a size is dynamic exactly when it is a multiple of ``DYNAMIC``: the group of
merged dims that holds the symbol. ``reshape_sizes`` writes that one size as -1, which XNNPACK's
reshape infers at run time (and ExecuTorch's ``ViewCopyConfig`` delegates).

That is exact only when every shape holds the symbol in one size at most, so that a reshape has one
-1 at most, and when each size is the symbol times a constant. ``operand_shapes`` checks both for all
of an op's tensors at once, before a rewrite inserts anything; a zero size is refused too, since -1
is ambiguous there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from xnnguard.graph.shapes import tensor_value

__all__ = ["DYNAMIC", "is_dynamic", "operand_shapes", "reshape_sizes", "shape_of"]

Shape = tuple[int, ...]

DYNAMIC = 2**61 - 1  # a Mersenne prime: no product of a tensor's static sizes reaches it

# Why an op's sizes cannot be computed with; each starts as every dynamic-shape reason of the rank passes.
TWO_DYNAMIC_SIZES = "dynamic shape: more than one dynamic size"
NOT_A_MULTIPLE = "dynamic shape: a size that is not a constant times one symbol"
ZERO_SIZE = "dynamic shape: a zero size next to a dynamic one"
NOT_A_TENSOR = "dynamic shape: an operand without a known shape"


def is_dynamic(size: int) -> bool:
    """True for a size computed from the dynamic one (a multiple of ``DYNAMIC``)."""
    return size % DYNAMIC == 0 and size != 0


def _coefficient(size: torch.SymInt) -> tuple[object, int] | None:
    """``size`` as (symbol, k) for ``k * symbol``, or None for any other expression."""
    expr = size.node.expr
    if len(expr.free_symbols) != 1:
        return None
    (symbol,) = expr.free_symbols
    k = expr / symbol
    if not k.is_Integer or int(k) <= 0:
        return None
    return symbol, int(k)


def operand_shapes(nodes: Sequence[object]) -> list[Shape] | str:
    """The shape of each of ``nodes`` with its dynamic size as a multiple of ``DYNAMIC``, or why not.

    All of them may share one symbol, each in one size at most; fully static shapes pass as they are.
    """
    symbols: set[object] = set()
    shapes: list[Shape] = []
    for node in nodes:
        value = tensor_value(node)
        if value is None:
            return NOT_A_TENSOR
        shape: list[int] = []
        for size in value.shape:
            if isinstance(size, int):
                shape.append(size)
                continue
            term = _coefficient(size)
            if term is None:
                return f"{NOT_A_MULTIPLE} ({size})"
            symbols.add(term[0])
            shape.append(term[1] * DYNAMIC)
        if sum(map(is_dynamic, shape)) > 1 or len(symbols) > 1:
            return TWO_DYNAMIC_SIZES
        if 0 in shape and any(map(is_dynamic, shape)):
            return ZERO_SIZE
        shapes.append(tuple(shape))
    return shapes


def shape_of(node: object) -> Shape | None:
    """``node``'s shape as ``operand_shapes`` gives it, or None when it gives a reason instead.

    For the operands of an op whose tensors ``operand_shapes`` already accepted together.
    """
    shapes = operand_shapes([node])
    return None if isinstance(shapes, str) else shapes[0]


def reshape_sizes(shape: Sequence[int]) -> list[int]:
    """``shape`` as the sizes of a reshape: its dynamic size as -1."""
    sizes = [-1 if is_dynamic(size) else int(size) for size in shape]
    if sizes.count(-1) > 1:  # operand_shapes refuses such operands: a rewrite bug if reached
        raise ValueError(f"a reshape to {list(shape)} would infer more than one size")
    return sizes
