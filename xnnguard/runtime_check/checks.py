"""What "well-formed" means for one XNNPACK delegate, as checks over its graph.

* ranks: every tensor value fits XNNPACK's rank limit (``xnnguard.rules.rank_limit``) and lists as many
  sizes as it declares dims;
* dataflow: every value a node reads is written (an external input, a constant or some node's output),
  every delegate output is written by a node, and the external ids bind each DelegateCall argument to
  exactly one value.

The stock 1.5.1 flow breaks exactly these: a rank-7 value fails at load, and an orphaned implicit q/dq
leaves a delegate whose outputs nothing writes (stale memory comes back as the result).
"""

from __future__ import annotations

from collections import Counter

import networkx as nx

from xnnguard.rules.rank_limit import XNN_MAX_TENSOR_DIMS, exceeds_rank_limit
from xnnguard.runtime_check.pte_reader import DelegateCall
from xnnguard.runtime_check.report import Problem
from xnnguard.runtime_check.xnnpack_blob import XnnGraph, XnnNode, XnnValue

__all__ = [
    "MAX_EXTERNS",
    "dataflow_graph",
    "dataflow_problems",
    "delegate_problems",
    "extern_id_problems",
    "rank_problems",
]


MAX_EXTERNS = 4096  # XNNCompiler.cpp:2194-2200: more is taken for a damaged graph


def _value_key(value_id: int) -> tuple[str, int]:
    return ("value", value_id)


def _node_key(index: int) -> tuple[str, int]:
    return ("node", index)


def dataflow_graph(graph: XnnGraph) -> nx.DiGraph:
    """Values and nodes as one directed graph: value -> node for a read, node -> value for a write.

    A value's predecessors are its writers, its successors its readers. Ids that nodes use but the
    delegate never defines appear without a ``"value"`` attribute.
    """
    flow = nx.DiGraph()
    flow.add_nodes_from((_value_key(v.id), {"value": v}) for v in graph.values)
    for node in graph.nodes:
        key = _node_key(node.index)
        flow.add_node(key, xnode=node)
        flow.add_edges_from((_value_key(i), key) for i in node.inputs)
        flow.add_edges_from((key, _value_key(o)) for o in node.outputs)
    return flow


def _toucher(flow: nx.DiGraph, value_id: int) -> XnnNode | None:
    """The node that writes a value, else the first one that reads it (to name where a problem is)."""
    key = _value_key(value_id)
    if key not in flow:
        return None
    for neighbour in (*flow.predecessors(key), *flow.successors(key)):
        return flow.nodes[neighbour]["xnode"]
    return None


def _at(
    method: str, delegate: int, node: XnnNode | None, value: XnnValue | None = None, value_id: int | None = None
) -> dict:
    """Where a problem is, as ``Problem`` keyword arguments."""
    return {
        "method": method,
        "delegate": delegate,
        "node": node.index if node else None,
        "op": node.op if node else None,
        "value": value.id if value else value_id,
        "dims": value.dims if value else None,
    }


def rank_problems(graph: XnnGraph, flow: nx.DiGraph, method: str, delegate: int) -> list[Problem]:
    problems = []
    for value in graph.values:
        node = None
        # the runtime takes the rank from the sizes listed and ignores num_dims (XNNCompiler.cpp:354-356)
        if exceeds_rank_limit(len(value.dims)):
            node = _toucher(flow, value.id)
            message = (
                f"tensor has {len(value.dims)} dims: XNNPACK rejects tensors above {XNN_MAX_TENSOR_DIMS} dims "
                f'at load ("Failed to define tensor")'
            )
            problems.append(Problem("rank", message, **_at(method, delegate, node, value)))
        if len(value.dims) != value.num_dims:
            node = node or _toucher(flow, value.id)
            message = (
                f"tensor declares {value.num_dims} dims but lists {len(value.dims)} sizes: the runtime goes by the "
                "sizes, so the graph contradicts itself (damaged, or written by another tool)"
            )
            problems.append(Problem("rank", message, **_at(method, delegate, node, value)))
    return problems


def _is_written(flow: nx.DiGraph, value: XnnValue) -> bool:
    return value.is_external_input or value.is_constant or flow.in_degree(_value_key(value.id)) > 0


