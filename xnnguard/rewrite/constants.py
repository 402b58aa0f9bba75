"""The value of a node computed from parameters and literals alone, evaluated once at rewrite time.

A rewrite that bakes a tensor into new constants (a 3-D conv's weight, folded into 2-D weights) needs
it as a tensor: a parameter (``get_attr`` of the unlifted module), or computed from parameters alone,
as a weight-normalized conv's weight is (``aten._weight_norm`` of two parameters; video VAEs use it).
"""

from __future__ import annotations

from typing import Any

import torch

from xnnguard.rewrite.attributes import attribute_tensor

__all__ = ["constant_value"]


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
