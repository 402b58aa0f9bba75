"""``rewrite_for_xnnpack`` at the two points of the recipe flow where it can run on the ATen program.

``executorch.export`` runs a recipe as stages: source transform (torchao's ``quantize_``), quantize
(export, ``prepare_pt2e``, calibrate, ``convert_pt2e``), export (then ``aten_transform_passes``), lower,
serialize. The rewrite belongs before pt2e quantization, so that pt2e quantizes the 2-D ops it makes:

* ``RewritingXNNPACKQuantizer`` does it for the pt2e recipes: ``prepare_pt2e`` hands the captured graph
  to ``Quantizer.transform_for_annotation`` before annotating it, in every release with the recipe API
  (the ``pre_prepare_passes`` of 1.5's ``QuantizationRecipe`` would do too, but 1.4 has none);
* ``RewriteProgram`` is an ``aten_transform_passes`` entry for the float and torchao recipes: torchao
  quantizes the eager module, so there the rewrite runs on the exported, already quantized program
  (a linear on an 8-D input is rewritten to 2-D rows quantized or not; a Conv3d stays float as torchao
  left it, rewritten to float 2-D convolutions).

Each keeps what its rewriter reported (the nodes left as they were, tagged, and why).
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from xnnguard.quantizer import XNNPACKQuantizer
from xnnguard.report import KeptOut
from xnnguard.rewrite import XnnpackRewriter

__all__ = ["RewriteProgram", "RewritingXNNPACKQuantizer"]


class RewriteProgram:
    """``(method_name, program) -> rewrite_for_xnnpack(program)``; ``report`` holds each method's records."""

    def __init__(self) -> None:
        self.report: dict[str, list[KeptOut]] = {}

    def __call__(self, method_name: str, program: ExportedProgram) -> ExportedProgram:
        rewriter = XnnpackRewriter()
        rewritten = rewriter(program)
        self.report[method_name] = rewriter.report
        return rewritten

    def __repr__(self) -> str:
        return "RewriteProgram()"


class RewritingXNNPACKQuantizer(XNNPACKQuantizer):
    """``xnnguard.XNNPACKQuantizer`` that first rewrites the captured graph with ``rewrite_for_xnnpack``.

    ``rewrite_report`` holds the rewriter's records, ``report`` the quantizer's.
    """

    def __init__(self) -> None:
        super().__init__()
        self.rewrite_report: list[KeptOut] = []

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        rewriter = XnnpackRewriter()
        rewritten = rewriter(_as_program(model)).module()
        self.rewrite_report = rewriter.report
        transformed: torch.fx.GraphModule = super().transform_for_annotation(rewritten)
        return transformed


def _as_program(module: torch.fx.GraphModule) -> ExportedProgram:
    """``module`` (a captured ``ExportedProgram.module()``) exported again, with zeros of its input shapes.

    Raises ``ValueError`` for dynamic input dims: the recipes capture for quantization with static shapes.
    """
    leaves: list[object] = []
    for node in module.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            if not all(isinstance(size, int) for size in value.shape):
                raise ValueError(
                    f"xnnguard's pt2e recipes rewrite a graph captured with static shapes, but input {node.name} "
                    f"has dynamic dims {tuple(value.shape)}: rewrite and quantize with xnnguard.rewrite_for_xnnpack "
                    "and prepare_pt2e yourself"
                )
            leaves.append(torch.zeros(tuple(value.shape), dtype=value.dtype))
        else:
            leaves.append(value)
    in_spec = getattr(module, "_in_spec", None)  # how the unlifted module takes its inputs (args, kwargs)
    args, kwargs = pytree.tree_unflatten(leaves, in_spec) if in_spec is not None else (tuple(leaves), {})
    return torch.export.export(module, tuple(args), dict(kwargs), strict=False)
