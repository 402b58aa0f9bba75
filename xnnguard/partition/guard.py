"""A guard around each of ExecuTorch's XNNPACK configs: the stock matching loop asks it, it asks the rules.

ExecuTorch's ``ConfigerationBasedPartitioner.get_matched_nodes_from_configs`` walks the graph and, for
each node, asks the config registered under the node's target name ``check_constraints`` and then
``get_partition``, and unions the matches. xnnguard keeps that loop as it is and registers a
``GuardedConfig`` (same ``target_name``) in front of each stock config instead, so every match the loop
makes has been checked here:

* ``check_constraints`` refuses a node ``keep_out_reason`` forbids before the stock check sees it, and
  takes off the implicit marks the stock check set (a check is not a partition,
  ``xnnguard.partition.implicit_qdq``); a refusal by the stock check is remembered with its reason;
* ``get_partition`` takes the stock match, holds back the implicit marks it set (they go back on once
  the partition is taken), leaves out optional members a rule forbids, drops a match that needs a
  forbidden op or q/dq, and asks the match-level (int8) rules of ``xnnguard.rules.registry``. Returning
  ``[]`` makes the stock loop skip the match.

Outside the matching loop (``ops_to_not_decompose`` asks ``check_constraints`` of the ATen program) a
guard only passes the call on: what is decided there is decided by the partitioner's own filter.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from executorch.exir.backend.canonical_partitioners.config_partitioner import PartitionerConfig

from xnnguard.graph.ops import target_name
from xnnguard.partition import implicit_qdq
from xnnguard.report import KeptOut, Rule
from xnnguard.rules.keep_out import keep_out_reason
from xnnguard.rules.registry import first_record
from xnnguard.rules.rule import Context, Effect, Scope

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.export import ExportedProgram

__all__ = ["GuardedConfig", "Ledger", "Match"]

logger = logging.getLogger("xnnguard")


@dataclass
class Match:
    """A config match the guard let through: its anchor, its nodes, and the q/dq it marked implicit."""

    anchor: torch.fx.Node
    nodes: list[torch.fx.Node]
    implicit: set[torch.fx.Node]


@dataclass
class Ledger:
    """What one ``partition`` call learned: the matches, what was kept out, and what a stock config refused.

    ``qdq_nodes`` is set while the matching loop runs (None otherwise): the q/dq nodes of the graph,
    the only nodes a config marks implicit.
    """

    qdq_nodes: list[torch.fx.Node] | None = None
    matches: list[Match] = field(default_factory=list)
    kept_out: dict[str, KeptOut] = field(default_factory=dict)
    refused: dict[torch.fx.Node, str] = field(default_factory=dict)  # node -> the config that refused it
    reasons: dict[torch.fx.Node, str] = field(default_factory=dict)  # node -> what that config logged (``why``)

    def keep_out(self, record: KeptOut) -> None:
        self.kept_out.setdefault(record.node, record)

    def take_marks(self) -> set[torch.fx.Node]:
        return implicit_qdq.take_marks(self.qdq_nodes or ())


class GuardedConfig(PartitionerConfig):
    """A stock XNNPACK config as the stock matching loop sees it, with xnnguard's rules checked around it."""

    def __init__(self, config: PartitionerConfig, ledger: Callable[[], Ledger]) -> None:
        self.config = config
        self._ledger = ledger

    @property
    def target_name(self) -> str:
        return str(self.config.target_name)

    def __getattr__(self, name: str) -> Any:
        """Everything else is the stock config's (``force_non_static_weights_for_f32_linear``, ...)."""
        config = self.__dict__.get("config")  # absent while copy or pickle rebuilds the object
        if config is None:
            raise AttributeError(name)
        return getattr(config, name)

    def __repr__(self) -> str:
        return f"GuardedConfig({type(self.config).__name__})"

    def get_original_aten(self) -> torch._ops.OpOverload | None:
        return self.config.get_original_aten()

    def check_constraints(self, node: torch.fx.Node, ep: ExportedProgram) -> bool:
        ledger = self._ledger()
        if ledger.qdq_nodes is None:
            return self._stock_accepts(node, ep, ledger)
        record = keep_out_reason(node)
        if record is not None:
            ledger.keep_out(record)
            return False
        accepted = self._stock_accepts(node, ep, ledger)
        ledger.take_marks()  # a check is not a partition
        if not accepted:
            ledger.refused.setdefault(node, type(self.config).__name__)
        return accepted

    def _stock_accepts(self, node: torch.fx.Node, ep: ExportedProgram, ledger: Ledger) -> bool:
        """The stock check; one that raises refuses the node instead of ending the lowering.

        ExecuTorch 1.4's ``MaxPool2dConfig`` reads ``node.args[2]``, so ``F.max_pool2d(x, 2)`` (no stride
        written) raised IndexError from inside ``to_edge_transform_and_lower``.
        """
        try:
            return bool(self.config.check_constraints(node, ep))
        except Exception as error:  # a bug of the stock check, not of the program
            name = type(self.config).__name__
            ledger.reasons.setdefault(node, f"{name}'s check failed on this node ({type(error).__name__}: {error})")
            logger.debug("xnnguard: %s raised on %s: %s", name, node.name, error)
            return False

    def get_partition(self, node: torch.fx.Node, ep: ExportedProgram) -> list[torch.fx.Node]:
        ledger = self._ledger()
        candidate = list(self.config.get_partition(node, ep))
        if ledger.qdq_nodes is None:
            return candidate
        implicit = ledger.take_marks()
        nodes = _admissible(ledger, node, candidate)
        if nodes is None:
            return []
        checked = _int8_checked(ledger, node, nodes, implicit & set(nodes))
        if checked is None:
            return []
        nodes, implicit = checked
        ledger.matches.append(Match(node, nodes, implicit))
        return nodes


