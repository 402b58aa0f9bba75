"""An integer scalar operand of a floating-point binary op is written as the float it stands for.

``FloatScalarsPass`` runs on an ATen program (``XnnpackPartitioner.transform_for_pre_decomposition``).
``x * 2`` and ``x + 1`` keep their Python ints in the exported graph; ``to_edge`` lifts each into an
int64 tensor constant and casts it to the float dtype with a ``_to_dim_order_copy`` that XNNPACK's
configs do not take (its dtype conversions are float ones), so every such scalar cost a portable op per
call, outside the delegates: the one op MViT-, VAE- and UNet-style code left outside in float. Written
``x * 2.0`` the scalar is lifted as a float constant, which XNNPACK takes as it is.

Why it is exact: a float tensor combined with an integer scalar computes in the tensor's dtype (a Python
scalar does not promote), with the scalar converted to it, which is what ``2.0`` is; only ints whose float32
value is exact (magnitude up to 2**24) are rewritten.

Postcondition: no ``add``, ``sub``, ``mul``, ``div`` or ``rsub`` of a floating-point tensor and such an
int is left.
"""

from __future__ import annotations

import torch

from xnnguard.graph.shapes import tensor_value
from xnnguard.rewrite.node_rewrite import NodeRewritePass

__all__ = ["FloatScalarsPass"]

_aten = torch.ops.aten
_BINARY = frozenset({
    _aten.add.Tensor, _aten.sub.Tensor, _aten.mul.Tensor, _aten.div.Tensor, _aten.rsub.Scalar,
    _aten.add.Scalar, _aten.sub.Scalar, _aten.mul.Scalar, _aten.div.Scalar,
})
_EXACT = 1 << 24  # every int up to this magnitude is a float32 (and float64) exactly


def _exact_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= _EXACT


def _int_operands(node: torch.fx.Node) -> list[int]:
    """Positions of ``node``'s operands (its first two arguments) that are such ints."""
    return [i for i, arg in enumerate(node.args[:2]) if _exact_int(arg)]


class FloatScalarsPass(NodeRewritePass):
    """Rewrites ``op(x, 2)`` on a floating-point ``x`` into ``op(x, 2.0)``."""

    subject = "integer scalar operand"

    def picks(self, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node.target not in _BINARY or not _int_operands(node):
            return False
        tensors = [tensor_value(arg) for arg in node.args[:2] if isinstance(arg, torch.fx.Node)]
        return len(tensors) == 1 and tensors[0] is not None and tensors[0].dtype.is_floating_point

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        positions = _int_operands(node)
        node.args = tuple(float(arg) if i in positions and isinstance(arg, int) else arg
                          for i, arg in enumerate(node.args))
        return None
