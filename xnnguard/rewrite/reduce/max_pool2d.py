"""What the 2-D max pooling rewrites share: a pooling's arguments, its 4-D input, and the splice.

``max_pool2d`` and ``max_pool2d_with_indices`` (whose indices nobody reads) are the same pooling of the
same values; a rewrite replaces the pooling (the former) or its ``getitem(.., 0)`` users (the latter).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from xnnguard.graph.args import schema_arguments
from xnnguard.graph.ops import values_only_users
from xnnguard.graph.shapes import tensor_value
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.size_args import Pair, pair

__all__ = ["POOLS", "MaxPool2d", "PooledInput", "pooled_input", "replace_pooling"]

_aten = torch.ops.aten
POOLS = frozenset({_aten.max_pool2d.default, _aten.max_pool2d_with_indices.default})


@dataclass(frozen=True)
class MaxPool2d:
    """A 2-D max pooling's arguments, as pairs."""

    kernel: Pair
    stride: Pair
    padding: Pair
    dilation: Pair
    ceil_mode: bool

    @classmethod
    def of(cls, node: torch.fx.Node) -> MaxPool2d:
        arguments = schema_arguments(node) or {}
        kernel = pair(arguments.get("kernel_size"))
        return cls(kernel, pair(arguments.get("stride", []), default=kernel), pair(arguments.get("padding", 0)),
                   pair(arguments.get("dilation", 1)), bool(arguments.get("ceil_mode", False)))


@dataclass(frozen=True)
class PooledInput:
    """The pooling's 4-D input node, its value, and the nodes that read the pooled values."""

    node: torch.fx.Node
    value: torch.Tensor
    users: list[torch.fx.Node]


def pooled_input(node: torch.fx.Node) -> PooledInput | str:
    """``node``'s input and the readers of its values, or why a rewrite cannot replace it."""
    users = values_only_users(node) if node.target is _aten.max_pool2d_with_indices.default else [node]
    if users is None:
        return "its indices are used"
    x = node.args[0]
    value = tensor_value(x)
    if not isinstance(x, torch.fx.Node) or value is None or value.dim() != 4:
        return "its input is not a 4-D tensor"
    return PooledInput(x, value, users)


def replace_pooling(graph_module: torch.fx.GraphModule, node: torch.fx.Node, pooled: PooledInput,
                    form: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Splice ``form(input)`` in front of ``node`` and give the readers of its values the result."""
    output = splice_before(graph_module, node, form, [pooled.node])
    for user in pooled.users:
        user.replace_all_uses_with(output)
        if user is not node:
            graph_module.graph.erase_node(user)