def dataflow_problems(graph: XnnGraph, flow: nx.DiGraph, method: str, delegate: int) -> list[Problem]:
    """Reads of values nothing writes (or nothing has written yet), and external outputs no node writes."""
    problems = []
    seen: set[int] = set()
    written: set[int] = set()  # values some earlier node writes
    for node in graph.nodes:
        for value_id in node.inputs:
            if value_id in seen:
                continue
            seen.add(value_id)
            value = flow.nodes[_value_key(value_id)].get("value")
            if value is None:
                message = (
                    f"reads value {value_id}, which the delegate never defines: XNNPACK fails to create the runtime"
                )
                problems.append(Problem("unwritten_value", message, **_at(method, delegate, node, value_id=value_id)))
            elif not _is_written(flow, value):
                message = (
                    f"reads value {value_id}, which nothing writes (no input, constant or node output): "
                    "the op computes from uninitialized memory or XNNPACK fails to create the runtime"
                )
                problems.append(Problem("unwritten_value", message, **_at(method, delegate, node, value)))
            elif not (value.is_external_input or value.is_constant) and value_id not in written:
                # XNNPACK runs the nodes in the order they are defined (src/runtime.c): a value written by this
                # node or a later one holds nothing yet
                message = (
                    f"reads value {value_id} before any node writes it: the op computes from uninitialized memory "
                    "or the runtime crashes"
                )
                problems.append(Problem("unwritten_value", message, **_at(method, delegate, node, value)))
        written.update(node.outputs)
        for value_id in node.outputs:
            if flow.nodes[_value_key(value_id)].get("value") is None:
                message = (
                    f"writes value {value_id}, which the delegate never defines: XNNPACK fails to create the runtime"
                )
                problems.append(Problem("unwritten_value", message, **_at(method, delegate, node, value_id=value_id)))
    for value in graph.values:
        if value.is_external_output and flow.in_degree(_value_key(value.id)) == 0:
            message = (
                f"delegate output (external id {value.external_id}) is never written by any node: "
                "the method returns whatever was in that buffer"
            )
            problems.append(Problem("unwritten_output", message, **_at(method, delegate, None, value)))
    return problems


def extern_id_problems(graph: XnnGraph, calls: tuple[DelegateCall, ...], method: str, delegate: int) -> list[Problem]:
    """Each external id in ``[0, num_externs)`` binds exactly one value to one DelegateCall argument."""
    at = _at(method, delegate, None)
    problems = []
    if graph.num_externs > MAX_EXTERNS:
        message = (
            f"declares {graph.num_externs} external values, more than the {MAX_EXTERNS} the runtime accepts: "
            "the runtime fails to load the method"
        )
        problems.append(Problem("extern_ids", message, **at))
    externals = [v for v in graph.values if v.is_external_input or v.is_external_output]
    uses = Counter(v.external_id for v in externals)
    for value in externals:
        if value.external_id >= graph.num_externs:
            message = f"external id {value.external_id} is outside [0, {graph.num_externs}): the runtime cannot bind it"
            problems.append(Problem("extern_ids", message, **_at(method, delegate, None, value)))
    for external_id, count in sorted(uses.items()):
        if count > 1 and external_id < graph.num_externs:
            message = f"external id {external_id} is bound to {count} values: the runtime binds one argument to both"
            problems.append(Problem("extern_ids", message, **at))
    for call in calls:
        if len(call.args) != graph.num_externs:
            message = (
                f"the delegate declares {graph.num_externs} external values but is called with "
                f"{len(call.args)} arguments: the runtime binds the wrong buffers"
            )
            problems.append(Problem("extern_ids", message, **at))
    num_inputs = calls[0].num_inputs if calls else graph.num_externs
    # A damaged num_externs can be 2**32 - 1: look only at ids an argument or a value could take.
    bound = min(graph.num_externs, max(len(calls[0].args) if calls else 0, len(externals)))
    for external_id in range(bound):
        if uses[external_id]:
            continue
        argument = f", EValue {calls[0].args[external_id]}" if calls and external_id < len(calls[0].args) else ""
        if external_id >= num_inputs:
            message = (
                f"delegate output {external_id - num_inputs} (external id {external_id}{argument}) is bound to "
                "no value, so nothing writes it: the method returns whatever was in that buffer"
            )
            problems.append(Problem("unwritten_output", message, **at))
        else:
            message = (
                f"external id {external_id} (delegate input {external_id}{argument}) is bound to no value: "
                "the input is dropped"
            )
            problems.append(Problem("extern_ids", message, **at))
    return problems


def delegate_problems(graph: XnnGraph, calls: tuple[DelegateCall, ...], method: str, delegate: int) -> list[Problem]:
    """Every check on one XNNPACK delegate."""
    flow = dataflow_graph(graph)
    return [
        *rank_problems(graph, flow, method, delegate),
        *dataflow_problems(graph, flow, method, delegate),
        *extern_id_problems(graph, calls, method, delegate),
    ]
