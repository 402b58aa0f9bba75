"""Give a dynamically quantized 2-D convolution a ``cat`` input where 1.5.1 would lay out another tensor.

ExecuTorch 1.5.1 lays out a dynamically quantized conv's input for XNNPACK by walking up first
arguments from it, and converts the tensor where the walk stops (``xnnguard.rules.dynamic_conv_source``).
Behind a view (a video VAE's conv after its frames are folded into the batch) that is a tensor of
another shape, and the partitioner must leave the conv out: it runs quantized on the portable kernels,
a delegate boundary on each side. A ``cat`` stops the walk at the conv's own input: the conv then stays
on XNNPACK. (The rewrites of 3-D convolutions leave their conv2d inputs to this hook, so that float and
static int8 programs pay no such copy.)

The cat of the input's two halves is the input itself, in float: a dynamic config annotates neither
the slices nor the cat, so no rounding is added. It costs one copy of the input, and is only made where
the walk may break the program (``xnnguard.rules.dynamic_conv_source``).
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from xnnguard.graph.ops import is_op
from xnnguard.rules.dynamic_conv_source import walk_misplaces

__all__ = ["cat_dim", "give_convs_cat_inputs"]

_CONV2D = frozenset({"conv2d", "conv_transpose2d", "convolution"})


def give_convs_cat_inputs(model: GraphModule) -> list[str]:
    """Read every 2-D (transposed) conv input 1.5.1's walk would misplace through a ``cat`` of its halves.

    Returns the convs' names.
    """
    changed: list[str] = []
    for conv in list(model.graph.nodes):
        source = conv.args[0] if is_op(conv, _CONV2D) and conv.args else None
        if not isinstance(source, Node):
            continue
        value = source.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.dim() != 4 or not walk_misplaces(source):
            continue
        dim = cat_dim(value.shape)
        if dim is None:
            continue
        conv.replace_input_with(source, _cat_of_halves(model.graph, source, value, dim, conv))
        changed.append(conv.name)
    if changed:
        model.graph.lint()
        model.recompile()
    return changed


def cat_dim(shape: torch.Size) -> int | None:
    """The dim to cut a tensor of ``shape`` along: its longest static one, None if all are < 2.

    A dynamic dim (a batch) is never cut: xnnguard's partitioner delegates a slice that keeps it whole
    (``xnnguard.partition.symbolic_slice``).
    """
    static = [d for d in range(len(shape)) if isinstance(shape[d], int)]
    if not static:
        return None
    dim = max(static, key=lambda d: int(shape[d]))
    return dim if int(shape[dim]) >= 2 else None


def _cat_of_halves(graph: torch.fx.Graph, source: Node, value: torch.Tensor, dim: int, before: Node) -> Node:
    size, half = int(value.shape[dim]), int(value.shape[dim]) // 2
    with graph.inserting_before(before):
        halves = []
        for start, end in ((0, half), (half, size)):
            piece = graph.call_function(torch.ops.aten.slice.Tensor, (source, dim, start, end))
            piece.meta["val"] = torch.ops.aten.slice.Tensor(value, dim, start, end)
            halves.append(piece)
        cat = graph.call_function(torch.ops.aten.cat.default, (halves, dim))
        cat.meta["val"] = torch.ops.aten.cat.default([piece.meta["val"] for piece in halves], dim)
    for node in (*halves, cat):  # a module-name or module-type config finds them in the conv's module
        if "nn_module_stack" in before.meta:
            node.meta["nn_module_stack"] = before.meta["nn_module_stack"]
    return cat
