"""A convolution node's operands as the rewrites need them: its input node, and its weight and bias as tensors.

The 3-D conv rewrites bake the weight into new 2-D constants, so they apply only when weight and bias
are parameters (``get_attr`` of the unlifted module); otherwise they say so and leave the node.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx.operator_schemas import normalize_function

from xnnguard.passes.splice import attribute_tensor

__all__ = ["ConvOperands", "conv_operands"]


@dataclass(frozen=True)
class ConvOperands:
    input: torch.fx.Node
    weight: torch.Tensor
    bias: torch.Tensor | None


def conv_operands(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> ConvOperands | str:
    """The operands of convolution ``node``, or why its weight or bias is not a constant."""
    assert callable(node.target)  # the op of a call_function node
    normalized = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
    assert normalized is not None
    weight = attribute_tensor(graph_module, normalized.kwargs["weight"])
    if weight is None:
        return "its weight is not a parameter of the module"
    bias_node = normalized.kwargs.get("bias")
    bias = attribute_tensor(graph_module, bias_node) if isinstance(bias_node, torch.fx.Node) else None
    if bias_node is not None and bias is None:
        return "its bias is not a parameter of the module"
    return ConvOperands(normalized.kwargs["input"], weight, bias)
