"""Fold every constant subgraph into a constant: computed once at rewrite time, stored as a parameter.

Invariant established: no op reads a value computed at run time that depends only on literals, on
parameters / buffers / tensor constants and on static shapes (``xnnguard.rewrite.constants``), except
an enlarging ``expand`` read only by broadcasting binary ops (kept: the consumer broadcasts it, and the
views rewrite drops it). Each such value becomes a module attribute (``attributes.constant_attribute``:
a parameter when floating-point, a buffer otherwise), so the exported program carries it as a constant
and XNNPACK sees a static tensor; the ops that computed it are erased, in-place ones included.

Why it matters: networks compute constants on every call. VideoMAE's qkv bias is
``cat(q_bias, zeros_like(v_bias), v_bias)``: a computed bias, which XNNPACK's linear refuses ("static
param" bias), so the whole qkv projection ran on the portable ``addmm``. Swin3D rebuilds its
shifted-window attention mask from ~30 slice assignments, ``eq``/``ne``/``where`` per call, and gathers
its relative-position bias with ``index`` of a constant buffer; MViT computes its relative-position
indices with ``arange`` and casts. None of these ops has an XNNPACK form; as constants they cost nothing.

Why it is exact: the values are the ones the ops compute, evaluated by the same ATen kernels, in graph
order, in place where the graph is in place (``ConstantRegion.evaluate``), each taken where its reader
reads it. Nothing that depends on an input's values, on a dynamic size or on a random op is folded.

What is left computed: a value above ``MAX_CONSTANT_ELEMENTS`` elements, a value the graph returns (a
program output that is a parameter would alias it), a value that is not a tensor, the enlarging
expand above (storing the broadcast would grow the program for nothing), and views or transposes of a
parameter alone (no compute; ExecuTorch's linear recognition reads the weight behind them). Leaving a
constant computed is always correct: what the pass leaves is reported, never tagged.

int8: a folded value is read where the computed one was, by the same op, so the quantizer observes the
same tensor at the same place (a folded linear bias is an ordinary bias); the folded ops themselves
(``cat``, ``index``, casts) were never quantized ops with a rounding of their own that matters here:
their output was observed by the same consumer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from xnnguard.graph.broadcast import broadcasts_in_place_of
from xnnguard.graph.ops import is_op
from xnnguard.graph.shapes import static_shape, tensor_value
from xnnguard.pass_result import ReportedPassResult
from xnnguard.report import Rule
from xnnguard.rewrite.attributes import constant_attribute, drop_unused_attributes
from xnnguard.rewrite.constants import ConstantRegion
from xnnguard.rewrite.node_rewrite import NodeRewritePass

__all__ = ["FoldConstantsPass", "FoldPlan"]

logger = logging.getLogger("xnnguard.rewrite")

_aten = torch.ops.aten
_EXPANDS = {_aten.expand.default, _aten.expand_copy.default, _aten.expand_as.default}


def _enlarging_expand_into_broadcasts(node: torch.fx.Node, region: ConstantRegion) -> bool:
    """True when ``node`` is an expand that enlarges its input and every reader broadcasts that input itself."""
    if node.target not in _EXPANDS or not isinstance(node.args[0], torch.fx.Node):
        return False
    source = node.args[0]
    small, large = static_shape(source), static_shape(node)
    if small is None or large is None or torch.Size(small).numel() >= torch.Size(large).numel():
        return False
    users = list(node.users)
    return bool(users) and all(u not in region and broadcasts_in_place_of(u, node, source) for u in users)


_LAYOUT_VIEWS = frozenset({"permute", "t", "transpose", "view", "reshape", "_unsafe_view", "unsqueeze", "squeeze"})


def _layout_view_of_a_parameter(node: torch.fx.Node, region: ConstantRegion) -> bool:
    """True for a chain of views and transposes of one parameter: no compute, nothing to gain by folding.

    Kept as it is because ExecuTorch reads it: its ``ConvertToLinearPass`` rebuilds a decomposed linear
    (``addmm(bias, x, permute(weight))``) from the weight behind the permute; given a folded, already
    transposed weight instead, it builds a linear with a weight of the wrong orientation.
    """
    current: object = node
    while is_op(current, _LAYOUT_VIEWS) and current in region.nodes:
        current = current.args[0]
    return current is not node and getattr(current, "op", None) in ("placeholder", "get_attr")


@dataclass
class FoldPlan:
    """What folding does to one graph: which constant inputs of which nodes become attributes."""

    graph_module: torch.fx.GraphModule
    region: ConstantRegion = field(init=False)
    kept: set[torch.fx.Node] = field(init=False)  # constant, but left computed (an expand into broadcasts)
    inputs: dict[torch.fx.Node, list[torch.fx.Node]] = field(init=False)  # reader -> constant inputs to fold
    _values: dict[tuple[torch.fx.Node, torch.fx.Node], Any] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.region = ConstantRegion(self.graph_module)
        self.kept = {
            n for n in self.region.nodes
            if _enlarging_expand_into_broadcasts(n, self.region) or _layout_view_of_a_parameter(n, self.region)
        }
        folded = self.region.nodes - self.kept
        self.inputs = {}
        for node in self.graph_module.graph.nodes:
            if node in folded or node.op in ("output", "placeholder"):
                continue
            constant = [
                n for n in dict.fromkeys(node.all_input_nodes)
                if n in folded and n.op != "get_attr" and tensor_value(n) is not None
            ]
            if constant:
                self.inputs[node] = constant

    def value(self, node: torch.fx.Node, reader: torch.fx.Node) -> Any:
        """``node``'s value as ``reader`` reads it (every read of the plan is evaluated at the first call)."""
        if self._values is None:
            reads = [(n, reader) for reader, nodes in self.inputs.items() for n in nodes]
            self._values = dict(zip(reads, self.region.evaluate(reads)))
        return self._values[(node, reader)]

    def erase_dead_constants(self) -> int:
        """Erase the constant nodes nothing reads any more (in-place writes of a storage nothing reads too)."""
        region, graph = self.region, self.graph_module.graph
        live: set[torch.fx.Node] = set()
        pending = [i for n in graph.nodes if n not in region.nodes for i in n.all_input_nodes if i in region.nodes]
        while pending:
            node = pending.pop()
            if node in live:
                continue
            live.add(node)
            pending += [i for i in node.all_input_nodes if i in region.nodes]
            pending += [w for w in region.writers.get(region.root[node], ()) if w in region.nodes]
        dead = [n for n in graph.nodes if n in region.nodes and n not in live]
        for node in reversed(dead):
            graph.erase_node(node)
        return len(dead)


