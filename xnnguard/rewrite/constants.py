"""Which nodes of a graph compute a constant, and their values, evaluated once at rewrite time.

A node is constant when its value depends only on literals, on the graph's parameters, buffers and
tensor constants (``get_attr`` nodes of the unlifted module), and on the *shapes* (dtype, device,
strides) of other tensors: ``zeros_like(x)``, ``x.new_zeros(...)`` and ``full_like(x, v)`` read nothing
of ``x`` but its metadata, and the graph's sizes are static there. Attention masks built with ``arange``
/ slice assignment / ``where``, relative-position index tables, ``index`` of a parameter table with
constant indices and a weight computed from parameters (``aten._weight_norm``) are all constant.

What is never constant:

* a random op (``randn``, ``dropout``...: another value on every run) and an uninitialized one
  (``empty``, ``empty_like``...: whatever the memory held);
* an op outside the ``aten`` namespace (quantize/dequantize ops above all: folding a dequantized
  weight into a float constant would drop its quantization);
* anything that reads an input's values, or a size that is dynamic (an op that reads only an input's
  dtype and device, ``x.new_zeros(...)``, does not read its sizes);
* a value above ``MAX_CONSTANT_ELEMENTS`` elements (a budget on the memory evaluation takes and on what
  a folded constant adds to the program);
* a tensor whose storage an in-place op writes with a non-constant value, or a parameter or buffer
  that an in-place op writes at all (that is state, not a constant).

In-place ops are part of the graphs ``torch.export`` gives (``mask[a:b, c:d] = k`` is ``slice`` ->
``fill_``; ``attn[:, :, 1:] += r`` is ``slice`` -> ``add_`` -> ``copy_``): a tensor and its views share one
storage (its *root*, found from the ops' schemas: a view returns an alias of its input), and a view's
value is the storage's state when it is read. So ``ConstantRegion.evaluate`` runs the constant nodes in
graph order on real tensors, in place where the graph is in place, exactly as eager does, and takes each
value when its reader would read it.
"""

from __future__ import annotations

import math
import operator
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from xnnguard.graph.aliasing import Aliasing
from xnnguard.rewrite.attributes import attribute_tensor

__all__ = ["MAX_CONSTANT_ELEMENTS", "ConstantRegion", "constant_value"]

_aten = torch.ops.aten

# 256 MiB of float32: a larger value is left computed. Swin3D-T's shifted-window mask at its published
# 32x224x224 is 128 windows x 392 x 392 tokens, 19.7M elements: left computed, its ne / eq / where split
# the program in two delegates with six ops on portable kernels, on every forward.
MAX_CONSTANT_ELEMENTS = 1 << 26

# Ops whose tensor argument at these positions gives only its metadata (shape, dtype, device, strides).
_METADATA_ARGUMENTS: dict[Any, tuple[int, ...]] = {
    _aten.zeros_like.default: (0,),
    _aten.ones_like.default: (0,),
    _aten.full_like.default: (0,),
    _aten.new_zeros.default: (0,),
    _aten.new_ones.default: (0,),
    _aten.new_full.default: (0,),
    _aten.type_as.default: (1,),
    _aten.expand_as.default: (1,),
    _aten.view_as.default: (1,),
    _aten.reshape_as.default: (1,),
    _aten.fill.Scalar: (0,),
    _aten.fill.Tensor: (0,),
}

# Of those, the ops that read no size of that argument (its dtype and device only): a dynamic size of it
# (a dynamic batch) does not make their result any less constant. ``x.new_zeros(d, h, w)`` is how
# Swin3D starts its attention mask.
_DTYPE_ONLY = frozenset(
    {_aten.new_zeros.default, _aten.new_ones.default, _aten.new_full.default, _aten.type_as.default}
)

# Ops whose result is whatever the memory held: never a constant, however it is filled afterwards.
_UNINITIALIZED = frozenset(
    {"aten::empty", "aten::empty_like", "aten::new_empty", "aten::empty_strided", "aten::new_empty_strided",
     "aten::empty_permuted"}
)


def _is_random(node: torch.fx.Node) -> bool:
    """A random op (``randn``, ``dropout``...) gives another value on every run: never a constant."""
    return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


def _metadata_inputs(node: torch.fx.Node) -> set[torch.fx.Node]:
    """The inputs of ``node`` it reads the metadata of only."""
    positions = _METADATA_ARGUMENTS.get(node.target, ())
    found = [node.args[i] for i in positions if i < len(node.args)]
    return {arg for arg in found if isinstance(arg, torch.fx.Node)}


def _static_tensors(value: object) -> bool:
    """True when every tensor in ``value`` has static sizes within the element budget."""
    import torch.utils._pytree as pytree

    for leaf in pytree.tree_leaves(value):
        if isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return False
        if isinstance(leaf, torch.Tensor):
            if not all(isinstance(size, int) for size in leaf.shape):
                return False
            if math.prod(leaf.shape) > MAX_CONSTANT_ELEMENTS:
                return False
    return True


