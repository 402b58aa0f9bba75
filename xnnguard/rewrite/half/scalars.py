"""A number operand of a 16-bit float op becomes a constant of its dtype, the one ``to_edge`` computes at run time.

Invariant established: no float16 or bfloat16 ``add``, ``sub``, ``mul``, ``div`` or ``rsub`` has a number
operand. ``to_edge`` makes ``x * 0.5`` of a float16 ``x`` a float32 tensor constant and a
``_to_dim_order_copy`` to float16 that ExecuTorch runs before every call, outside XNNPACK:
``ToDimOrderCopyConfig`` takes no dtype conversion (a float32 program has no conversion: its constant is
float32 already). Here the number becomes the constant that conversion computes,
``torch.tensor(v, dtype=x.dtype)``, read by XNNPACK as a static value: the same arithmetic as the stock
program, with nothing outside (bfloat16 too, for a partitioner made with ``enable_bf16=True``).

It runs last of all rewrites, so it also takes the numbers other rewrites write (the float16 statistics'
scales, an attention's ``q * scale``).
"""

from __future__ import annotations

import torch

from xnnguard.graph.shapes import tensor_value
from xnnguard.rewrite.attributes import constant_attribute
from xnnguard.rewrite.dtypes import SIXTEEN_BIT_FLOATS
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import user_kept_out

__all__ = ["ScalarOperandsPass"]

_aten = torch.ops.aten

# op -> the op that takes the constant tensor in place of the number (itself for a .Tensor overload)
_WITH_TENSOR: dict[object, object] = {
    _aten.add.Tensor: _aten.add.Tensor,
    _aten.sub.Tensor: _aten.sub.Tensor,
    _aten.mul.Tensor: _aten.mul.Tensor,
    _aten.div.Tensor: _aten.div.Tensor,
    _aten.add_.Tensor: _aten.add_.Tensor,
    _aten.sub_.Tensor: _aten.sub_.Tensor,
    _aten.mul_.Tensor: _aten.mul_.Tensor,
    _aten.div_.Tensor: _aten.div_.Tensor,
    _aten.add.Scalar: _aten.add.Tensor,
    _aten.sub.Scalar: _aten.sub.Tensor,
    _aten.mul.Scalar: _aten.mul.Tensor,
    _aten.div.Scalar: _aten.div.Tensor,
    _aten.rsub.Scalar: _aten.rsub.Tensor,
}


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number_positions(node: torch.fx.Node) -> list[int]:
    return [i for i, arg in enumerate(node.args[:2]) if _is_number(arg)]


class ScalarOperandsPass(NodeRewritePass):
    """Replaces each number operand of a 16-bit float add/sub/mul/div/rsub by a constant tensor of its dtype."""

    subject = "number operand"
    # rule None: every op it picks it rewrites

    def picks(self, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node.target not in _WITH_TENSOR or user_kept_out(node):
            return False
        out = tensor_value(node)
        if out is None or out.dtype not in SIXTEEN_BIT_FLOATS or not _number_positions(node):
            return False
        alpha = node.kwargs.get("alpha", 1)
        return _is_number(alpha) and bool(alpha == 1)  # a scaled add (alpha) is left to ExecuTorch

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        dtype = tensor_value(node).dtype  # type: ignore[union-attr]
        args = list(node.args)
        with graph_module.graph.inserting_before(node):
            for position in _number_positions(node):
                value = torch.tensor(args[position], dtype=dtype)
                args[position] = constant_attribute(graph_module, f"{node.name}_{position}", value)
            target = _WITH_TENSOR[node.target]
            if target is node.target:
                node.args = tuple(args)
                return None
            replacement = call_like(graph_module.graph, node, target, args, node.kwargs)
        node.replace_all_uses_with(replacement)
        return None