class FoldConstantsPass(NodeRewritePass):
    """Replaces each constant a node reads by an attribute holding its value; erases what computed it."""

    rule = Rule.NOT_REWRITTEN  # reported; leaving a constant computed is always correct
    tags_what_it_leaves = False
    subject = "constant input"

    def __init__(self) -> None:
        super().__init__()
        self._plan: FoldPlan | None = None
        self._attributes: dict[int, torch.fx.Node] = {}

    @contextmanager
    def _planned(self, graph_module: torch.fx.GraphModule) -> Iterator[FoldPlan]:
        self._plan, self._attributes = FoldPlan(graph_module), {}
        try:
            yield self._plan
        finally:
            self._plan, self._attributes = None, {}

    def _current(self, node: torch.fx.Node) -> FoldPlan:
        if self._plan is None:  # picks called on its own: plan the node's graph
            owner = node.graph.owning_module
            assert isinstance(owner, torch.fx.GraphModule)
            return FoldPlan(owner)
        return self._plan

    def picks(self, node: torch.fx.Node) -> bool:
        return node in self._current(node).inputs

    def applies_to(self, graph_module: torch.fx.GraphModule) -> bool:
        with self._planned(graph_module) as plan:
            return bool(plan.inputs)

    def ensures(self, graph_module: torch.fx.GraphModule) -> None:
        with self._planned(graph_module):
            super().ensures(graph_module)

    def call(self, graph_module: torch.fx.GraphModule) -> ReportedPassResult:
        with self._planned(graph_module) as plan:
            result = super().call(graph_module)
            erased = plan.erase_dead_constants() if result.modified else 0
        if erased:
            graph_module.graph.eliminate_dead_code()
            drop_unused_attributes(graph_module)
            graph_module.graph.lint()
            graph_module.recompile()
            logger.debug("FoldConstantsPass: %d constant nodes erased", erased)
        return result

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        plan = self._current(node)
        values = {constant: plan.value(constant, node) for constant in plan.inputs[node]}
        for constant, value in values.items():
            if not isinstance(value, torch.Tensor):
                return f"{constant.name} evaluates to a {type(value).__name__}, not a tensor"
        for constant, value in values.items():
            attribute = self._attributes.get(id(value))
            if attribute is None:
                with graph_module.graph.inserting_before(node):
                    attribute = constant_attribute(graph_module, f"folded_{constant.name}", value)
                self._attributes[id(value)] = attribute
            node.replace_input_with(constant, attribute)
        return None