def _admissible(ledger: Ledger, anchor: torch.fx.Node, candidate: list[torch.fx.Node]) -> list[torch.fx.Node] | None:
    """The nodes of a config's match that may go to XNNPACK, or None when the match cannot be taken.

    Optional members (source-partition views, a fused activation) that a rule forbids are left
    outside; a forbidden q/dq or choose_qparams would change what the op computes, so the whole
    match is dropped instead.
    """
    admissible = []
    for node in candidate:
        record = keep_out_reason(node)
        if record is None:
            admissible.append(node)
        elif node is anchor or implicit_qdq.is_quantization_node(node):
            ledger.keep_out(record)
            reason = f"its partition needs {node.name}, whose {record.reason}"
            ledger.keep_out(KeptOut(anchor.name, target_name(anchor), Rule.NEEDS_KEPT_OUT_NODE, reason))
            return None
        else:
            ledger.keep_out(record)
    return admissible


def _int8_checked(
    ledger: Ledger, anchor: torch.fx.Node, nodes: list[torch.fx.Node], implicit: set[torch.fx.Node]
) -> tuple[list[torch.fx.Node], set[torch.fx.Node]] | None:
    """A match as XNNPACK will take it int8, or None when it cannot be taken at all.

    The match-level rules of ``xnnguard.rules.registry`` decide: one that keeps a member out drops the
    whole match (a pad ExecuTorch makes int8 without its dequantize, a dynamically quantized conv whose
    input 1.5.1 lays out wrong); one that takes the anchor as a float op leaves its q/dq out of the match,
    conversions of their own (an int8 move whose q/dq differ).
    """
    context = Context(implicit=implicit)
    for member in nodes:
        record = first_record(member, Scope.MATCH, context=context, effect=Effect.KEEP_OUT)
        if record is not None:
            ledger.keep_out(record)
            return None
    as_float = first_record(anchor, Scope.MATCH, context=context, effect=Effect.TAKE_AS_FLOAT)
    if as_float is None:
        return nodes, implicit
    logger.debug("xnnguard: %s taken as a float op: %s", anchor.name, as_float.reason)
    own = {n for n in implicit if n in anchor.all_input_nodes or anchor in n.all_input_nodes}
    return [n for n in nodes if n not in own], implicit - own
