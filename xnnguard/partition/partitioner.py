"""``xnnguard.XnnpackPartitioner``: ExecuTorch's XNNPACK partitioner that never delegates what XNNPACK cannot run.

A drop-in for ``executorch.backends.xnnpack.partition.xnnpack_partitioner.XnnpackPartitioner`` (same
constructor, same use in ``to_edge_transform_and_lower`` and ``to_edge(...).to_backend(...)``). The
matching and the grouping into partitions are ExecuTorch's own code: each stock config is wrapped in a
``GuardedConfig`` (``xnnguard.partition.guard``) that the stock loop asks. On top of the stock matching it

* never delegates a node that ``keep_out_reason`` forbids (above 6 dims, 3-D convolution, a max over a
  dim in a form XNNPACK 1.5.1 refuses, PReLU on a non-4-D tensor, a tanh GELU, which XNNPACK would
  compute as the erf one, user tag), and does not keep such an op
  whole for XNNPACK (a linear on an 8-D input decomposes, its 2-D matmul stays);
* in ``to_edge_transform_and_lower``, first rewrites what has an equivalent XNNPACK takes: a max over H
  or W keeps its dim (``MaxKeepdimPass``), a PReLU of another rank is folded to 4-D (``PReLUTo4dPass``),
  an integer scalar of a float op is written as the float it stands for (``FloatScalarsPass``: no int64
  constant and cast outside), and a quantize-dequantize after a view above 6 dims of values already on
  its grid is dropped (``RequantizedViewsPass``: only the view stays outside), and a 2-D max pooling
  whose indices nobody reads is written ``max_pool2d`` (``ValuesOnlyMaxPoolPass``), a pad by a negative
  width is slices and a pad (``CroppingPadPass``: the portable kernel refuses it at run), a ``detach`` inside the
  graph is dropped (``InferenceDetachPass``), and a graph output that other ops read dequantized gets a
  dequantize of its own (``OutputDequantizePass``: ExecuTorch's channels-last pass would otherwise point
  the delegate's output at a node without a value), and a dequantize above 6 dims read by views to fewer
  dims dequantizes after them (``LowRankDequantizePass``: the linear behind it joins a partition).
  ExecuTorch 1.5 runs them through ``transform_for_pre_decomposition``; 1.4, which has no such hook
  (``xnnguard.boundary.releases.has_pre_decomposition_hook``), through the first ``ops_to_not_decompose`` call,
  which 1.4 makes at the same point: on its own copy of the ATen program, before any decomposition;
  at the same point, a view with one dynamic dim (a dynamic batch) is written with -1 for it
  (``InferredViewPass``): the same view, in the form XNNPACK takes, and a stack over a dynamic dim as a
  cat of such views (``InferredStackPass``), before its decomposition spells the dim as a symbol, and a
  slice that keeps its whole input (``x[:, 0, :]`` over a ``Dim.DYNAMIC`` dim) is dropped (``WholeSlicePass``);
* never lets a partition output a memory-format round trip of its own input (XNNPACK's copy removal
  would make the delegate output its input): such an output, and what in the partition reads it, runs
  outside;
* checks every node a partition takes (partitions are unions of config matches, and every match is
  checked): optional members that are forbidden (the high-rank views of a linear's source partition, a
  fused activation above 6 dims) stay outside; a match that needs a forbidden op or q/dq is not taken;
* merges partitions the stock grouping's single greedy pass leaves apart although their union is
  convex (``xnnguard.partition.merge``): fewer delegates, no boundary copies between them;
* marks q/dq implicit only once the partition of their op is taken (``xnnguard.partition.implicit_qdq``);
* applies ``force_non_static_weights_for_f32_linear`` to float linears only;
* takes a slice of a tensor with a dynamic batch along a static dim (``xnnguard.partition.symbolic_slice``);
* records in ``report`` every node it leaves outside XNNPACK, one record each: the rule that kept it out,
  or ExecuTorch's own reason (``xnnguard.partition.outside``); logs a one-line summary at INFO.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
from executorch.backends.xnnpack.partition.config.xnnpack_config import XNNPartitionerConfig
from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
    XnnpackPartitioner as _StockXnnpackPartitioner,
)
from executorch.exir.backend.canonical_partitioners.config_partitioner import is_constant_data
from executorch.exir.backend.partitioner import PartitionResult
from torch.export import ExportedProgram
from torch.fx.passes.infra.partitioner import Partition

from xnnguard.boundary import releases
from xnnguard.boundary.why_no_partition import stock_reasons
from xnnguard.dynamic_ranges import warn_about_narrowed_ranges
from xnnguard.graph.ops import target_name
from xnnguard.partition import implicit_qdq
from xnnguard.partition.configs import GUARDED_CONFIGS
from xnnguard.partition.guard import GuardedConfig, Ledger
from xnnguard.partition.merge import merge_partitions
from xnnguard.partition.outside import is_operator_call, outside_record
from xnnguard.report import KeptOut, Rule, summarize
from xnnguard.rewrite.forms.cropping_pad import CroppingPadPass
from xnnguard.rewrite.forms.float_scalars import FloatScalarsPass
from xnnguard.rewrite.forms.inference_detach import InferenceDetachPass
from xnnguard.rewrite.forms.inferred_stack import InferredStackPass
from xnnguard.rewrite.forms.inferred_view import InferredViewPass
from xnnguard.rewrite.forms.low_rank_dequantize import LowRankDequantizePass
from xnnguard.rewrite.forms.max_keepdim import MaxKeepdimPass
from xnnguard.rewrite.forms.output_dequantize import OutputDequantizePass
from xnnguard.rewrite.forms.prelu_to_4d import PReLUTo4dPass
from xnnguard.rewrite.forms.requantized_views import RequantizedViewsPass
from xnnguard.rewrite.forms.values_only_max_pool import ValuesOnlyMaxPoolPass
from xnnguard.rewrite.forms.whole_slice import WholeSlicePass
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.runner import run_passes
from xnnguard.rules.keep_out import keep_out_reason
from xnnguard.tagging import TagConv3dPass, TagHighRankPass

__all__ = ["XnnpackPartitioner"]

logger = logging.getLogger("xnnguard")


class XnnpackPartitioner(_StockXnnpackPartitioner):
    """ExecuTorch's ``XnnpackPartitioner`` that only delegates what XNNPACK can load and run.

    After ``partition`` (called for you by ``to_edge_transform_and_lower`` or ``to_backend``),
    ``report`` has one record for every node left outside XNNPACK, with the reason (``kept_out`` is
    the same list).
    """

    def __init__(
        self,
        configs: list[type[XNNPartitionerConfig]] | None = None,
        config_precisions: Any = None,
        per_op_mode: bool = False,
        verbose: bool = False,
        **kwargs: Any,
    ) -> None:
        own = [GUARDED_CONFIGS.get(config, config) for config in (configs or ALL_PARTITIONER_CONFIGS)]
        super().__init__(own, config_precisions, per_op_mode, verbose, **kwargs)
        stock: dict[str, Any] = self.target_partitioner_configs  # the stock loop reads this dict: guard each config
        self.target_partitioner_configs: dict[str, GuardedConfig] = {
            name: GuardedConfig(config, self._current_ledger) for name, config in stock.items()
        }
        self.report: list[KeptOut] = []
        self._ledger = Ledger()
        self._decomposed: dict[str, KeptOut] = {}  # ops a rule made decompose, found before ``partition``

    @property
    def kept_out(self) -> list[KeptOut]:
        """``report``, under its xnnguard 0.1 name."""
        return self.report

    def _current_ledger(self) -> Ledger:
        return self._ledger

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        """Rewrite, on the ATen program, the ops that have an equivalent XNNPACK lowers.

        Called by ``to_edge_transform_and_lower`` on ExecuTorch 1.5 (not by ``to_backend``: there the
        program is already edge, and the rules keep the same ops out instead). The caller's program is
        left as it was.
        """
        rewrites = _pre_decomposition_rewrites(exported_program.graph_module)
        self._decomposed = {}
        dynamic = _has_dynamic_dims(exported_program.graph_module)
        if not rewrites and not dynamic:
            return exported_program
        program = exported_program.run_decompositions({})  # a new graph, as the lowering makes next
        if dynamic:  # after run_decompositions({}): it spells out the sizes of views (a flatten's too)
            rewrites = [*rewrites, *_dynamic_dim_rewrites()]
        run_passes(rewrites, program.graph_module)  # in place: they add ops only, no inputs or weights
        return program

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        """Keep an op whole only when XNNPACK may take it: a linear on an 8-D input must decompose.

        On a release without ``transform_for_pre_decomposition`` (1.4), the pre-decomposition rewrites
        run here, in place, on an ATen program: ``to_edge_transform_and_lower`` first calls this on the
        copy it made with ``run_decompositions({})``, before any decomposition (where 1.5 calls the
        hook). Later calls find nothing left to rewrite; edge programs (``to_backend``) are not touched.
        """
        if not releases.has_pre_decomposition_hook() and getattr(ep, "dialect", "EDGE") != "EDGE":
            rewrites = _pre_decomposition_rewrites(ep.graph_module)
            if _has_dynamic_dims(ep.graph_module):
                rewrites.extend(_dynamic_dim_rewrites())
            if rewrites:
                run_passes(rewrites, ep.graph_module)
        ops, stock_filter = super().ops_to_not_decompose(ep)

        def keep_whole(node: torch.fx.Node) -> bool:
            record = keep_out_reason(node)
            if record is None:
                return bool(stock_filter(node)) if stock_filter is not None else False
            if node.target in ops:  # asked about every node; only these would have stayed whole
                self._decomposed.setdefault(record.node, record)
            return False

        return ops, keep_whole

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        gm = exported_program.graph_module
        for tag_pass in (TagHighRankPass(), TagConv3dPass()):
            tag_pass(gm)
        self._ledger = Ledger()
        result = super().partition(exported_program)
        delegated = {n.name for n in gm.graph.nodes if "delegation_tag" in n.meta}
        self.report = self._outside_records(gm, delegated)
        self._ledger, self._decomposed = Ledger(), {}
        self._register_quantized_kernels_if_needed(gm)
        warn_about_narrowed_ranges(gm.graph)
        logger.info("xnnguard: %s; %d nodes delegated in %d partitions", summarize(self.report), len(delegated),
                    len(result.partition_tags))
        return result

    def _outside_records(self, gm: torch.fx.GraphModule, delegated: set[str]) -> list[KeptOut]:
        """One record per operator call left outside XNNPACK: the rule's first, then ExecuTorch's reason."""
        found: dict[str, KeptOut] = {}
        for record in (*self._decomposed.values(), *self._ledger.kept_out.values()):
            if record.node not in delegated:  # a later match may have taken it
                found.setdefault(record.node, record)
        for node in gm.graph.nodes:
            if is_operator_call(node) and node.name not in delegated and node.name not in found:
                found[node.name] = outside_record(
                    node, self.target_partitioner_configs, self._ledger.refused, self._ledger.reasons
                )
        return list(found.values())

    def get_matched_nodes_from_configs(self, ep: ExportedProgram) -> list[list[torch.fx.Node]]:
        """ExecuTorch's matching loop, asking the guarded configs; the stock configs' reasons are kept."""
        ledger = self._ledger
        ledger.qdq_nodes = implicit_qdq.quantization_nodes(ep.graph_module.graph)
        ledger.take_marks()  # marks left by earlier checks belong to no partition
        stock = [config.config for config in self.target_partitioner_configs.values()]
        try:
            with stock_reasons(stock) as reasons:
                groups: list[list[torch.fx.Node]] = super().get_matched_nodes_from_configs(ep)
            ledger.reasons.update(reasons)
        finally:
            ledger.qdq_nodes = None
        return groups

    def generate_partitions(self, ep: ExportedProgram) -> list[Partition]:
        """The stock grouping of the admitted matches, merged where it can be, checked as partitions; then
        implicit q/dq are marked."""
        merged = merge_partitions(super().generate_partitions(ep), ep.graph_module.graph)
        partitions = [p for p in merged if self._admit_partition(ep, p)]
        partition_of = {node: p.id for p in partitions for node in p.nodes}
        for match in self._ledger.matches:
            owner = partition_of.get(match.anchor)
            if owner is None:
                continue
            for qdq in match.implicit:
                if partition_of.get(qdq) == owner:
                    implicit_qdq.mark_implicit(qdq)
        return partitions

    def _admit_partition(self, ep: ExportedProgram, partition: Partition) -> bool:
        """Take out of ``partition`` the outputs a partition rule forbids; False when no op is left.

        A forbidden output leaves with every node of the partition that reads it (directly or not), so
        the partition stays convex; a constant only those nodes used leaves too.
        """
        while (found := _first_forbidden(partition)) is not None:
            node, record = found
            members = set(partition.nodes)
            self._ledger.keep_out(record)
            for dependent in _dependents_within(node, members):
                reason = f"it reads {node.name}, which runs outside XNNPACK ({record.rule.value})"
                self._ledger.keep_out(KeptOut(dependent.name, target_name(dependent), Rule.NEEDS_KEPT_OUT_NODE, reason))
                partition.remove_node(dependent)
            partition.remove_node(node)
            for constant in [n for n in partition.nodes if is_constant_data(ep, n)]:
                if not any(user in partition.nodes for user in constant.users):
                    partition.remove_node(constant)
        return any(n.op == "call_function" for n in partition.nodes)

    @staticmethod
    def _register_quantized_kernels_if_needed(gm: torch.fx.GraphModule) -> None:
        """q/dq left outside XNNPACK need ExecuTorch's quantized out-variants at ``to_executorch()``."""
        if any("delegation_tag" not in n.meta for n in implicit_qdq.quantization_nodes(gm.graph)):
            releases.load_quantized_kernels()  # on 1.4.0 the plain import is not enough: see there


