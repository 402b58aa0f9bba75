"""The pieces of a rewritten op are quantized as the op they replace: no rounding the original op lacks.

``rewrite_for_xnnpack`` runs before quantization, so the annotators see a rewritten op's pieces as ops of
their own. Each piece carries a stamp (``xnnguard.rewrite.provenance``):

* the pieces of an op the XNNPACK quantizer leaves float (a 3-D pooling, a batch norm of its own) stay
  float: they are marked annotated, with nothing, before the stock annotators run, and every stock
  annotator (``cat`` too) and ``propagate_annotation`` skip a node already annotated. Without that, the
  correction ``mul`` of an average pooling and the ``cat`` of a strided max pooling would each get
  observers of their own: roundings the original op does not have;
* the pieces of an op that is quantized observe its input where the original op did: on the edge
  from that input only. Every value-moving piece between it and the rewritten conv or linear takes its
  quantization from that one observer (a derived, not a shared, spec: pt2e feeds a shared observer the
  data of every edge it sits on). Left to the stock annotators, the conv2d of a rewritten Conv3d would
  observe its own input, which holds each frame once per depth tap and the zero frames of the padding:
  a histogram observer then picks another scale than the original op's;
* the float pieces of an op whose output shares its input's quantization (a mean, a share op of the
  stock quantizer: quantized only when its input is, then at its input's scale) end in that same
  quantization when their input is quantized (``share_input_quantization_of_rewritten_ops``): the one
  rounding the original op has, at its scale;
* a rewrite whose form rounds where the original does not (a Conv3d summed tap by tap) left a note,
  which becomes a record of the quantizer's report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torchao.quantization.pt2e.quantizer import (
    DerivedQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpec,
    QuantizationSpecBase,
    SharedQuantizationSpec,
)
from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

from xnnguard.report import KeptOut, Rule
from xnnguard.rewrite.provenance import rewrite_stamp

__all__ = [
    "keep_float_pieces",
    "observe_inputs_as_the_original",
    "rounding_notes",
    "share_input_quantization_of_rewritten_ops",
]

_aten = torch.ops.aten
# The ops a rewrite computes a quantized op with, and the argument they read the activation from.
_MAIN_OPS: dict[object, int] = {
    _aten.conv2d.default: 0,
    _aten.conv_transpose2d.input: 0,
    _aten.linear.default: 0,
}


def keep_float_pieces(model: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """Mark the pieces of ops that stay float as annotated with nothing; return them."""
    kept = []
    for node in model.graph.nodes:
        found = rewrite_stamp(node)
        if found is None or not found.stays_float or Q_ANNOTATION_KEY in node.meta:
            continue
        node.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(_annotated=True)
        kept.append(node)
    return kept


def _quantized_output(node: torch.fx.Node) -> bool:
    annotation = node.meta.get(Q_ANNOTATION_KEY)
    return annotation is not None and annotation.output_qspec is not None


def share_input_quantization_of_rewritten_ops(model: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """Quantize the output of each rewritten share op whose input is quantized at that input's quantization.

    The pieces stay float (``keep_float_pieces``); only the node that gives the op's result gets an
    output spec shared with the input's, so pt2e puts the one quantize the original op had after it.
    Returns those nodes. A rewritten op whose pieces read more than one activation, or give more than
    one result (none of the rewrites makes one), is left as it is.
    """
    groups: dict[str, list[torch.fx.Node]] = defaultdict(list)
    for node in model.graph.nodes:
        found = rewrite_stamp(node)
        if found is not None and found.stays_float and found.shares_input:
            groups[found.origin].append(node)
    shared = []
    for nodes in groups.values():
        members = set(nodes)
        sources = {a for n in nodes for a in n.all_input_nodes if a not in members and a.op != "get_attr"}
        results = [n for n in nodes if any(user not in members for user in n.users)]
        if len(sources) != 1 or len(results) != 1:
            continue
        (source,), (result,) = sources, results
        annotation = result.meta.get(Q_ANNOTATION_KEY)
        if not _quantized_output(source) or (annotation is not None and annotation.output_qspec is not None):
            continue
        result.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(
            input_qspec_map={}, output_qspec=SharedQuantizationSpec(source), _annotated=True
        )
        shared.append(result)
    return shared


def _groups(model: torch.fx.GraphModule) -> dict[str, list[torch.fx.Node]]:
    """The nodes of each quantized op a rewrite replaced, by the replaced node's name, in graph order."""
    groups: dict[str, list[torch.fx.Node]] = defaultdict(list)
    for node in model.graph.nodes:
        found = rewrite_stamp(node)
        if found is not None and not found.stays_float:
            groups[found.origin].append(node)
    return groups


