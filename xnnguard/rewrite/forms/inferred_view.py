"""A view with one dynamic dim is written with -1 for it, the form XNNPACK lowers.

A program exported with a dynamic batch spells the batch of every view as a symbolic size
(``view(x, [s0 * 8, 3, 16, 16])``), and ExecuTorch's ``ViewCopyConfig`` refuses any symbolic size
("Symbolic reshape is not supported"), although XNNPACK's reshape infers one dim at run time (-1, which
the serializer writes as 0). So every view of a dynamically batched program ran on the portable kernel
between delegates: a Conv3d network exported with ``Dim("batch")`` was cut into a hundred delegates.

``InferredViewPass`` rewrites the size argument of a view (``view``, ``_unsafe_view``, ``reshape``, in
place: the same op, the same result) whose result has exactly one symbolic dim into the static sizes and
-1 for that dim, and the size argument of a view whose result is static, though spelled with symbols,
into its static sizes: a ``flatten`` after a global pooling of a clip whose frame count the network
reduces to 1 over the whole exported range (R(2+1)D with 2 to 4 frames) was left outside, and
ExecuTorch then refused to serialize a static view of the delegate's dynamic output.

The partitioner runs it before decomposition (as ``MaxKeepdimPass``), on the program
``run_decompositions({})`` made, which spells out the sizes of every view (a ``flatten``'s too); the
decomposition and edge passes after it keep a -1 as it is. So it applies to every program lowered with
``xnnguard.XnnpackPartitioner`` through ``to_edge_transform_and_lower``.

Postcondition: no view it picks keeps a symbolic size. A view with two or more symbolic dims, or a
zero-size dim (where -1 is ambiguous), is left as it was: XNNPACK takes neither.
"""

from __future__ import annotations

import torch

from xnnguard.graph.ops import is_op
from xnnguard.rewrite.node_rewrite import NodeRewritePass

__all__ = ["InferredViewPass", "inferred_sizes"]

_VIEWS = frozenset({"view", "_unsafe_view", "reshape", "view_copy"})


def inferred_sizes(node: torch.fx.Node) -> list[int] | None:
    """The sizes of view ``node`` with -1 for its one symbolic dim, or None when that form does not apply.

    Read from the result's fake value, so it holds whatever the size argument spelled (symbols, -1).
    """
    if not is_op(node, _VIEWS) or len(node.args) < 2:
        return None
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return None
    sizes = list(node.args[1]) if isinstance(node.args[1], list | tuple) else None
    if sizes is None or all(isinstance(size, int) for size in sizes):
        return None  # static, or already in XNNPACK's form
    symbolic = [i for i, size in enumerate(value.shape) if not isinstance(size, int)]
    static = [int(size) for size in value.shape if isinstance(size, int)]
    if not symbolic:  # spelled with symbols, static at every size of the range: its static sizes
        return static
    if len(symbolic) != 1 or 0 in static:
        return None
    return [-1 if i == symbolic[0] else int(size) for i, size in enumerate(value.shape)]


class InferredViewPass(NodeRewritePass):
    """Rewrites ``view(x, [s0 * 8, 3, 16, 16])`` into ``view(x, [-1, 3, 16, 16])``."""

    subject = "view with a dynamic dim"

    def picks(self, node: torch.fx.Node) -> bool:
        return inferred_sizes(node) is not None

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        sizes = inferred_sizes(node)
        assert sizes is not None
        node.args = (node.args[0], sizes, *node.args[2:])  # the symbolic sizes' nodes are dead code now
        return None