def _pre_decomposition_rewrites(graph_module: torch.fx.GraphModule) -> list[NodeRewritePass]:
    """The rewrites that have work on ``graph_module``: a max over H or W, a PReLU of another rank, a pad
    that crops, an integer scalar operand of a float op, a requantization after a high-rank view, a max pooling whose
    indices nobody reads, a ``detach``, a graph output that shares its dequantize, a high-rank dequantize
    read by views to fewer dims."""
    forms = (
        MaxKeepdimPass(),
        PReLUTo4dPass(),
        CroppingPadPass(),
        FloatScalarsPass(),
        RequantizedViewsPass(),
        ValuesOnlyMaxPoolPass(),
        InferenceDetachPass(),
        OutputDequantizePass(),
        LowRankDequantizePass(),
    )
    return [rewrite for rewrite in forms if rewrite.applies_to(graph_module)]


def _dynamic_dim_rewrites() -> list[NodeRewritePass]:
    """What a program with a dynamic dim needs before decomposition: no slice that keeps its whole input
    (XNNPACK takes no slice of a symbolic dim), a stack as views that infer the dim, then every view's
    dynamic size as -1."""
    return [WholeSlicePass(), InferredStackPass(), InferredViewPass()]


def _has_dynamic_dims(graph_module: torch.fx.GraphModule) -> bool:
    """True when a graph input has a symbolic size: its views then need ``InferredViewPass``."""
    for node in graph_module.graph.nodes:
        value = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor) and not all(isinstance(size, int) for size in value.shape):
            return True
    return False


def _first_forbidden(partition: Partition) -> tuple[torch.fx.Node, KeptOut] | None:
    """The first node ``keep_out_reason`` forbids in ``partition`` (asked as a whole), with the record."""
    members = set(partition.nodes)
    for node in partition.nodes:
        record = keep_out_reason(node, members)
        if record is not None:
            return node, record
    return None


def _dependents_within(node: torch.fx.Node, members: set[torch.fx.Node]) -> list[torch.fx.Node]:
    """The nodes of ``members`` that read ``node``'s output, directly or through other members."""
    found: list[torch.fx.Node] = []
    pending = [user for user in node.users if user in members]
    while pending:
        current = pending.pop()
        if current in found:
            continue
        found.append(current)
        pending.extend(user for user in current.users if user in members)
    return found