def _between(
    entries: list[torch.fx.Node], ends: list[torch.fx.Node], members: set[torch.fx.Node]
) -> list[torch.fx.Node]:
    """Members on a path from ``entries`` to ``ends`` (both included), in graph order."""
    reached = _reachable(entries, lambda node: node.users, members)
    leads = _reachable(ends, lambda node: node.all_input_nodes, reached)
    return [node for node in entries[0].graph.nodes if node in leads]


def _reachable(
    starts: list[torch.fx.Node], step: Callable[[torch.fx.Node], Iterable[torch.fx.Node]], within: set[torch.fx.Node]
) -> set[torch.fx.Node]:
    """The nodes of ``within`` reached from ``starts`` by ``step`` (users, or inputs) without leaving it."""
    reached: set[torch.fx.Node] = set()
    pending = list(starts)
    while pending:
        node = pending.pop()
        if node in reached or node not in within:
            continue
        reached.add(node)
        pending.extend(step(node))
    return reached


def observe_inputs_as_the_original(model: torch.fx.GraphModule) -> int:
    """Move the input observation of each rewritten conv or linear to the edge from the original input.

    Returns how many rewritten ops were changed. An op whose pieces read more than one activation from
    outside (none of the rewrites makes one) is left as annotated.
    """
    changed = 0
    for nodes in _groups(model).values():
        members = set(nodes)
        mains = [n for n in nodes if n.target in _MAIN_OPS and Q_ANNOTATION_KEY in n.meta]
        activations = [n.args[_MAIN_OPS[n.target]] for n in mains]
        specs = [n.meta[Q_ANNOTATION_KEY].input_qspec_map.get(a) for n, a in zip(mains, activations)]
        if not mains or any(spec is None or isinstance(spec, SharedQuantizationSpec) for spec in specs):
            continue
        outside = {a for n in nodes for a in n.all_input_nodes if a not in members and a.op != "get_attr"}
        if len(outside) != 1:
            continue
        (source,) = outside
        entries = [n for n in nodes if source in n.all_input_nodes]
        if any(entry in mains for entry in entries):
            continue  # the conv or linear reads the original input itself: it observes it already
        path = _between(entries, [a for a in activations if isinstance(a, torch.fx.Node)], members)
        observed = specs[0]
        if not isinstance(observed, QuantizationSpec) or observed.is_dynamic:
            continue  # a dynamic quantization observes nothing ahead of time
        derived = _derived_from((source, entries[0]), observed)
        for node in path:
            inputs: dict[torch.fx.Node, QuantizationSpecBase | None] = {
                a: derived for a in node.all_input_nodes if a in members
            }
            if node in entries:
                inputs[source] = observed if node is entries[0] else derived
            node.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(
                input_qspec_map=inputs, output_qspec=derived, _annotated=True
            )
        for main, activation in zip(mains, activations):
            main.meta[Q_ANNOTATION_KEY].input_qspec_map[activation] = derived
        changed += 1
    return changed


def _first_observer_qparams(observers: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    scale, zero_point = observers[0].calculate_qparams()
    return scale, zero_point


def _derived_from(edge: tuple[torch.fx.Node, torch.fx.Node], spec: QuantizationSpec) -> DerivedQuantizationSpec:
    """The quantization ``spec``'s observer on ``edge`` computes, for another tensor: no observer of its own."""
    return DerivedQuantizationSpec(
        derived_from=[edge],
        derive_qparams_fn=_first_observer_qparams,
        dtype=spec.dtype,
        quant_min=spec.quant_min,
        quant_max=spec.quant_max,
        qscheme=spec.qscheme,
    )


def rounding_notes(model: torch.fx.GraphModule) -> list[KeptOut]:
    """One record per rewritten op whose form rounds where the original op does not."""
    records: dict[str, KeptOut] = {}
    for node in model.graph.nodes:
        found = rewrite_stamp(node)
        if found is not None and found.note and found.origin not in records:
            records[found.origin] = KeptOut(found.origin, found.op, Rule.EXTRA_ROUNDING, found.note)
    return list(records.values())
