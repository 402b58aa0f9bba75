"""``SplicedConvPass``: the skeleton the 3-D convolution rewrites share.

Every one of them goes geometry -> operands -> constants -> splice: read the convolution's geometry
(or why it cannot be rewritten), its operands (the weight and bias must be constants), bake the weight
into the constants its 2-D form reads, then trace that form (a plain-PyTorch function, testable in
eager) into the graph in the convolution's place. A subclass supplies the three steps that differ.

A ReLU or Hardtanh that only the convolution reads goes into the 2-D form, right after each 2-D
convolution (``xnnguard.rewrite.fused_activation``), so that quantization still fuses it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import ClassVar, Generic, TypeVar

import torch

from xnnguard.report import Rule
from xnnguard.rewrite.conv3d.operands import ConvOperands, conv_operands
from xnnguard.rewrite.fused_activation import fused_activation, replace_uses
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rules.conv3d import ConvKind, conv3d_kind

__all__ = ["Activation", "SplicedConvPass"]

logger = logging.getLogger("xnnguard.rewrite")

Geometry = TypeVar("Geometry")
Activation = Callable[[torch.Tensor], torch.Tensor]


class SplicedConvPass(NodeRewritePass, Generic[Geometry]):
    """Replaces each 3-D convolution of ``kind`` by its 2-D form; what it cannot replace it tags and reports.

    Works on an unlifted ATen graph (``ExportedProgram.module()``): weights are ``get_attr`` nodes, and
    the rewritten weights become new attributes.
    """

    kind: ClassVar[ConvKind]
    rule = Rule.CONV3D
    left_op_fails = (
        "ExecuTorch 1.5.1 has no kernel for a 3-D convolution (XNNPACK none, the portable one 1-D and 2-D only): "
        "the program fails when it runs; export it with static height and width and one dynamic dim at most, "
        "the batch or the frames"
    )

    def picks(self, node: torch.fx.Node) -> bool:
        return conv3d_kind(node) is self.kind

    def geometry(self, node: torch.fx.Node) -> Geometry | str:
        """The convolution's geometry, or why it cannot be rewritten."""
        raise NotImplementedError

    def source(self, node: torch.fx.Node, operands: ConvOperands) -> torch.fx.Node:
        """The node the 2-D form reads: the convolution's input, unless ``geometry`` took an op before it."""
        return operands.input

    def constants(
        self, operands: ConvOperands, geometry: Geometry, activation: Activation | None
    ) -> list[torch.Tensor]:
        """The constants ``compute`` reads, computed ahead of time from the weight and bias."""
        raise NotImplementedError

    def compute(
        self, x: torch.Tensor, constants: Sequence[torch.Tensor], geometry: Geometry, activation: Activation | None
    ) -> torch.Tensor:
        """The convolution of ``x`` in its 2-D form, then ``activation`` (what is traced into the graph)."""
        raise NotImplementedError

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        geometry = self.geometry(node)
        if isinstance(geometry, str):
            return geometry
        operands = conv_operands(graph_module, node)
        if isinstance(operands, str):
            return operands
        fused = fused_activation(node)
        activation = fused.apply if fused is not None else None
        constants = self.constants(operands, geometry, activation)

        def replacement(x: torch.Tensor, *constants_: torch.Tensor) -> torch.Tensor:
            return self.compute(x, constants_, geometry, activation)

        output = splice_before(graph_module, node, replacement, [self.source(node, operands), *constants])
        replace_uses(node, fused, output)
        logger.debug("%s: %s rewritten", node.name, self.subject)
        return None