def _evaluable(node: torch.fx.Node) -> bool:
    """True when ``node`` is an op constant folding may run: deterministic, initialized, in ``aten``."""
    if node.target is operator.getitem:
        return True
    schema = node.target._schema if isinstance(node.target, torch._ops.OpOverload) else None
    if schema is None or not schema.name.startswith("aten::") or schema.name in _UNINITIALIZED:
        return False
    return not _is_random(node) and _static_tensors(node.meta.get("val"))


class ConstantRegion:
    """The constant nodes of a graph module (``nodes``), how their storages alias, and their values.

    ``root[n]`` is the node whose storage ``n``'s tensor lives in (``n`` itself unless ``n`` is a view
    or an in-place op); ``writers[r]`` the in-place ops, in graph order, that write root ``r``.
    """

    def __init__(self, graph_module: torch.fx.GraphModule) -> None:
        self.graph_module = graph_module
        aliasing = Aliasing(graph_module.graph)
        self.order, self.root, self.writers = aliasing.order, aliasing.root, aliasing.writers
        self._written = aliasing.written
        self.nodes = self._constant_nodes()

    def _constant_nodes(self) -> set[torch.fx.Node]:
        """Every constant node: the fixpoint of "constant inputs, and no storage a non-constant op writes"."""
        tainted: set[torch.fx.Node] = set()  # roots written by a non-constant op, or state
        while True:
            constant: set[torch.fx.Node] = set()
            for node in self.graph_module.graph.nodes:
                if self.root[node] in tainted:
                    continue
                if node.op == "get_attr":
                    if attribute_tensor(self.graph_module, node) is not None:
                        constant.add(node)
                elif node.op == "call_function" and _evaluable(node):
                    metadata = _metadata_inputs(node)
                    inputs = [n for n in node.all_input_nodes if n not in metadata]
                    sized = () if node.target in _DTYPE_ONLY else metadata
                    if all(n in constant for n in inputs) and all(_static_tensors(n.meta.get("val")) for n in sized):
                        constant.add(node)
            more = set()
            for writer, targets in self._written.items():
                for target in targets:
                    root = self.root.get(target, target)
                    if writer not in constant or root.op == "get_attr":
                        more.add(root)
            if more <= tainted:
                return constant
            tainted |= more

    def __contains__(self, node: object) -> bool:
        return node in self.nodes

    def needed(self, nodes: Iterable[torch.fx.Node]) -> set[torch.fx.Node]:
        """The constant nodes that computing ``nodes`` runs: their inputs and every write to their storages."""
        needed: set[torch.fx.Node] = set()
        pending = list(nodes)
        while pending:
            node = pending.pop()
            if node in needed or node not in self.nodes:
                continue
            needed.add(node)
            pending += node.all_input_nodes
            pending += [w for w in self.writers.get(self.root[node], ()) if w in self.nodes]
        return needed

    def evaluate(self, reads: Sequence[tuple[torch.fx.Node, torch.fx.Node | None]]) -> list[Any]:
        """The value of each ``(node, reader)``: ``node``'s value as ``reader`` reads it (None: at the end).

        Runs the needed constant nodes in graph order on real tensors; a value whose storage is written
        again later is copied at its reader's place.
        """
        needed = self.needed(node for node, _ in reads)
        end = len(self.order)
        by_place: dict[int, list[int]] = defaultdict(list)
        for index, (_, reader) in enumerate(reads):
            by_place[self.order[reader] if reader is not None else end].append(index)
        values: dict[torch.fx.Node, Any] = {}
        results: list[Any] = [None] * len(reads)

        def take(place: int) -> None:
            for index in by_place.get(place, ()):
                node = reads[index][0]
                value = values[node]
                later = any(self.order[w] >= place for w in self.writers.get(self.root[node], ()) if w in needed)
                results[index] = value.clone() if later and isinstance(value, torch.Tensor) else value

        with torch.no_grad():
            for node in sorted(needed | {r for _, r in reads if r is not None}, key=self.order.__getitem__):
                take(self.order[node])
                if node not in needed:
                    continue
                if node.op == "get_attr":
                    values[node] = attribute_tensor(self.graph_module, node)
                    continue
                metadata = _metadata_inputs(node)
                dtype_only = node.target in _DTYPE_ONLY

                def value_of(
                    arg: torch.fx.Node, metadata: set[torch.fx.Node] = metadata, empty: bool = dtype_only
                ) -> Any:
                    if arg in metadata:
                        fake = arg.meta["val"]
                        if empty:  # its sizes may be dynamic, and are not read
                            return torch.empty(0, dtype=fake.dtype, device=fake.device)
                        return torch.empty_strided(fake.shape, fake.stride(), dtype=fake.dtype, device=fake.device)
                    return values[arg]

                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), value_of)
                assert callable(node.target)
                values[node] = node.target(*args, **kwargs)
            take(end)
        return results


def constant_value(graph_module: torch.fx.GraphModule, node: object) -> torch.Tensor | None:
    """The value of ``node`` when it is constant (see the module docstring) and nothing writes it, else None."""
    if not isinstance(node, torch.fx.Node):
        return None
    region = ConstantRegion(graph_module)
    if node not in region or region.writers.get(region.root[node]):
        return None
    (value,) = region.evaluate([(node, None)])
    return value if isinstance(value, torch.Tensor) else None

