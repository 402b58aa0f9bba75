"""A convolution node's operands as the conv rewrites need them: its input node, its weight and bias as tensors.

The 3-D conv rewrites bake the weight into new 2-D constants, so they apply only when weight and bias
are constants (``xnnguard.rewrite.constants``); otherwise they say why and leave the node.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx.operator_schemas import normalize_function

from xnnguard.rewrite.constants import constant_value

__all__ = ["ConvArguments", "ConvOperands", "conv_arguments", "conv_operands"]


Shape5 = tuple[int, int, int, int, int]
# (front, back) zeros for D, H and W: a 3-D convolution's padding per side.
Padding3d = tuple[tuple[int, int], tuple[int, int], tuple[int, int]]


@dataclass(frozen=True)
class ConvArguments:
    """A 3-D convolution's arguments by name, with the static shapes of its input and weight.

    ``dynamic_batch``: the input's batch is symbolic (``input_shape[0]`` then stands in for it as 1);
    ``dynamic_depth``: its depth is (``input_shape[2]`` then stands in for it as 0).
    """

    kwargs: dict[str, object]
    input_shape: Shape5
    weight_shape: Shape5
    dynamic_batch: bool
    dynamic_depth: bool = False


def _one_at_the_example_only(size: torch.SymInt) -> bool:
    """The symbolic ``size`` is 1 at the example the program was traced at, and larger at some length of
    the range (constant 1 over the whole range is a size like any static one)."""
    node = size.node
    if getattr(node, "hint", None) != 1:
        return False
    upper = node.shape_env.bound_sympy(node.expr).upper
    return not (upper.is_number and upper <= 1)


def conv_arguments(
    node: torch.fx.Node, *, allow_dynamic_batch: bool = False, allow_dynamic_depth: bool = False
) -> ConvArguments | str:
    """``node``'s arguments, normalized, and its input and weight shapes, or why they are not static.

    A dynamic batch or (``allow_dynamic_depth``) a dynamic depth is allowed, one of them at a time: every
    2-D form would otherwise need both inferred in one reshape, and XNNPACK infers one.
    """
    assert callable(node.target)  # the op of a call_function node
    normalized = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
    if normalized is None:
        return "its arguments could not be normalized"
    kwargs = normalized.kwargs
    shapes = []
    dynamic_batch = dynamic_depth = False
    for value in (kwargs["input"], kwargs["weight"]):
        meta = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
        if not isinstance(meta, torch.Tensor):
            return "an input has no shape information"
        sizes = list(meta.shape)
        if value is kwargs["input"] and len(sizes) == 5:
            if allow_dynamic_batch and not isinstance(sizes[0], int):
                dynamic_batch, sizes[0] = True, 1
            if allow_dynamic_depth and not isinstance(sizes[2], int) and all(
                isinstance(s, int) for s in sizes[3:] + sizes[1:2]
            ):
                if dynamic_batch:
                    return (
                        f"dynamic batch and depth {tuple(meta.shape)}: every 2-D form would need both inferred "
                        "in one reshape, and XNNPACK infers one dim"
                    )
                if _one_at_the_example_only(sizes[2]):
                    return ("its frame count is 1 at the example length, and tracing the 2-D form there bakes "
                            "that 1 in (the program then fails at other lengths): export with an example clip "
                            "that gives every layer two frames or more")
                dynamic_depth, sizes[2] = True, 0
        if not all(isinstance(s, int) for s in sizes):
            return (
                f"dynamic shape {tuple(meta.shape)}: the 2-D forms take one dynamic dim, the batch or the depth, "
                "with static channels, height and width"
            )
        shapes.append(tuple(int(s) for s in sizes))
    if len(shapes[0]) != 5:
        return f"unbatched input of rank {len(shapes[0])}"
    return ConvArguments(kwargs, shapes[0], shapes[1], dynamic_batch, dynamic_depth)  # type: ignore[arg-type]


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
    weight = constant_value(graph_module, normalized.kwargs["weight"])
    if weight is None:
        return "its weight is not computed from parameters alone"
    bias_node = normalized.kwargs.get("bias")
    bias = constant_value(graph_module, bias_node)
    if bias_node is not None and bias is None:
        return "its bias is not computed from parameters alone"
    return ConvOperands(normalized.kwargs["input"], weight, bias)
