"""Add an ATen node to an exported graph with the meta a trace would give it.

An exported program's verifier wants ``meta["val"]`` on every node; a rewrite that adds a node computes
it on the fake tensors already in the graph (in their fake mode, so a constant the rewrite adds may be a
real tensor), and keeps the origin (``nn_module_stack``, ``stack_trace``, ``source_fn_stack``) of the
node it stands in for, so that quantizer filters by module, reports and debuggers still find the user's
module. This is the one place rewrites add nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode

__all__ = ["call_like"]

_ORIGIN_KEYS = ("nn_module_stack", "stack_trace", "source_fn_stack")


def _value(arg: object) -> object:
    return arg.meta["val"] if isinstance(arg, torch.fx.Node) else arg


def call_like(
    graph: torch.fx.Graph,
    origin: torch.fx.Node | None,
    target: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
) -> torch.fx.Node:
    """A new ``target(*args, **kwargs)`` node (at the graph's insertion point) standing in for ``origin``.

    Its value is computed before the node is added: a target that rejects its arguments leaves the
    graph as it was.
    """
    args, kwargs = tuple(args), dict(kwargs or {})
    fake_args, fake_kwargs = pytree.tree_map_only(torch.fx.Node, _value, (args, kwargs))
    inputs = [v for v in pytree.tree_leaves((fake_args, fake_kwargs)) if isinstance(v, torch.Tensor)]
    fake_mode = detect_fake_mode(inputs)
    with fake_mode if fake_mode is not None else nullcontext():
        value = target(*fake_args, **fake_kwargs)
    node = graph.call_function(target, args, kwargs)
    node.meta["val"] = value
    if origin is not None:
        for key in _ORIGIN_KEYS:
            if key in origin.meta:
                node.meta[key] = origin.meta[key]
    return node
