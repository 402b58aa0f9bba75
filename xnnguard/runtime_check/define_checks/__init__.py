"""What XNNPACK checks when it defines, creates and first reshapes each node, evaluated on the blob.

``define_problems(graph, calls, method, delegate)`` returns a ``Problem`` for every rule a delegate
breaks that makes the runtime fail to load it, fail its first run, or read past its data. One module
per family, each check named after the rule and citing its source:

* ``values``: value definition (flags, datatypes, zero points, scales, channel dims, constants, ids);
* ``quant_params``: the quantization-parameter equality rule (kind ``quant_params``, issue 13);
* ``elementwise``, ``gemm``, ``pooling``, ``data_movement``: per node type, the datatypes, parameter
  ranges and shape rules;
* ``shapes``: the shape propagation XNNPACK runs at the first execute, with each family's shape rules.

Problem kinds: ``datatype``, ``quant_params``, ``quant_range``, ``node_params``, ``shape``, ``value_def``,
``constants``, ``unsupported_node``, plus ``extern_ids`` and ``unwritten_value`` for external-value and id
rules that ``xnnguard.runtime_check.checks`` does not already cover.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from xnnguard.boundary.xnnpack_constants import XNN_INVALID_VALUE_ID, XNN_MAX_TENSOR_DIMS
from xnnguard.runtime_check.define_checks import data_movement, elementwise, gemm, pooling
from xnnguard.runtime_check.define_checks.base import AT_LOAD, AT_RUN, Finding, NodeCheck, NodeView
from xnnguard.runtime_check.define_checks.quant_params import (
    QUANTIZATION_PRESERVING,
    check_quantization_parameters_match,
)
from xnnguard.runtime_check.define_checks.shapes import Reshape, propagate_shapes
from xnnguard.runtime_check.define_checks.values import value_findings
from xnnguard.runtime_check.pte_reader import DelegateCall
from xnnguard.runtime_check.report import Problem
from xnnguard.runtime_check.xnnpack_blob import XnnGraph, XnnNode, XnnValue

__all__ = ["DEFINE_CHECKS", "RESHAPES", "define_problems"]

DEFINE_CHECKS: dict[str, tuple[NodeCheck, ...]] = {}
RESHAPES: dict[str, Reshape] = {}
for _family in (elementwise, gemm, pooling, data_movement):
    DEFINE_CHECKS.update(_family.DEFINE_CHECKS)
    RESHAPES.update(_family.RESHAPES)
for _op in QUANTIZATION_PRESERVING:
    DEFINE_CHECKS[_op] = (check_quantization_parameters_match, *DEFINE_CHECKS.get(_op, ()))

# Fields a node may leave without a value (XNN_INVALID_VALUE_ID): a bias (XNNCompiler maps the invalid id
# to itself, XNNCompiler.cpp:2226, and XNNPACK takes it as "no bias").
_OPTIONAL_FIELDS = frozenset({"bias_id"})
# bytes per element of an ExecuTorch ScalarType (program.fbs) and of the XNNPACK datatypes a delegate
# argument can have: a delegate's external value and the tensor bound to it must agree
_SCALAR_TYPE_BYTES = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 12: 1, 13: 1, 14: 4, 15: 2}
_DATATYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int32": 4, "qint8": 1, "quint8": 1, "qint32": 4}
_LONG = 4  # ScalarType LONG: an int32 XNNPACK output the executor widens (XNNExecutor::convert_outputs)
_NOT_DEFINED = frozenset({"NONE", "XNNScaledDotProductAttention"})


def check_node_type_is_defined(node: XnnNode) -> Iterator[Finding]:
    """XNNCompiler has no definition for ScaledDotProductAttention or an empty node (getDefineNodeFunc,
    XNNCompiler.cpp:2008-2064, ends in defineNotImplementedNode): "Unhandled node type" at load."""
    if node.op in _NOT_DEFINED:
        yield Finding("unsupported_node", f"the runtime cannot define a {node.op} node: {AT_LOAD}")


def check_required_ids(node: XnnNode) -> Iterator[Finding]:
    """Every id field but a bias names a value: XNNCompiler passes XNN_INVALID_VALUE_ID through and XNNPACK
    rejects it (``check_input_node_id``, src/subgraph/validation.c:28, :83)."""
    for field, value_id in node.ids.items():
        if value_id == XNN_INVALID_VALUE_ID and field not in _OPTIONAL_FIELDS:
            yield Finding("unwritten_value", f"has no value in {field} (id 0xFFFFFFFF): {AT_LOAD}")


def check_argument_bindings(graph: XnnGraph, calls: Sequence[DelegateCall]) -> Iterator[Finding]:
    """Each external value is bound to a tensor argument of its element size (XNNExecutor.cpp:126 needs a
    tensor; XNNPACK reads and writes the argument's buffer with the value's element size, so another size
    reads or writes past it). An int32 output may land in an int64 tensor: the executor widens it."""
    if not calls:
        return
    arguments = calls[0].arg_tensors
    for value in graph.values:
        if not value.is_external or value.external_id >= len(arguments):
            continue
        meta = arguments[value.external_id]
        if meta is None:
            yield Finding(
                "extern_ids",
                f"is bound to delegate argument {value.external_id}, which is not a tensor: {AT_RUN}",
                value.id,
            )
            continue
        expected = _DATATYPE_BYTES.get(value.datatype)
        found = _SCALAR_TYPE_BYTES.get(meta.scalar_type)
        if expected is None or found is None or expected == found:
            continue
        if value.is_external_output and value.datatype == "int32" and meta.scalar_type == _LONG:
            continue
        yield Finding(
            "datatype",
            f"is {value.datatype} ({expected} bytes an element) but the method binds it to a tensor of "
            f"{found}-byte elements (argument {value.external_id}): XNNPACK reads or writes past that tensor",
            value.id,
        )


def _node_findings(node: XnnNode, values: dict[int, XnnValue]) -> Iterator[Finding]:
    yield from check_node_type_is_defined(node)
    yield from check_required_ids(node)
    view = NodeView(node, values)
    for check in DEFINE_CHECKS.get(node.op, ()):
        yield from check(view)


def define_problems(graph: XnnGraph, calls: Sequence[DelegateCall], method: str, delegate: int) -> list[Problem]:
    """Every define-, create- and reshape-time rule on one XNNPACK delegate, as problems with their place."""
    values = graph.value_map()

    def problem(finding: Finding, node: XnnNode | None) -> Problem:
        value = values.get(finding.value) if finding.value is not None else None
        return Problem(
            finding.kind,
            finding.message,
            method=method,
            delegate=delegate,
            node=node.index if node else None,
            op=node.op if node else None,
            value=finding.value,
            dims=value.dims if value is not None else None,
        )

    problems = [problem(finding, None) for finding in value_findings(graph)]
    problems += [problem(finding, None) for finding in check_argument_bindings(graph, calls)]
    for node in graph.nodes:
        problems += [problem(finding, node) for finding in _node_findings(node, values)]
    over_rank = any(len(value.dims) > _MAX_DIMS for value in graph.values)  # a rank problem (checks.py)
    if not over_rank and not any(p.kind in _NO_PROPAGATION for p in problems):
        nodes = {node.index: node for node in graph.nodes}
        for index, finding in propagate_shapes(graph, values, calls, RESHAPES):
            problems.append(problem(finding, nodes.get(index)))
    return problems


# A delegate that cannot even be defined is not reshaped: its shapes would only repeat the define failure.
_MAX_DIMS = XNN_MAX_TENSOR_DIMS
_NO_PROPAGATION = frozenset({"value_def", "unsupported_node", "node_params", "unwritten_value"})
