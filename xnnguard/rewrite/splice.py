"""Put a plain-PyTorch replacement in place of one node of an unlifted ATen graph.

The rewrites write what a node becomes as an ordinary function of tensors (testable in eager), and this
module turns it into ATen nodes: it traces the function with ``make_fx`` on fake tensors of the node's
input shapes (``pre_dispatch``, so the ops are the ones ``torch.export`` itself produces), copies the
traced nodes in front of the node, and registers the constant tensors the function needs (reshaped
weights, divisor maps) as attributes of the graph module, read through ``get_attr`` nodes, so that
pt2e quantization and XNNPACK both see them as parameters.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

import torch
from torch.fx.experimental.proxy_tensor import make_fx

__all__ = ["attribute_tensor", "constant_attribute", "drop_unused_attributes", "splice_before"]

_PREFIX = "_xnnguard_"


def attribute_tensor(graph_module: torch.fx.GraphModule, node: object) -> torch.Tensor | None:
    """The tensor a ``get_attr`` node reads, or None when ``node`` is not a ``get_attr`` (or no node)."""
    if not isinstance(node, torch.fx.Node) or node.op != "get_attr":
        return None
    value = operator.attrgetter(str(node.target))(graph_module)
    return value if isinstance(value, torch.Tensor) else None


def constant_attribute(graph_module: torch.fx.GraphModule, base: str, tensor: torch.Tensor) -> torch.fx.Node:
    """A ``get_attr`` node (at the insertion point) of ``tensor``, registered under a new name from ``base``."""
    name = f"{_PREFIX}{base}"
    suffix = 0
    while hasattr(graph_module, name):
        suffix += 1
        name = f"{_PREFIX}{base}_{suffix}"
    tensor = tensor.detach().contiguous()
    if tensor.is_floating_point():
        graph_module.register_parameter(name, torch.nn.Parameter(tensor, requires_grad=False))
    else:
        graph_module.register_buffer(name, tensor)
    attr = graph_module.graph.get_attr(name)
    attr.meta["val"] = tensor
    return attr


def _example(value: torch.fx.Node | torch.Tensor) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    meta = value.meta["val"]
    return torch.zeros(tuple(int(s) for s in meta.shape), dtype=meta.dtype)


def splice_before(
    graph_module: torch.fx.GraphModule,
    node: torch.fx.Node,
    replacement: Callable[..., torch.Tensor],
    inputs: Sequence[torch.fx.Node | torch.Tensor],
) -> torch.fx.Node:
    """Insert ``replacement(*inputs)`` as ATen nodes in front of ``node`` and return its output node.

    ``inputs`` are nodes of the graph (activations) or constant tensors, which become attributes named
    after ``node``. The caller redirects ``node``'s users; the input shapes must be static.
    """
    examples = [_example(value) for value in inputs]
    traced = make_fx(replacement, tracing_mode="fake", pre_dispatch=True)(*examples)
    graph = graph_module.graph
    with graph.inserting_before(node):
        arguments = [
            value
            if isinstance(value, torch.fx.Node)
            else constant_attribute(graph_module, f"{node.name}_{index}", value)
            for index, value in enumerate(inputs)
        ]
        placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
        value_map: dict[torch.fx.Node, torch.fx.Node] = dict(zip(placeholders, arguments))
        output = graph.graph_copy(traced.graph, value_map)
    if isinstance(output, (tuple, list)):
        (output,) = output
    assert isinstance(output, torch.fx.Node)
    for copied in value_map.values():
        if copied.op == "call_function":
            copied.meta.setdefault("nn_module_stack", node.meta.get("nn_module_stack", {}))
            if "stack_trace" in node.meta:
                copied.meta.setdefault("stack_trace", node.meta["stack_trace"])
    return output


def drop_unused_attributes(graph_module: torch.fx.GraphModule) -> None:
    """Delete parameters and buffers no ``get_attr`` reads any more (a rewritten 3-D conv's weight).

    ``torch.export`` lifts every parameter of the module, used or not; without this the old 5-D weights
    would travel into the program next to their 2-D replacements.
    """
    used = {str(n.target) for n in graph_module.graph.nodes if n.op == "get_attr"}
    named = list(graph_module.named_parameters(remove_duplicate=False)) + list(
        graph_module.named_buffers(remove_duplicate=False)
    )
    for name, _ in named:
        if name in used:
            continue
        owner_path, _, attr = name.rpartition(".")
        owner = graph_module.get_submodule(owner_path) if owner_path else graph_module
        if attr in owner._parameters:
            del owner._parameters[attr]
        elif attr in owner._buffers:
            del owner._buffers[attr]
