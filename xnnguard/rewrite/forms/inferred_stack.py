"""A stack over a dynamic dim is a cat of views that infer that dim.

``torch.stack(ts, d)`` decomposes while the program is lowered (after the partitioner's own passes) into
an unsqueeze of each tensor, a view whose sizes spell the dynamic dim as a symbol, and ExecuTorch 1.5.1's
``ViewCopyConfig`` refuses a symbolic size: Wan's temporal upsampling (``torch.stack`` of two halves after
the frames) ran outside XNNPACK with a dynamic frame count. Rewritten before decomposition as
``cat([view(t, shape with a 1 at d and -1 for the dynamic dim) ...], d)``: the same values, in the view
XNNPACK infers at run time.

Left as it was: a stack whose tensors have two or more dynamic dims (one reshape infers one) or a
zero-size dim (where -1 is ambiguous).
"""

from __future__ import annotations

import torch

from xnnguard.graph.ops import is_op
from xnnguard.graph.shapes import shape_with_one_inferred
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.node_rewrite import NodeRewritePass

__all__ = ["InferredStackPass", "stacked_view_shapes"]


def stacked_view_shapes(node: torch.fx.Node) -> tuple[int, list[list[int]]] | None:
    """The stack's dim and, per tensor, its shape with a 1 at that dim and -1 for its dynamic dim; None
    when the form does not apply (no dynamic dim, two of them, a zero size)."""
    if not is_op(node, "stack", "default") or not isinstance(node.args[0], list | tuple):
        return None
    found = [shape_with_one_inferred(t) for t in node.args[0]]
    shapes = [shape for shape in found if shape is not None and 0 not in shape]
    if not shapes or len(shapes) != len(found):
        return None
    if not any(-1 in shape for shape in shapes):
        return None  # static: the stock lowering takes it
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if not isinstance(dim, int):
        return None
    dim %= len(shapes[0]) + 1
    return dim, [[*shape[:dim], 1, *shape[dim:]] for shape in shapes]


class InferredStackPass(NodeRewritePass):
    """Rewrites ``stack(ts, d)`` over a dynamic dim into ``cat([view(t, ..., 1 at d, -1 ...)], d)``."""

    subject = "stack over a dynamic dim"

    def picks(self, node: torch.fx.Node) -> bool:
        return stacked_view_shapes(node) is not None

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        found = stacked_view_shapes(node)
        assert found is not None
        dim, shapes = found
        graph = graph_module.graph
        with graph.inserting_before(node):
            views = [call_like(graph, node, torch.ops.aten.view.default, (tensor, shape))
                     for tensor, shape in zip(node.args[0], shapes, strict=True)]  # type: ignore[arg-type]
            result = call_like(graph, node, torch.ops.aten.cat.default, (views, dim))
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        return None
