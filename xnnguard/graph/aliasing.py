"""Which tensors of an ATen graph share a storage, and which in-place ops write each storage.

``torch.export`` graphs keep PyTorch's in-place ops (``mask[a:b] = k`` is ``slice`` -> ``fill_``,
``x[:, 1:] += y`` is ``slice`` -> ``add_`` -> ``copy_``, ``relu_``). A view shares its input's storage, so
an in-place op on a view changes the tensor it was taken from, and every view of it read afterwards.
The ops' schemas say which: a view returns an alias of an argument (``Tensor(a)``), an in-place op
writes one (``Tensor(a!)``). ``Aliasing`` reads them once per graph: each node's *root* (the node whose
storage its tensor lives in: itself, unless it is a view or an in-place op) and each root's writers.
"""

from __future__ import annotations

import operator
from collections import defaultdict

import torch

__all__ = ["Aliasing", "aliased_input", "written_inputs"]


def _schema(node: torch.fx.Node) -> torch.FunctionSchema | None:
    return node.target._schema if isinstance(node.target, torch._ops.OpOverload) else None


def _argument(node: torch.fx.Node, index: int, name: str) -> object:
    return node.args[index] if index < len(node.args) else node.kwargs.get(name)


def written_inputs(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The tensors an in-place op writes (``fill_``, ``add_``, ``copy_``: its ``self``), by their nodes."""
    schema = _schema(node) if node.op == "call_function" else None
    if schema is None:
        return []
    written = []
    for index, argument in enumerate(schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = _argument(node, index, argument.name)
            if isinstance(value, torch.fx.Node):
                written.append(value)
    return written


def aliased_input(node: torch.fx.Node) -> torch.fx.Node | None:
    """The input whose storage ``node``'s result shares (a view's input, an in-place op's ``self``), if any."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:  # an item of ``unbind`` / ``split``: shares the source's storage
        source = node.args[0]
        return source if isinstance(source, torch.fx.Node) else None
    schema = _schema(node)
    if schema is None or not schema.returns or schema.returns[0].alias_info is None:
        return None
    sets = schema.returns[0].alias_info.before_set
    for index, argument in enumerate(schema.arguments):
        if argument.alias_info is not None and argument.alias_info.before_set & sets:
            value = _argument(node, index, argument.name)
            return value if isinstance(value, torch.fx.Node) else None
    return None


class Aliasing:
    """``root[n]``: the node whose storage ``n``'s tensor lives in; ``writers[r]``: the in-place ops
    writing root ``r``, in graph order; ``order[n]``: ``n``'s place in the graph."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.order = {node: index for index, node in enumerate(graph.nodes)}
        self.root: dict[torch.fx.Node, torch.fx.Node] = {}
        self.writers: dict[torch.fx.Node, list[torch.fx.Node]] = defaultdict(list)
        self.written: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        for node in graph.nodes:
            aliased = aliased_input(node)
            self.root[node] = self.root.get(aliased, aliased) if aliased is not None else node
            targets = written_inputs(node)
            if targets:
                self.written[node] = targets
                for target in targets:
                    self.writers[self.root.get(target, target)].append(node)

    def root_of(self, node: torch.fx.Node) -> torch.fx.Node:
        return self.root.get(node, node)

    def written_after(self, node: torch.fx.Node) -> bool:
        """True when an in-place op after ``node`` writes the storage ``node``'s tensor lives in."""
        place = self.order.get(node, -1)
        return any(self.order[w] > place for w in self.writers.get(self.root_of(node), ()))

    def is_written(self, node: torch.fx.Node) -> bool:
        """True when any in-place op writes the storage ``node``'s tensor lives in."""
        return bool(self.writers.get(self.root_of(node)))
