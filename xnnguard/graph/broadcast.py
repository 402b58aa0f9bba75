"""Which ops broadcast their operands elementwise, and whether one operand can be given unbroadcast.

``expand(x, shape)`` read by ``add(expand, y)`` computes what ``add(x, y)`` computes when the add's own
broadcasting gives the same output shape (and dtype): the binary ops XNNPACK runs broadcast their
operands themselves. Constant folding keeps such an expand out of the constants it stores, and the views
rewrite removes it.
"""

from __future__ import annotations

import torch

from xnnguard.graph.shapes import same_size, static_shape, tensor_value

__all__ = ["BROADCASTING_BINARY_OPS", "broadcasts_in_place_of"]

_aten = torch.ops.aten

# Binary ops XNNPACK runs (elementwise, broadcasting their two tensor operands).
BROADCASTING_BINARY_OPS = frozenset({
    _aten.add.Tensor, _aten.sub.Tensor, _aten.mul.Tensor, _aten.div.Tensor,
    _aten.maximum.default, _aten.minimum.default,
})


def broadcasts_in_place_of(user: torch.fx.Node, operand: torch.fx.Node, smaller: torch.fx.Node) -> bool:
    """True when ``user`` computes the same with ``smaller`` in place of ``operand`` (through its broadcasting).

    ``user`` must be a broadcasting binary op reading ``operand`` as a positional tensor operand, and the
    broadcast of ``smaller`` with the other operand must have ``user``'s output shape and dtype.
    """
    if user.op != "call_function" or user.target not in BROADCASTING_BINARY_OPS:
        return False
    if operand not in user.args[:2] or any(isinstance(v, torch.fx.Node) for v in user.kwargs.values()):
        return False
    if _one_element_beside_the_output(user, operand, smaller):
        return True
    output = static_shape(user)
    small = tensor_value(smaller)
    if output is None or small is None or static_shape(smaller) is None:
        return False
    shapes = [static_shape(smaller) if arg is operand else static_shape(arg) if isinstance(arg, torch.fx.Node) else ()
              for arg in user.args[:2]]
    if any(shape is None for shape in shapes):
        return False
    try:
        shape = torch.broadcast_shapes(*shapes)
    except RuntimeError:
        return False
    original = tensor_value(operand)
    return tuple(shape) == output and original is not None and small.dtype == original.dtype


def _one_element_beside_the_output(user: torch.fx.Node, operand: torch.fx.Node, smaller: torch.fx.Node) -> bool:
    """``smaller`` holds one element and ``user``'s other operand is a tensor of ``user``'s output shape.

    Then ``smaller`` broadcasts to that shape whatever its sizes are, dynamic ones included (an attention
    mask of the token count filled with one value, added to the scores).
    """
    small, original, out = tensor_value(smaller), tensor_value(operand), tensor_value(user)
    if small is None or original is None or out is None or small.dtype != original.dtype:
        return False
    if small.dim() > out.dim() or any(not isinstance(size, int) or size != 1 for size in small.shape):
        return False
    others = [arg for arg in user.args[:2] if arg is not operand]
    if len(others) != 1 or not isinstance(others[0], torch.fx.Node):
        return False
    other = tensor_value(others[0])
    return other is not None and other.dim() == out.dim() and all(
        same_size(a, b) for a, b in zip(other.shape, out.shape))
