"""In-place updates of slices (``x[:, 1:] += y``, ``x[..., :k] = v``) as slices and ``cat``: no ``slice_scatter``.

Invariant established: no tensor computed in the graph is written in place through a slice or a
``select`` of it, when the sliced dims have static sizes and each in-place op has a functional form of
the same dtype. ``to_edge`` turns such a write into ``slice_scatter`` (plus ``copy``), which ExecuTorch
1.5.1's XNNPACK partitioner has no config for: MViT's ``attn[:, :, 1:, 1:] += rel_pos`` and residual
pooling ``x[:, :, 1:] += q[:, :, 1:]`` cut every attention block out of its delegate.

How: the writes of one tensor are replayed in graph order on a functional value of the whole tensor
(the "current" value, at first the tensor itself). An in-place op on a view of it computes its functional
form on the view of the current value (``add_`` -> ``add``, ``copy_(v, s)`` -> ``s``) and makes a new
current value: the view's range replaced, which is a ``cat`` of the slices before the range, the new
values and the slices after it (one ``cat`` per sliced dim, innermost first; a ``select`` is a slice of
size 1). Every later reader of the tensor, or of any view of it, reads the same view of the current value
at its place. A ``copy_`` of a view onto the same view of the same value writes nothing and is skipped.

Why it is exact: the ``cat`` puts every element of the current value back where it was, except those of
the written range, which hold what the in-place op computed from the same operands; a reader sees the
value it saw before. Writes of a graph input or a parameter (state), through views other than slices
with step 1 and selects, or whose functional form would change the dtype are left as they were.

int8: the functional op (``add``...) is quantized like the in-place op it replaces (the stock quantizer
annotates ``add_`` too); the slices and ``cat`` stay float, as the ``slice_scatter`` they replace was:
a quantized ``cat`` would round the unwritten elements, which the original does not.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from xnnguard.graph.aliasing import Aliasing, aliased_input
from xnnguard.graph.args import int_arg
from xnnguard.graph.ops import target_name
from xnnguard.graph.shapes import tensor_value
from xnnguard.pass_result import ReportedPassResult
from xnnguard.report import Rule
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.provenance import RewriteStamp, stamp
from xnnguard.rules.tagged import tag_of

__all__ = ["InPlaceSliceUpdatesPass"]

logger = logging.getLogger("xnnguard.rewrite")

_aten = torch.ops.aten
_END = 2**63 - 1


@dataclass(frozen=True)
class Step:
    """One view step from a tensor: ``slice(dim, start, end)`` (step 1, bounds normalized) or another view."""

    kind: str  # "slice", or "view" (any other view op: re-applied on read, never written through)
    dim: int = 0
    start: int = 0
    end: int = 0
    node: torch.fx.Node | None = None  # the original view node of a "view" step


def _step(view: torch.fx.Node) -> Step | None:
    """The ``Step`` ``view`` takes from its input, or None for ``alias`` (no step at all)."""
    source = tensor_value(view.args[0])
    if view.target is _aten.alias.default:
        return None
    if source is None:
        return Step("view", node=view)
    if view.target in (_aten.slice.Tensor, _aten.select.int):
        args = list(view.args) + [None] * (5 - len(view.args))
        dim = int_arg(args[1] if args[1] is not None else view.kwargs.get("dim", 0)) % max(source.dim(), 1)
        size = source.shape[dim]
        if not isinstance(size, int):
            return Step("view", node=view)
        if view.target is _aten.select.int:
            index = int_arg(args[2]) % size
            return Step("select", dim, index, index + 1)
        start, end = args[2], args[3]
        step = args[4] if args[4] is not None else view.kwargs.get("step", 1)
        if not all(isinstance(v, (int, type(None))) for v in (start, end)) or step != 1:
            return Step("view", node=view)
        begin, stop, _ = slice(start, _END if end is None else end).indices(size)
        return Step("slice", dim, begin, max(begin, stop))
    return Step("view", node=view)


def _shape(node: torch.fx.Node) -> list[int | torch.SymInt]:
    value = tensor_value(node)
    assert value is not None
    return list(value.shape)


def _functional(writer: torch.fx.Node) -> Any | None:
    """The functional form of in-place op ``writer`` (``add_.Tensor`` -> ``add.Tensor``), or None."""
    target = writer.target
    if not isinstance(target, torch._ops.OpOverload) or not target._schema.name.startswith("aten::"):
        return None
    name = target._schema.name[len("aten::"):]
    if not name.endswith("_") or name == "copy_":
        return None
    packet = getattr(_aten, name[:-1], None)
    return getattr(packet, target._overloadname, None) if packet is not None else None


def _is_a_view(target: torch.fx.Node, root: torch.fx.Node, aliasing: Aliasing) -> bool:
    """Whether ``target`` is a view of ``root`` rather than ``root`` itself.

    An in-place op returns the tensor it wrote, and ``alias`` is the same tensor: ``relu_(add_(bn, r))``
    (ResNet's residual with an in-place ReLU) writes the batch norm's whole output, not a slice of it.
    """
    node: torch.fx.Node | None = target
    while node is not None and node is not root:
        if node not in aliasing.written and node.target is not _aten.alias.default:
            return True
        node = aliased_input(node)
    return False


class _Replay:
    """The writes of one root replayed on a functional current value (see the module docstring)."""

    def __init__(self, graph_module: torch.fx.GraphModule, root: torch.fx.Node, aliasing: Aliasing) -> None:
        self.graph = graph_module.graph
        self.root = root
        self.aliasing = aliasing
        self.current = root
        self.paths: dict[torch.fx.Node, tuple[Step, ...]] = {root: ()}
        self.views: dict[tuple[torch.fx.Node, tuple[Step, ...]], torch.fx.Node] = {(root, ()): root}

    def view_of(self, path: tuple[Step, ...], at: torch.fx.Node) -> torch.fx.Node:
        """The view ``path`` of the current value, inserted before ``at`` (or an existing node of it)."""
        if not path:
            return self.current
        key = (self.current, path)
        if key in self.views:
            return self.views[key]
        base = self.view_of(path[:-1], at)
        step = path[-1]
        with self.graph.inserting_before(at):
            if step.kind == "view":
                original = step.node
                assert original is not None and callable(original.target)
                node = call_like(self.graph, original, original.target, (base, *original.args[1:]), original.kwargs)
            else:
                node = call_like(self.graph, at, _aten.slice.Tensor, (base, step.dim, step.start, step.end))
                if step.kind == "select":
                    shape = _shape(node)
                    del shape[step.dim]
                    node = call_like(self.graph, at, _aten.reshape.default, (node, shape))
        self.views[key] = node
        return node

    def scatter(self, path: tuple[Step, ...], value: torch.fx.Node, at: torch.fx.Node) -> torch.fx.Node:
        """The current value with view ``path`` replaced by ``value``, inserted before ``at``."""
        for depth in range(len(path), 0, -1):
            step = path[depth - 1]
            base = self.view_of(path[: depth - 1], at)
            size = _shape(base)[step.dim]
            with self.graph.inserting_before(at):
                if step.kind == "select":
                    shape = _shape(value)
                    shape.insert(step.dim, 1)
                    value = call_like(self.graph, at, _aten.reshape.default, (value, shape))
                pieces = []
                if step.start > 0:
                    pieces.append(call_like(self.graph, at, _aten.slice.Tensor, (base, step.dim, 0, step.start)))
                pieces.append(value)
                if step.end < size:
                    pieces.append(call_like(self.graph, at, _aten.slice.Tensor, (base, step.dim, step.end, size)))
                if len(pieces) > 1:
                    value = call_like(self.graph, at, _aten.cat.default, (pieces, step.dim))
        return value

    def why_not(self) -> str | None:
        """Why this root's writes cannot be replayed (checked before anything is inserted), or None."""
        if self.root.op != "call_function":
            return "it is a graph input or a parameter (state)"
        for node in self._aliases():
            if node in self.aliasing.written:
                targets = self.aliasing.written[node]
                if len(targets) != 1 or node.args[0] is not targets[0]:
                    return f"{node.name} writes an argument other than its first"
                if node.target is not _aten.copy_.default and _functional(node) is None:
                    return f"{node.name} ({target_name(node)}) has no functional form"
            elif not isinstance(node.target, torch._ops.OpOverload):
                return f"{node.name} is a view this rewrite does not replay ({target_name(node)})"
        return None

    def _aliases(self) -> list[torch.fx.Node]:
        """The views of the root and the in-place ops on them, in graph order."""
        place = self.aliasing.order[self.root]
        return sorted(
            (n for n, i in self.aliasing.order.items() if i > place and self.aliasing.root.get(n) is self.root),
            key=self.aliasing.order.__getitem__,
        )

    def run(self) -> str | None:
        """Replay every write; redirect every reader. None when done, else why (nothing inserted then)."""
        place = self.aliasing.order[self.root]
        order = sorted((n for n, i in self.aliasing.order.items() if i > place), key=self.aliasing.order.__getitem__)
        aliases = self._aliases()
        writers = [n for n in aliases if n in self.aliasing.written]
        paths = dict(self.paths)
        for node in aliases:  # first the paths, to check every write goes through slices
            if node in self.aliasing.written:
                path = paths[node.args[0]]  # type: ignore[index]
                if any(step.kind == "view" for step in path):
                    return f"{node.name} writes through a view that is not a slice or a select"
                paths[node] = path
            else:
                step = _step(node)
                paths[node] = paths[aliased_input(node)] + ((step,) if step is not None else ())  # type: ignore[index]
        if all(not paths[w] for w in writers):
            return "nothing writes it through a view"
        self.paths = paths
        for node in order:
            if node in self.aliasing.written and self.aliasing.root.get(node) is self.root:
                self._write(node)
            elif self.aliasing.root.get(node) is self.root and node.op != "output":
                self.views.setdefault((self.root, self.paths[node]), node)  # the root is never written now
            else:
                for arg in dict.fromkeys(node.all_input_nodes):
                    if arg in self.paths:
                        node.replace_input_with(arg, self.view_of(self.paths[arg], node))
        for node in reversed(aliases):  # the writes, and the old views nothing reads any more
            if node in self.aliasing.written and node.users:
                raise AssertionError(f"{node.name} is still read by {list(node.users)}")
            if not node.users:
                self.graph.erase_node(node)
        return None

    def _write(self, writer: torch.fx.Node) -> None:
        target = writer.args[0]
        assert isinstance(target, torch.fx.Node)
        path = self.paths[target]
        view = tensor_value(target)
        assert view is not None
        if writer.target is _aten.copy_.default:
            source = writer.args[1]
            if isinstance(source, torch.fx.Node) and self.paths.get(source) == path:
                return  # the view copied onto itself: nothing changes
            value = self._read(source, writer)
            assert isinstance(value, torch.fx.Node)
            src = tensor_value(value)
            assert src is not None
            with self.graph.inserting_before(writer):
                if src.dtype != view.dtype:
                    value = call_like(self.graph, writer, _aten._to_copy.default, (value,), {"dtype": view.dtype})
                if tuple(src.shape) != tuple(view.shape):
                    value = call_like(self.graph, writer, _aten.expand.default, (value, list(view.shape)))
        else:
            operands = [self._read(arg, writer) for arg in writer.args[1:]]
            kwargs = {k: self._read(v, writer) for k, v in writer.kwargs.items()}
            current_view = self.view_of(path, writer)
            with self.graph.inserting_before(writer):
                value = call_like(self.graph, writer, _functional(writer), (current_view, *operands), kwargs)
                stamp(value, RewriteStamp(writer.name, target_name(writer), stays_float=False))
                if tensor_value(value).dtype != view.dtype:  # type: ignore[union-attr]
                    value = call_like(self.graph, writer, _aten._to_copy.default, (value,), {"dtype": view.dtype})
        self.current = self.scatter(path, value, writer)
        self.views[(self.current, path)] = value

    def _read(self, arg: Any, at: torch.fx.Node) -> Any:
        if isinstance(arg, torch.fx.Node) and arg in self.paths:
            return self.view_of(self.paths[arg], at)
        return arg


class InPlaceSliceUpdatesPass(NodeRewritePass):
    """Replays the in-place writes through slices of each computed tensor as slices and ``cat``."""

    rule = Rule.NOT_REWRITTEN  # reported; the portable kernels run slice_scatter, nothing fails
    tags_what_it_leaves = False
    subject = "in-place slice update"
    pieces_stay_float = True

    def __init__(self) -> None:
        super().__init__()
        self._aliasing: Aliasing | None = None

    @contextmanager
    def _read_aliasing(self, graph_module: torch.fx.GraphModule) -> Iterator[None]:
        self._aliasing = Aliasing(graph_module.graph)
        try:
            yield
        finally:
            self._aliasing = None

    def _writes_through_views(self, node: torch.fx.Node, aliasing: Aliasing) -> bool:
        return any(
            _is_a_view(target, node, aliasing)
            for writer in aliasing.writers.get(node, ()) for target in aliasing.written[writer]
        )

    def picks(self, node: torch.fx.Node) -> bool:
        if self._aliasing is None:
            with self._read_aliasing(node.graph.owning_module):  # type: ignore[arg-type]
                return self.picks(node)
        aliasing = self._aliasing
        return (
            node.op == "call_function"
            and aliasing.root.get(node) is node
            and not tag_of(node)
            and self._writes_through_views(node, aliasing)
        )

    def call(self, graph_module: torch.fx.GraphModule) -> ReportedPassResult:
        with self._read_aliasing(graph_module):
            return super().call(graph_module)

    def ensures(self, graph_module: torch.fx.GraphModule) -> None:
        with self._read_aliasing(graph_module):
            super().ensures(graph_module)

    def applies_to(self, graph_module: torch.fx.GraphModule) -> bool:
        with self._read_aliasing(graph_module):
            return super().applies_to(graph_module)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        assert self._aliasing is not None
        replay = _Replay(graph_module, node, self._aliasing)
        reason = replay.why_not()
        if reason is not None:
            return reason
        reason = replay.run()
        if reason is None:
            logger.debug("%s: in-place slice updates replayed as slices and cat", node.name)
        return reason
