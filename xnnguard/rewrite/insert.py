"""Add ATen nodes to a graph, with the meta a trace would give them: the one place rewrites add nodes.

Two ways in, one result:

* ``call_like`` adds one op;
* ``splice_before`` adds what a plain-PyTorch function computes (testable in eager): the function is
  traced with ``make_fx`` (``pre_dispatch``, so the ops are the ones ``torch.export`` itself produces)
  and the traced nodes are copied in front of a node, its constant tensors becoming attributes.

Either way every new node's ``meta["val"]`` is computed on the graph's own fake values, in the graph's
own fake mode (a constant the rewrite adds is made a fake tensor of that mode), and every new node
carries the provenance of the node it stands in for (``nn_module_stack``, ``stack_trace``,
``source_fn_stack``, and the rewrite stamp of ``xnnguard.rewrite.provenance``), so that quantizer
filters by module, reports and debuggers still find the user's module, and a node standing in for a
piece of a rewritten op is quantized as that op.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx

from xnnguard.rewrite.attributes import constant_attribute
from xnnguard.rewrite.provenance import carry_stamp

__all__ = ["call_like", "splice_before"]

_ORIGIN_KEYS = ("nn_module_stack", "stack_trace", "source_fn_stack")


def _value(arg: object) -> object:
    return arg.meta["val"] if isinstance(arg, torch.fx.Node) else arg


def _take_origin(node: torch.fx.Node, origin: torch.fx.Node | None) -> None:
    if origin is None:
        return
    for key in _ORIGIN_KEYS:
        if key in origin.meta:
            node.meta[key] = origin.meta[key]
    carry_stamp(node, origin)


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
    _take_origin(node, origin)
    return node


def splice_before(
    graph_module: torch.fx.GraphModule,
    node: torch.fx.Node,
    replacement: Callable[..., torch.Tensor],
    inputs: Sequence[torch.fx.Node | torch.Tensor],
) -> torch.fx.Node:
    """Insert ``replacement(*inputs)`` as ATen nodes in front of ``node`` and return its output node.

    ``inputs`` are nodes of the graph (activations) or constant tensors, which become attributes named
    after ``node``. The caller redirects ``node``'s users. ``replacement`` is traced on the nodes' own
    fake values: sizes it computes with are the ones the graph has.
    """
    graph = graph_module.graph
    with graph.inserting_before(node):
        arguments = [
            value
            if isinstance(value, torch.fx.Node)
            else constant_attribute(graph_module, f"{node.name}_{index}", value)
            for index, value in enumerate(inputs)
        ]
    examples = [argument.meta["val"] for argument in arguments]
    fake_mode = detect_fake_mode(examples)
    with fake_mode if fake_mode is not None else nullcontext():
        traced = make_fx(replacement, tracing_mode="real" if fake_mode is not None else "fake", pre_dispatch=True)(
            *examples
        )
    with graph.inserting_before(node):
        placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
        value_map: dict[torch.fx.Node, torch.fx.Node] = dict(zip(placeholders, arguments))
        output = graph.graph_copy(traced.graph, value_map)
    if isinstance(output, (tuple, list)):
        (output,) = output
    assert isinstance(output, torch.fx.Node)
    for traced_node, copied in value_map.items():
        if copied.op == "call_function" and traced_node.op != "placeholder":
            _take_origin(copied, node)
    return output
