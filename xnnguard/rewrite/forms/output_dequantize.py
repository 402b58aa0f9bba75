"""A graph output that is a dequantized value other ops read too is returned through a dequantize of its own.

ExecuTorch 1.5.1's ``ChannelsLastTaggedReshapePass`` (run on every XNNPACK delegate) hands a channels-last
dequantized value to a reader that needs it contiguous by inserting copy -> q -> dq, and points *every*
reader of the old dq at the new one, the delegate's output included. The new dq has no value yet, and
lowering dies with ``KeyError: 'val'`` when the pass reaches the output (fuzz seed 8: a convolution's
int8 result both returned and read by a softmax over W). Stock partitioning makes a program of the same
graph that fails at run. A dq of its own for the output (the same arguments: no rounding added) is read
by the output alone, and the pass converts it for the output alone.

The output may read the dq through ops that return their input's values unchanged (``to`` its own dtype,
``alias``): ``to_edge`` drops those, and a dq behind them would be the shared one again.

Postcondition: no graph output reads a dequantize (directly or through such ops) that another op reads.
"""

from __future__ import annotations

import torch

from xnnguard.graph.ops import is_op
from xnnguard.graph.shapes import tensor_value
from xnnguard.rewrite.node_rewrite import NodeRewritePass

__all__ = ["OutputDequantizePass"]

_DEQUANTIZE = frozenset({"dequantize_per_tensor", "dequantize_per_channel"})
_SAME_VALUES = frozenset({"to", "_to_copy", "alias", "detach"})


def _same_values(node: torch.fx.Node) -> bool:
    """``node`` returns its input's values as they are: same dtype, same shape."""
    if not is_op(node, _SAME_VALUES) or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    out, source = tensor_value(node), tensor_value(node.args[0])
    return out is not None and source is not None and out.dtype == source.dtype and out.shape == source.shape


def _dequantize_behind(node: torch.fx.Node) -> tuple[torch.fx.Node, int] | None:
    """The dq whose values ``node`` (a graph output) is, and how many ops read that value besides the output."""
    readers = 0
    while _same_values(node):
        readers += len(node.users) - 1
        source = node.args[0]
        assert isinstance(source, torch.fx.Node)  # _same_values checked it
        node = source
    if not is_op(node, _DEQUANTIZE):
        return None
    return node, readers + len(node.users) - 1


class OutputDequantizePass(NodeRewritePass):
    """Gives each graph output read from a shared dequantize a dequantize of its own."""

    subject = "dequantized graph output"

    def picks(self, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or not any(user.op == "output" for user in node.users):
            return False
        found = _dequantize_behind(node)
        return found is not None and (found[1] > 0 or len(node.users) > 1)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        found = _dequantize_behind(node)
        assert found is not None
        dequantize = found[0]
        graph = graph_module.graph
        with graph.inserting_after(dequantize):
            own = graph.create_node("call_function", dequantize.target, dequantize.args, dequantize.kwargs)
        own.meta = dict(dequantize.meta)
        graph.output_node().replace_input_with(node, own)
        return None
