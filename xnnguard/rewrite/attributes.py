"""Constant tensors of an unlifted graph module: read one, add one, drop the ones nothing reads.

The rewrites run on ``ExportedProgram.module()``, where weights are attributes read by ``get_attr``
nodes. New constants (reshaped weights, divisor maps) become attributes the same way, so that pt2e
quantization and XNNPACK both see them as parameters: floating-point ones as parameters, others as
buffers.
"""

from __future__ import annotations

import operator

import torch
from torch._guards import detect_fake_mode

__all__ = ["PREFIX", "attribute_tensor", "constant_attribute", "drop_unused_attributes"]

PREFIX = "_xnnguard_"  # every attribute xnnguard adds starts so


def attribute_tensor(graph_module: torch.fx.GraphModule, node: object) -> torch.Tensor | None:
    """The tensor a ``get_attr`` node reads, or None when ``node`` is not a ``get_attr`` (or no node)."""
    if not isinstance(node, torch.fx.Node) or node.op != "get_attr":
        return None
    value = operator.attrgetter(str(node.target))(graph_module)
    return value if isinstance(value, torch.Tensor) else None


def _fake_mode(graph: torch.fx.Graph) -> object | None:
    values = [n.meta.get("val") for n in graph.nodes if n.op == "placeholder"]
    return detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])


def constant_attribute(graph_module: torch.fx.GraphModule, base: str, tensor: torch.Tensor) -> torch.fx.Node:
    """A ``get_attr`` node (at the insertion point) of ``tensor``, registered under a new name from ``base``.

    Its ``meta["val"]`` is a fake tensor of the graph's own fake mode, like every other node's.
    """
    name = f"{PREFIX}{base}"
    suffix = 0
    while hasattr(graph_module, name):
        suffix += 1
        name = f"{PREFIX}{base}_{suffix}"
    # canonical strides, size-1 dims too: ExecuTorch derives a tensor's dim order from its strides, and a
    # folded (1, 1, n, n) value with strides (1, 1, n, 1) is "contiguous" to torch but not to XNNPACK
    tensor = tensor.detach().clone(memory_format=torch.contiguous_format)
    if tensor.is_floating_point():
        graph_module.register_parameter(name, torch.nn.Parameter(tensor, requires_grad=False))
    else:
        graph_module.register_buffer(name, tensor)
    attr = graph_module.graph.get_attr(name)
    fake_mode = _fake_mode(graph_module.graph)
    attr.meta["val"] = fake_mode.from_tensor(tensor, static_shapes=True) if fake_mode is not None else tensor  # type: ignore[attr-defined]
    return attr


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
