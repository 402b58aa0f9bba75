"""``rewrite_for_xnnpack``: turn the ops XNNPACK has no kernel for into equivalent ones it has.

It runs on an exported ATen program, before quantization, so a pt2e flow
(``rewrite_for_xnnpack(export(m))`` -> ``prepare_pt2e`` -> calibrate -> ``convert_pt2e`` -> export -> lower)
quantizes the rewritten ops as ordinary 2-D ones; it also works on a float program right before
lowering. The passes rewrite the unlifted module (``ep.module()``), which is then exported again
(``xnnguard.rewrite.reexport``).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import torch
from torch.export import ExportedProgram
from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.report import KeptOut, summarize
from xnnguard.rewrite import attention, batch_norm, fold, layout, upsample, views
from xnnguard.rewrite.conv import TransposedOutputPaddingPass
from xnnguard.rewrite.conv3d.batch_norm3d import RewriteBatchNorm3dPass
from xnnguard.rewrite.conv3d.conv3d import RewriteConv3dPass
from xnnguard.rewrite.conv3d.conv_transpose3d import RewriteConvTranspose3dPass
from xnnguard.rewrite.conv3d.fold_batch_norm3d import FoldBatchNorm3dPass
from xnnguard.rewrite.conv3d.pool3d import RewritePool3dPass
from xnnguard.rewrite.half import RewriteHalfActivationsPass, RewriteHalfGeluPass, ScalarOperandsPass
from xnnguard.rewrite.norm import passes as norm_passes
from xnnguard.rewrite.rank.reduce_rank import ReduceRankPass
from xnnguard.rewrite.reduce import RewriteAdaptiveAvgPoolPass, RewriteAdaptiveMaxPoolPass, passes as reduce_passes
from xnnguard.rewrite.reexport import export_again
from xnnguard.rewrite.runner import RewriteError, run_passes
from xnnguard.rewrite.tanh_gelu import RewriteTanhGeluPass
from xnnguard.rules.tagged import tag, tag_of, tagged_rule

__all__ = ["RewriteError", "XnnpackRewriter", "default_rewrites", "rewrite_for_xnnpack"]

logger = logging.getLogger("xnnguard.rewrite")


def default_rewrites(*, strict: bool = False) -> list[PassBase]:
    """The rewrites, in the order they run (a plain list: add or drop passes freely).

    Constants fold first (the later rewrites see a computed weight or mask as a constant), then the
    views, upsampling and attention families move what has no XNNPACK config into forms it runs; batch
    norms in a row merge, and batch norms fold into their grouped transposed or 3-D conv before it is
    rewritten; an adaptive max pooling becomes a max pooling (a 3-D one the pooling rewrite then takes)
    or ``amax``es of its windows (the reductions take them), an uneven adaptive average pooling linears;
    the rank reduction runs over the views the 3-D rewrites leave too. The normalizations and reductions
    run after it: it brings a layer norm or a reduction above 6 dims to merged dims (and tags what it
    cannot), and they then rewrite ops of at most 6 dims only, so no op is handled by both. A float32
    tanh GELU (which XNNPACK would compute as the erf one) and a float16 GELU, SiLU or hardsigmoid are
    rewritten with them (``xnnguard.rewrite.tanh_gelu``, ``xnnguard.rewrite.half``). The layout passes
    run over what all the others left; last, a float16 op's number operands become float16 constants
    (the forms above write numbers too).
    """
    return [
        *fold.passes(),
        *views.passes(),
        *upsample.passes(),
        *attention.passes(),
        *batch_norm.passes(),
        FoldBatchNorm3dPass(),
        RewriteBatchNorm3dPass(),
        RewriteConv3dPass(),
        RewriteConvTranspose3dPass(),
        RewriteAdaptiveMaxPoolPass(),
        RewriteAdaptiveAvgPoolPass(),
        RewritePool3dPass(),
        TransposedOutputPaddingPass(),
        ReduceRankPass(strict=strict),
        *norm_passes(),
        *reduce_passes(),
        RewriteTanhGeluPass(),
        RewriteHalfGeluPass(),
        RewriteHalfActivationsPass(),
        *layout.passes(),
        ScalarOperandsPass(),
    ]


class XnnpackRewriter:
    """Runs ``passes`` (an ordered list of torch.fx passes) on an ExportedProgram; ``report`` says what stayed.

    After a call, ``report`` holds one record per node a rewrite could not replace: the node is left as
    it was, tagged ``DO_NOT_DELEGATE``, and the record gives the reason. ``strict`` (for tests) makes a
    pass that breaks its postcondition raise ``RewriteError`` instead of being reported.
    """

    def __init__(self, passes: Sequence[PassBase] | None = None, *, strict: bool = False) -> None:
        self.passes: list[PassBase] = list(passes) if passes is not None else default_rewrites(strict=strict)
        self.strict = strict
        self.report: list[KeptOut] = []

    def __call__(self, ep: ExportedProgram) -> ExportedProgram:
        if not isinstance(ep, ExportedProgram):
            raise TypeError(
                f"rewrite_for_xnnpack takes a torch.export.ExportedProgram, not {type(ep).__name__}: "
                "call it on torch.export.export(model, example_inputs)"
            )
        self.report = []
        result = run_passes(self.passes, ep.module(), strict=self.strict)
        self.report = list(result.report)
        logger.info("xnnguard rewrite: %s", summarize(self.report))
        if not result.modified:
            unchanged = copy.deepcopy(ep)  # a new program either way: the caller's stays as it was
            _copy_tags(result.graph_module, unchanged)
            return unchanged
        rewritten = export_again(result.graph_module, ep)
        _restore_tags(rewritten)
        return rewritten


def _copy_tags(tagged: torch.fx.GraphModule, ep: ExportedProgram) -> None:
    """Copy the tags the passes set on ``ep``'s unlifted copy (same node names) onto ``ep`` itself.

    Only those: a pass that leaves a node untagged (XNNPACK may still take it as it is) reports it all
    the same, so the report is not the list of what to tag.
    """
    tags = {node.name: (reason, rule) for node in tagged.graph.nodes
            if (reason := tag_of(node)) and (rule := tagged_rule(node)) is not None}
    for node in ep.graph.nodes:
        if node.op == "call_function" and node.name in tags:
            tag(node, *tags[node.name])


def _restore_tags(ep: ExportedProgram) -> None:
    """Re-export renumbers node names and keeps only ``meta["custom"]``, where ``tag`` mirrored each tag."""
    for node in ep.graph.nodes:
        reason = tag_of(node)
        if reason:
            tag(node, reason)  # an existing tag keeps its rule: this only restores the meta key


def rewrite_for_xnnpack(ep: ExportedProgram, *, strict: bool = False) -> ExportedProgram:
    """``ep`` with its 3-D convolutions, transposed convolutions, poolings and high-rank ops in forms XNNPACK runs.

    Returns a new ExportedProgram with the same inputs, outputs and dynamic dims, and the same results up
    to float rounding. A node a rewrite cannot replace stays as it was, tagged, and is logged; use
    ``XnnpackRewriter`` to get those records as data.
    """
    return XnnpackRewriter(strict=strict)(ep)
