"""Add an ATen node to an exported graph with the meta a trace would give it.

An exported program's verifier wants ``meta["val"]`` on every node; a rewrite that adds a node computes
it on the fake tensors already in the graph, and keeps the origin (``nn_module_stack``, ``stack_trace``)
of the node it replaces so that reports and debuggers still point at the user's module.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._guards import detect_fake_mode

__all__ = ["call_like"]

_ORIGIN_KEYS = ("nn_module_stack", "stack_trace")


def call_like(graph: torch.fx.Graph, origin: torch.fx.Node, target: Any, args: tuple[Any, ...]) -> torch.fx.Node:
    """A new ``target(*args)`` node (at the graph's insertion point) standing in for ``origin``."""
    node = graph.call_function(target, args)
    for key in _ORIGIN_KEYS:
        if key in origin.meta:
            node.meta[key] = origin.meta[key]
    fake_args = torch.fx.node.map_arg(args, lambda arg: arg.meta["val"])
    fake_mode = detect_fake_mode([arg.meta["val"] for arg in node.all_input_nodes])
    assert fake_mode is not None, "the inputs of a node of an exported graph have fake values"
    with fake_mode:
        node.meta["val"] = target(*fake_args)
    return node
