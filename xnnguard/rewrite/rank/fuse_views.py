"""Fold chains of views through a high-rank tensor into one reshape, so the high-rank tensor disappears.

Invariant established: no view-like node (``view``, ``reshape``, ``flatten``, ``unsqueeze``...) with
static shapes or one dynamic size reads the output of another view-like node whose tensor is above
``XNN_MAX_TENSOR_DIMS`` dims; it reads that node's input instead (so does an export-inserted dtype
assertion, which a view cannot change). ``reshape(reshape(x, s1), s2) == reshape(x, s2)`` for any ``x``
(both follow row-major order), so the result is unchanged. Once nothing else reads the high-rank view,
dead-code elimination removes it; a reshape that ends where it started is dropped.

Why: the other rank-reduction passes rewrite one op at a time, ending in reshapes back to the op's
original high-rank shape; a user's ``x.view(8-D)`` starts the chain. Each such reshape has a high-rank
side and would stay out of XNNPACK. Folded, the chain goes from one low-rank tensor to the next.
A high-rank view that something else still needs (a graph output, an op no pass reduces) stays, and
the composite ``ReduceRankPass`` reports why.
"""

from __future__ import annotations

import logging

import torch
from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.graph.shapes import tensor_value
from xnnguard.pass_result import PostconditionError, ReportedPassResult
from xnnguard.rewrite.rank.base import VIEW_OPS, insert_reshape, user_kept_out
from xnnguard.rewrite.rank.sizes import operand_shapes, shape_of
from xnnguard.rules.rank_limit import exceeds_rank_limit

__all__ = ["FuseHighRankViewsPass"]

logger = logging.getLogger("xnnguard.rewrite")


def _is_view(node: object) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in VIEW_OPS


def _asserts_only_dtype(node: torch.fx.Node) -> bool:
    """``torch.export``'s ``_assert_tensor_metadata`` (before a ``.to()``) checking no size or stride."""
    if node.op != "call_function" or node.target is not torch.ops.aten._assert_tensor_metadata.default:
        return False
    size = node.args[1] if len(node.args) > 1 else node.kwargs.get("size")
    stride = node.args[2] if len(node.args) > 2 else node.kwargs.get("stride")
    return size is None and stride is None


class FuseHighRankViewsPass(PassBase):
    """Makes each view read past the high-rank views before it; drops the ones left unused."""

    @staticmethod
    def picks(node: torch.fx.Node) -> bool:
        """A view (or a dtype/device assertion) reading a view with a tensor above the limit, the sizes of
        all three (the view, its source and the source's input) known together."""
        if not (_is_view(node) or _asserts_only_dtype(node)) or user_kept_out(node):
            return False
        source = node.args[0]
        if not _is_view(source) or user_kept_out(source):  # type: ignore[arg-type]
            return False
        value = tensor_value(source)
        if value is None or not exceeds_rank_limit(value.dim()):
            return False
        chain = [source.args[0], source, node] if _is_view(node) else [source.args[0], source]  # type: ignore[union-attr]
        return not isinstance(operand_shapes(chain), str)

    def call(self, graph_module: torch.fx.GraphModule) -> ReportedPassResult:
        graph = graph_module.graph
        modified = False
        for node in list(graph.nodes):
            if not self.picks(node):
                continue
            source = node.args[0]
            assert isinstance(source, torch.fx.Node)
            origin = source.args[0]
            assert isinstance(origin, torch.fx.Node)
            modified = True
            if _asserts_only_dtype(node):  # a view keeps dtype, device and layout: assert them on its input
                node.replace_input_with(source, origin)
                continue
            with graph.inserting_before(node):
                fused = insert_reshape(graph, origin, shape_of(node), like=node)  # type: ignore[arg-type]
            node.replace_all_uses_with(fused)
            graph.erase_node(node)
        if modified:
            graph.eliminate_dead_code()
            graph.lint()
            graph_module.recompile()
        return ReportedPassResult(graph_module, modified, ())

    def ensures(self, graph_module: torch.fx.GraphModule) -> None:
        unfused = [node.name for node in graph_module.graph.nodes if self.picks(node)]
        if unfused:
            raise PostconditionError(type(self).__name__, "that no view reads a high-rank view", unfused)
