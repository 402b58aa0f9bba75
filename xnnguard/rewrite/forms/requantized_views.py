"""A quantize-dequantize after a high-rank view of values already on its grid is dropped.

``RequantizedViewsPass`` runs on an ATen program (``XnnpackPartitioner.transform_for_pre_decomposition``),
where pt2e left ``dq(q(x)) -> view -> q -> dq``: the XNNPACK quantizer annotates a view as sharing its
input's quantization, so it requantizes the view's output at the parameters its input was dequantized
with. A view above 6 dims stays outside XNNPACK (a graph output's: ``view(linear(x), 8-D)``, a window
merge at the graph's end), and so did the quantize and dequantize on its 8-D result, two portable ops per
call beside the one reshape that must touch the I/O tensor.

Why dropping them is exact: the view moves values that are dequantized at those very parameters, so each
is ``zero_point``-shifted ``k * scale`` with ``k`` within the quantized range; quantizing it again gives
``k`` back and dequantizing it the same value.

Postcondition: no per-tensor quantize-dequantize pair reads a view above XNNPACK's rank limit whose input
is a dequantize at the same parameters.
"""

from __future__ import annotations

import torch

from xnnguard.graph.ops import is_op
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rules.rank_limit import rank_violation

__all__ = ["RequantizedViewsPass"]

_VIEWS = frozenset({"view", "reshape", "_unsafe_view", "permute", "squeeze", "unsqueeze", "transpose"})
_PER_TENSOR = ("quantize_per_tensor", "dequantize_per_tensor")


def _parameters(node: torch.fx.Node) -> tuple[object, ...]:
    """(scale, zero point, quant min, quant max, dtype) of a per-tensor q or dq, as written."""
    return tuple(node.args[1:6])


def _requantized_view(quantize: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """``(view, dequantize)`` when ``quantize`` reads a high-rank view of a dequantize at its own
    parameters and one dequantize at them reads it, else None."""
    if not is_op(quantize, _PER_TENSOR[0], "default"):
        return None
    view = quantize.args[0]
    if not is_op(view, _VIEWS) or rank_violation(view) is None:  # type: ignore[arg-type]
        return None
    assert isinstance(view, torch.fx.Node)
    source = view.args[0]
    users = list(quantize.users)
    if not is_op(source, _PER_TENSOR[1], "default") or len(users) != 1:
        return None
    (dequantize,) = users
    assert isinstance(source, torch.fx.Node)
    same = _parameters(source) == _parameters(quantize) == _parameters(dequantize)
    return (view, dequantize) if is_op(dequantize, _PER_TENSOR[1], "default") and same else None


class RequantizedViewsPass(NodeRewritePass):
    """Drops ``q -> dq`` after a high-rank view of values dequantized at the same parameters."""

    subject = "requantized view"

    def picks(self, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and _requantized_view(node) is not None

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        found = _requantized_view(node)
        assert found is not None
        view, dequantize = found
        dequantize.replace_all_uses_with(view)
        graph_module.graph.erase_node(dequantize)
        graph_module.graph.erase_node(node)
        return None
