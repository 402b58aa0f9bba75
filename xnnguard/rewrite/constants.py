"""A convolution node's operands as the rewrites need them: its input node, and its weight and bias as tensors.

The 3-D conv rewrites bake the weight into new 2-D constants, so they apply only when weight and bias
are constants: parameters (``get_attr`` of the unlifted module), or computed from parameters alone,
as a weight-normalized conv's weight is (``aten._weight_norm`` of two parameters; video VAEs use it).
Such a computation is run once here; otherwise the rewrites say why and leave the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.fx.operator_schemas import normalize_function

from xnnguard.rewrite.splice import attribute_tensor

__all__ = ["ConvOperands", "constant_value", "conv_operands"]


@dataclass(frozen=True)
class ConvOperands:
    input: torch.fx.Node
    weight: torch.Tensor
    bias: torch.Tensor | None


_MAX_CONSTANT_OPS = 32  # a weight computed by more ops than this is not a parametrization


def _is_random(node: torch.fx.Node) -> bool:
    """A random op (``randn``, ``dropout``...) gives another value on every run: never a constant."""
    return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


def constant_value(graph_module: torch.fx.GraphModule, node: object) -> torch.Tensor | None:
    """The value of ``node`` when it depends on parameters and literals only, else None."""
    if not isinstance(node, torch.fx.Node):
        return None
    values: dict[torch.fx.Node, Any] = {}  # a parameter, an op's result, or None while unknown
    pending = [node]
    while pending:  # the nodes ``node`` is computed from, each a parameter or an op
        current = pending.pop()
        if current in values:
            continue
        if current.op == "get_attr":
            values[current] = attribute_tensor(graph_module, current)
            if values[current] is None:
                return None
        elif current.op == "call_function" and len(values) < _MAX_CONSTANT_OPS and not _is_random(current):
            values[current] = None
            pending += current.all_input_nodes
        else:
            return None
    order = {n: i for i, n in enumerate(graph_module.graph.nodes)}
    with torch.no_grad():
        for current in sorted((n for n in values if n.op == "call_function"), key=order.__getitem__):
            args, kwargs = torch.fx.node.map_arg((current.args, current.kwargs), values.__getitem__)
            assert callable(current.target)
            values[current] = current.target(*args, **kwargs)
    value = values[node]
    return value if isinstance(value, torch.Tensor) else None


def conv_operands(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> ConvOperands | str:
    """The operands of convolution ``node``, or why its weight or bias is not a constant."""
    assert callable(node.target)  # the op of a call_function node
    normalized = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
    assert normalized is not None
    weight = constant_value(graph_module, normalized.kwargs["weight"])
    if weight is None:
        return "its weight is not computed from parameters alone"
    bias_node = normalized.kwargs.get("bias")
    bias = constant_value(graph_module, bias_node)
    if bias_node is not None and bias is None:
        return "its bias is not computed from parameters alone"
    return ConvOperands(normalized.kwargs["input"], weight, bias)
