"""A gather by a flattened index, viewed back to the index's shape, as a gather by the index itself.

Invariant established: no view (``view``, ``reshape``, ``_unsafe_view``, ``unflatten`` of dim 0) with a
dynamic size is left that splits the rows of ``index(table, [i.flatten()])`` back into ``i``'s dims; it is
``index(table, [i])``, the same values (advanced indexing by ``i`` is row-major in ``i``'s dims).

Why: the relative position bias of Swin (torchvision's 2-D and 3-D, ``table[index[:n, :n].flatten()]
.view(n, n, -1)``), with a window that shrinks to a dynamic frame count (Swin3D, ``n = 49 * t`` with
``t = frames // 2``). Torch writes the second dim of such a split as ``rows // n``: ``2401*t**2 // (49*t)``,
which its sympy simplification leaves as ``(49*t**2) // t`` (it cancels only a factor written the same
way on both sides, and ``t**2`` is not ``t * t``). ExecuTorch plans memory for a tensor's upper bound,
bounding each expression by interval arithmetic: ``(49*t**2) // t`` over ``t`` in [2, 8] is bounded by
``49*64 // 2 = 1568``, four times its largest value ``49*8 = 392``. The view is memory-planned as an
alias of the gather's output (``ReplaceViewCopyWithViewPass``), whose bound (``2401*t**2``: 153664 rows)
is right, so the view ran past its arena: the ``.pte`` failed to load (``0x21``, "offset_bytes (4917248) +
size_bytes (4917248) >= allocator size (7438656)"). A rewrite that wrote the view's sizes out also put
the expression into the graph (an ``operator.pow`` node, which the edge verifier refuses). Gathered by
the 2-D index, the result's sizes are the index's own (``49*t``), and so are those of everything after it.

Only views with a dynamic size are picked: with static sizes the split's size is a number, and the
program stays as it was.
"""

from __future__ import annotations

import torch

from xnnguard.graph.ops import is_op
from xnnguard.graph.shapes import same_size, tensor_value
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.views.base import AliasAwarePass

__all__ = ["GatherInIndexShapePass", "flat_gather_index"]

_aten = torch.ops.aten
_VIEWS = frozenset({"view", "reshape", "_unsafe_view", "view_copy"})
_INTEGERS = (torch.int64, torch.int32)


def _flattened(node: object) -> torch.fx.Node | None:
    """``i`` when ``node`` flattens ``i`` (2-D or more, integer) to 1-D: a ``flatten`` of all its dims, or a view."""
    if not isinstance(node, torch.fx.Node) or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    source, value = tensor_value(node.args[0]), tensor_value(node)
    if source is None or value is None or value.dim() != 1 or source.dim() < 2 or source.dtype not in _INTEGERS:
        return None
    if is_op(node, "flatten", "using_ints"):
        start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
        end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
        if not (isinstance(start, int) and isinstance(end, int)):
            return None
        covers_all = start % source.dim() == 0 and end % source.dim() == source.dim() - 1
        return node.args[0] if covers_all else None
    return node.args[0] if is_op(node, _VIEWS) else None


def _given_sizes(node: torch.fx.Node) -> list[object] | None:
    """The size arguments of ``node``: a view's, or an unflatten's of dim 0 (the sizes dim 0 splits into)."""
    if is_op(node, "unflatten"):
        dim, sizes = (node.args[1], node.args[2]) if len(node.args) > 2 else (None, None)
        return list(sizes) if dim == 0 and isinstance(sizes, list | tuple) else None
    if is_op(node, _VIEWS) and len(node.args) > 1 and isinstance(node.args[1], list | tuple):
        return list(node.args[1])
    return None


def _inferred(size: object) -> bool:
    return isinstance(size, int) and size == -1


def _size(arg: object) -> int | torch.SymInt | None:
    value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg
    return value if isinstance(value, int | torch.SymInt) else None


def flat_gather_index(node: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """(table, i) when ``node`` views ``index(table, [i.flatten()])`` to ``i``'s dims followed by the table's
    other dims, and its result has a dynamic size; else None."""
    value, source = tensor_value(node), node.args[0] if node.args else None
    if value is None or all(isinstance(size, int) for size in value.shape) or not isinstance(source, torch.fx.Node):
        return None
    if not is_op(source, "index", "Tensor") or len(source.args) != 2:
        return None
    table, indices = source.args
    if not isinstance(indices, list | tuple) or len(indices) != 1 or not isinstance(table, torch.fx.Node):
        return None
    index = _flattened(indices[0])
    table_value, index_value, sizes = tensor_value(table), tensor_value(index), _given_sizes(node)
    if index is None or table_value is None or index_value is None or sizes is None:
        return None
    expected = [*index_value.shape, *table_value.shape[1:]]
    if is_op(node, "unflatten"):
        expected = list(index_value.shape)
    if len(sizes) != len(expected) or sum(1 for size in sizes if _inferred(size)) > 1:
        return None
    for size, wanted in zip(sizes, expected, strict=True):
        if _inferred(size):
            continue
        given_size = _size(size)
        if given_size is None or not same_size(given_size, wanted):
            return None
    return table, index


class GatherInIndexShapePass(AliasAwarePass):
    """Rewrites ``index(table, [i.flatten()]).view(*i.shape, -1)`` into ``index(table, [i])``."""

    subject = "view of a gather by a flattened index"

    def chooses(self, node: torch.fx.Node) -> bool:
        return flat_gather_index(node) is not None and not self.aliasing.is_written(node)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        found = flat_gather_index(node)
        assert found is not None
        table, index = found
        with graph_module.graph.inserting_before(node):
            gathered = call_like(graph_module.graph, node, _aten.index.Tensor, (table, [index]))
        node.replace_all_uses_with(gathered)
        return None
