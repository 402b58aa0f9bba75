"""``rewrite_for_xnnpack``: turn the ops XNNPACK has no kernel for into equivalent ones it has.

It runs on an exported ATen program, before quantization, so a pt2e flow
(``rewrite_for_xnnpack(export(m))`` -> ``prepare_pt2e`` -> calibrate -> ``convert_pt2e`` -> export -> lower)
quantizes the rewritten ops as ordinary 2-D ones; it also works on a float program right before
lowering. The passes rewrite the unlifted module (``ep.module()``: weights are attributes, so a rewrite
can add the reshaped ones), then the module is exported again with the same example inputs and the same
dynamic dims, which keeps parameters and buffers right and the result exportable again.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import torch
import torch.utils._pytree as pytree
from torch.export import Dim, ExportedProgram
from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.report import KeptOut, summarize
from xnnguard.rewrite.conv3d.batch_norm3d import RewriteBatchNorm3dPass
from xnnguard.rewrite.conv3d.conv3d import RewriteConv3dPass
from xnnguard.rewrite.conv3d.conv_transpose3d import RewriteConvTranspose3dPass
from xnnguard.rewrite.conv3d.fold_batch_norm3d import FoldBatchNorm3dPass
from xnnguard.rewrite.conv3d.pool3d import RewritePool3dPass
from xnnguard.rewrite.rank.reduce_rank import ReduceRankPass
from xnnguard.rules.tagged import tag, tag_of

__all__ = ["RewriteError", "XnnpackRewriter", "default_rewrites", "rewrite_for_xnnpack"]

logger = logging.getLogger("xnnguard.rewrite")


def default_rewrites() -> list[PassBase]:
    """The rewrites, in the order they run (a plain list: add or drop passes freely).

    Batch norms fold into their 3-D conv before it is rewritten; the rank reduction runs last, over the
    views the 3-D rewrites leave too.
    """
    return [
        FoldBatchNorm3dPass(),
        RewriteBatchNorm3dPass(),
        RewriteConv3dPass(),
        RewriteConvTranspose3dPass(),
        RewritePool3dPass(),
        ReduceRankPass(),
    ]


class XnnpackRewriter:
    """Runs ``passes`` (an ordered list of torch.fx passes) on an ExportedProgram; ``report`` says what stayed.

    After a call, ``report`` holds one record per node a rewrite could not replace: the node is left as
    it was, tagged ``DO_NOT_DELEGATE``, and the record gives the reason.
    """

    def __init__(self, passes: Sequence[PassBase] | None = None) -> None:
        self.passes: list[PassBase] = list(passes) if passes is not None else default_rewrites()
        self.report: list[KeptOut] = []

    def __call__(self, ep: ExportedProgram) -> ExportedProgram:
        if not isinstance(ep, ExportedProgram):
            raise TypeError(
                f"rewrite_for_xnnpack takes a torch.export.ExportedProgram, not {type(ep).__name__}: "
                "call it on torch.export.export(model, example_inputs)"
            )
        self.report = []
        module = ep.module()
        modified = False
        done: list[str] = []
        for rewrite in self.passes:
            name = type(rewrite).__name__
            try:
                result = rewrite(module)
            except Exception as error:  # name the pass and what ran before it, keep the cause
                after = f" (after {', '.join(done)})" if done else ""
                raise RewriteError(f"{name} failed{after}: {error}") from error
            done.append(name)
            if result is None:
                continue
            module = result.graph_module
            modified |= result.modified
            self.report.extend(getattr(result, "report", ()))
        logger.info("xnnguard rewrite: %s", summarize(self.report))
        if not modified:
            unchanged = copy.deepcopy(ep) if self.report else ep
            _tag_by_name(unchanged, self.report)
            return unchanged
        args, kwargs = _example_inputs(ep)
        try:
            rewritten = torch.export.export(module, args, kwargs, dynamic_shapes=_dynamic_shapes(ep), strict=False)
        except Exception as error:  # export's errors are many; say which step failed, keep the cause
            raise RewriteError(f"the rewritten program could not be exported again: {error}") from error
        _restore_tags(rewritten)
        return rewritten


class RewriteError(RuntimeError):
    """``rewrite_for_xnnpack`` could not turn the rewritten module back into an ExportedProgram."""


def _tag_by_name(ep: ExportedProgram, report: list[KeptOut]) -> None:
    """Tag the nodes left as they were on ``ep`` itself (the passes tagged its unlifted copy, same names)."""
    records = {record.node: record for record in report}
    for node in ep.graph.nodes:
        if node.op == "call_function" and node.name in records:
            tag(node, records[node.name].reason, records[node.name].rule)


def _restore_tags(ep: ExportedProgram) -> None:
    """Re-export renumbers node names and keeps only ``meta["custom"]``, where ``tag`` mirrored each tag."""
    for node in ep.graph.nodes:
        reason = tag_of(node)
        if reason:
            tag(node, reason)  # an existing tag keeps its rule: this only restores the meta key


def _example_inputs(ep: ExportedProgram) -> tuple[tuple[object, ...], dict[str, object]]:
    """The inputs ``ep`` was exported with, or zeros of its static input shapes when it kept none."""
    if ep.example_inputs is not None:
        return ep.example_inputs
    user_inputs = set(ep.graph_signature.user_inputs)
    leaves = []
    for node in ep.graph.nodes:
        if node.op != "placeholder" or node.name not in user_inputs:
            continue
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            if not all(isinstance(size, int) for size in value.shape):
                raise RewriteError("the program keeps no example inputs and has dynamic dims: export it again")
            leaves.append(torch.zeros(tuple(value.shape), dtype=value.dtype))
        else:
            leaves.append(value)
    return pytree.tree_unflatten(leaves, ep.call_spec.in_spec)


def _dynamic_shapes(ep: ExportedProgram) -> tuple[object, ...] | None:
    """The dims of ``ep``'s inputs that were dynamic, as ``Dim.DYNAMIC`` specs for re-export (None if none)."""
    user_inputs = set(ep.graph_signature.user_inputs)
    values = [n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder" and n.name in user_inputs]
    dims: dict[object, object] = {}

    def dim_of(size: torch.SymInt) -> object:
        """The same ``Dim`` (same range) for the same symbol, so equal dims stay equal and keep their bounds."""
        expr = size.node.expr
        if expr not in dims:
            bounds = ep.range_constraints.get(expr)
            if bounds is None or not expr.is_Symbol:
                dims[expr] = Dim.DYNAMIC
            else:
                upper = None if not bounds.upper.is_finite else int(bounds.upper)
                dims[expr] = Dim(f"xnnguard_{expr}", min=int(bounds.lower), max=upper)
        return dims[expr]

    specs = []
    for value in values:
        if isinstance(value, torch.Tensor):
            sizes: Sequence[int | torch.SymInt] = value.shape  # typed as ints, it holds SymInts for dynamic dims
            dynamic = {i: dim_of(size) for i, size in enumerate(sizes) if not isinstance(size, int)}
            specs.append(dynamic or None)
        else:
            specs.append(None)
    if all(spec is None for spec in specs):
        return None
    args, kwargs = _example_inputs(ep)
    leaves, spec = pytree.tree_flatten((args, kwargs))
    if len(leaves) != len(specs):
        return None
    shaped_args, shaped_kwargs = pytree.tree_unflatten(specs, spec)
    if any(spec is not None for spec in pytree.tree_leaves(shaped_kwargs, is_leaf=lambda v: v is None)):
        raise ValueError(
            "rewrite_for_xnnpack: dynamic dims on keyword inputs are not supported; pass them positionally"
        )
    return tuple(shaped_args)


def rewrite_for_xnnpack(ep: ExportedProgram) -> ExportedProgram:
    """``ep`` with its 3-D convolutions, transposed convolutions and poolings in forms XNNPACK runs.

    Returns a new ExportedProgram with the same inputs, outputs and dynamic dims, and the same results up
    to float rounding. A node a rewrite cannot replace stays as it was, tagged, and is logged; use
    ``XnnpackRewriter`` to get those records as data.
    """
    return XnnpackRewriter()(ep)
