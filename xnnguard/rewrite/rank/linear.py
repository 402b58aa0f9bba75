"""Run each linear on an input above XNNPACK's rank limit as a 2-D linear.

Invariant established: no ``aten.linear`` with static shapes or one dynamic size has an input or output
above ``XNN_MAX_TENSOR_DIMS`` dims; it becomes ``reshape(rows, in_features)`` -> ``linear`` ->
``reshape`` back (folded into neighbouring views by ``FuseHighRankViewsPass``). When the input is a
torchao dynamically quantized activation (``choose_qparams_affine -> quantize_affine ->
dequantize_affine``, per token or per tensor), that chain moves after the reshape and runs on the 2-D
rows too.

A ReLU or Hardtanh that only the linear reads runs on the 2-D rows too, right after the linear
(``xnnguard.rewrite.fused_activation``): quantization fuses it there as it does on a low-rank input.

Why: a linear treats all leading dims as independent rows, so they are one dim. On 2-D the linear is
the ordinary case every quantizer and XNNPACK's fully-connected op take: pt2e static and dynamic
quantization applied after this pass quantize it like any other linear. A torchao-quantized linear on
an 8-D input cannot run at all on 1.5.1 (its 8-D affine ops stay out of XNNPACK and have no portable
kernel: "Missing out variants"); on 2-D rows XNNPACK takes the whole chain. Per-token blocks
(``[1, ..., 1, K]``) flatten to ``[1, K]`` and per-tensor blocks to ``[rows, K]``: the same groups of
elements get the same scales, so the numbers do not change.
"""

from __future__ import annotations

import logging
import math
import operator
from dataclasses import dataclass

import torch

from xnnguard.graph.args import int_list
from xnnguard.graph.ops import op_of
from xnnguard.rewrite.fused_activation import fused_activation, replace_uses
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.rank.base import (
    HighRankRewritePass,
    high_rank,
    insert_reshape,
    user_kept_out,
)
from xnnguard.rewrite.rank.sizes import operand_shapes

__all__ = ["FlattenHighRankLinearPass"]

logger = logging.getLogger("xnnguard.rewrite")

_aten = torch.ops.aten


@dataclass(frozen=True)
class _AffineActivation:
    """A torchao dynamic activation quantization of ``source``: choose qparams, quantize, dequantize."""

    source: torch.fx.Node
    choose: torch.fx.Node
    quantize: torch.fx.Node
    dequantize: torch.fx.Node

    @property
    def block_size(self) -> list[int]:
        return int_list(self.choose.args[2])


def _name(node: object) -> str:
    found = op_of(node)
    return found[0] if found is not None else ""


def _affine_activation(x: torch.fx.Node) -> _AffineActivation | None:
    """The torchao choose/quantize/dequantize chain that produced ``x``, or None."""
    if _name(x) != "dequantize_affine":
        return None
    quantize = x.args[0]
    if not isinstance(quantize, torch.fx.Node) or _name(quantize) != "quantize_affine":
        return None
    qparams = quantize.args[2:4]
    from_getitem = all(isinstance(q, torch.fx.Node) and q.target is operator.getitem for q in qparams)
    if x.args[2:4] != qparams or not from_getitem:
        return None
    choose = qparams[0].args[0]  # type: ignore[union-attr]
    if _name(choose) != "choose_qparams_affine":
        return None
    if qparams[1].args[0] is not choose:  # type: ignore[union-attr]
        return None
    source = quantize.args[0]
    if choose.args[0] is not source or not isinstance(source, torch.fx.Node):  # type: ignore[union-attr]
        return None
    return _AffineActivation(source, choose, quantize, x)  # type: ignore[arg-type]


def _flat_block_size(block_size: list[int], shape: tuple[int, ...]) -> list[int] | None:
    """The 2-D block size with the same element groups as ``block_size`` on ``shape``, or None."""
    if all(b == 1 for b in block_size[:-1]):
        return [1, block_size[-1]]
    if list(block_size[:-1]) == list(shape[:-1]):
        return [math.prod(shape[:-1]), block_size[-1]]
    return None


class FlattenHighRankLinearPass(HighRankRewritePass):
    """Runs each linear on a high-rank input as a 2-D linear; reports the ones it cannot."""

    def picks(self, node: torch.fx.Node) -> bool:
        linear = node.op == "call_function" and node.target is _aten.linear.default
        return linear and high_rank(node) and not user_kept_out(node)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        graph = graph_module.graph
        x = node.args[0]
        assert isinstance(x, torch.fx.Node)
        activation = _affine_activation(x)
        source = activation.source if activation is not None else x
        shapes = operand_shapes([source, node])
        if isinstance(shapes, str):
            return shapes
        shape, output_shape = shapes
        flat_shape = (math.prod(shape[:-1]), shape[-1])
        block_size = _flat_block_size(activation.block_size, shape) if activation is not None else None
        if activation is not None and block_size is None:
            return f"its activation's quantization blocks {activation.block_size} are neither per token nor per tensor"
        with graph.inserting_before(node):
            flat = insert_reshape(graph, source, flat_shape, like=node)
            if activation is not None:
                flat = _quantize_rows(graph, activation, flat, block_size)  # type: ignore[arg-type]
            linear = call_like(graph, node, node.target, (flat, *node.args[1:]), dict(node.kwargs))
            fused = fused_activation(node)
            if fused is not None:  # on the rows too, right after the linear: quantization still fuses it
                act = fused.node
                linear = call_like(graph, act, act.target, (linear, *act.args[1:]), dict(act.kwargs))
            y = insert_reshape(graph, linear, output_shape, like=node)
        replace_uses(node, fused, y)
        logger.debug("%s: linear on a %d-D input flattened to %s", node.name, len(shape), flat_shape)
        return None


def _quantize_rows(
    graph: torch.fx.Graph, activation: _AffineActivation, rows: torch.fx.Node, block_size: list[int]
) -> torch.fx.Node:
    """``activation``'s choose/quantize/dequantize chain again, on the 2-D ``rows``."""
    choose, quantize, dequantize = activation.choose, activation.quantize, activation.dequantize
    choose_args = (rows, choose.args[1], block_size, *choose.args[3:])
    qparams = call_like(graph, choose, choose.target, choose_args, dict(choose.kwargs))
    scale = call_like(graph, choose, operator.getitem, (qparams, 0))
    zero_point = call_like(graph, choose, operator.getitem, (qparams, 1))
    quantize_args = (rows, block_size, scale, zero_point, *quantize.args[4:])
    quantized = call_like(graph, quantize, quantize.target, quantize_args, dict(quantize.kwargs))
    dequantize_args = (quantized, block_size, scale, zero_point, *dequantize.args[4:])
    return call_like(graph, dequantize, dequantize.target, dequantize_args, dict(dequantize.kwargs))
