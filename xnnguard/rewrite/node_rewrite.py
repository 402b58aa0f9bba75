"""``NodeRewritePass``: the shape every xnnguard rewrite shares — pick nodes, rewrite each or say why not.

A subclass states which nodes it looks at (``picks``) and rewrites one (``rewrite``: None when done, else
one sentence saying why it was left as it was). The base class does the rest the same way for all:

* a rewrite that raises midway has the nodes it inserted erased (rewrites insert first and redirect
  the node's users last, so those nodes are unused) and counts as "left as it was", never a traceback;
* a node left as it was is reported under the subclass's ``rule`` (at WARNING when 1.5.1 cannot run
  what is left, ``left_op_fails``) (unless the rewrite is optional,
  ``rule = None``), tagged ``DO_NOT_DELEGATE`` (unless a later pass decides about it,
  ``tags_what_it_leaves = False``), and marked as left by this pass in its meta;
* every node a rewrite inserts is stamped with the node it replaces (``xnnguard.rewrite.provenance``):
  ``pieces_stay_float`` when the op it replaces is one quantization leaves float, the pass's
  ``shares_input_quantization`` when that op's output shares its input's quantization (a mean), and the
  pass's ``quantization_note`` when its form rounds where the original op does not;
* a modified graph is cleaned (dead code, attributes no node reads any more), linted and recompiled;
* the postcondition (``ensures``): every node the pass still picks afterwards is one it marked as left,
  so a rewrite that claims success without replacing its node is caught (``PostconditionError``).
"""

from __future__ import annotations

import logging
from typing import ClassVar

import torch
from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.graph.ops import target_name
from xnnguard.pass_result import PostconditionError, ReportedPassResult
from xnnguard.report import KeptOut, Rule
from xnnguard.rewrite.attributes import drop_unused_attributes
from xnnguard.rewrite.provenance import RewriteStamp, stamp
from xnnguard.rules.tagged import tag

__all__ = ["IdentityPass", "NodeRewritePass"]

logger = logging.getLogger("xnnguard.rewrite")

_LEFT = "xnnguard_left_by"  # meta: names of the passes that left this node as it was


class NodeRewritePass(PassBase):
    """Rewrites every node ``picks`` chooses; reports (and tags) the ones it has to leave as they were."""

    rule: ClassVar[Rule | None] = None  # None: leaving a node as it was is fine and goes unreported
    subject: ClassVar[str] = "node"  # what a report names: "3-D convolution not rewritten: <reason>"
    tags_what_it_leaves: ClassVar[bool] = True  # False when a later pass decides about what is left
    pieces_stay_float: ClassVar[bool] = False  # the op it replaces is one the XNNPACK quantizer leaves float
    # Set when ExecuTorch 1.5.1 cannot run the op it leaves: said at WARNING, not INFO, with what fails.
    left_op_fails: ClassVar[str | None] = None

    def picks(self, node: torch.fx.Node) -> bool:
        raise NotImplementedError

    def left_node_fails(self, node: torch.fx.Node) -> str | None:
        """What fails in ExecuTorch 1.5.1 when ``node`` is left as it was (``left_op_fails`` for every node of
        the pass; a pass whose left nodes fail only in some cases says which)."""
        return self.left_op_fails

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        """Replace ``node`` in ``graph_module``; return None when done, else why it was left as it was."""
        raise NotImplementedError

    def applies_to(self, graph_module: torch.fx.GraphModule) -> bool:
        """True when the graph has a node this pass picks (a caller may skip the pass otherwise)."""
        return any(self.picks(node) for node in graph_module.graph.nodes)

    def stays_float(self, node: torch.fx.Node) -> bool:
        """True when the pieces of ``node``'s form stay float in int8 (``pieces_stay_float`` for every node
        of the pass; a pass whose forms differ by node says which)."""
        return self.pieces_stay_float

    def shares_input_quantization(self, node: torch.fx.Node) -> bool:
        """True when quantization lets ``node``'s output share its input's (a share op such as a mean)."""
        return False

    def quantization_note(self, node: torch.fx.Node) -> str | None:
        """Why this pass's form of ``node``, once quantized, rounds where ``node`` does not (None: it does not)."""
        return None

    def record(self, node: torch.fx.Node, reason: str) -> KeptOut:
        """The report record of ``node``, left as it was because of ``reason``."""
        assert self.rule is not None
        return KeptOut(node.name, target_name(node), self.rule, f"{self.subject} not rewritten: {reason}")

    def call(self, graph_module: torch.fx.GraphModule) -> ReportedPassResult:
        graph = graph_module.graph
        report: list[KeptOut] = []
        rewritten = 0
        for node in list(graph.nodes):
            if not self.picks(node):
                continue
            before = set(graph.nodes)
            try:
                reason = self.rewrite(graph_module, node)
            except Exception as error:  # any failure leaves the node as it was, reported
                reason = f"the rewrite failed ({type(error).__name__}: {error})"
                for inserted in reversed([n for n in graph.nodes if n not in before]):
                    if not inserted.users:
                        graph.erase_node(inserted)
            if reason is None:
                rewritten += 1
                mark = RewriteStamp(
                    node.name,
                    target_name(node),
                    self.stays_float(node),
                    self.quantization_note(node),
                    self.shares_input_quantization(node),
                )
                for inserted in (n for n in graph.nodes if n not in before):
                    stamp(inserted, mark)
                continue
            node.meta.setdefault(_LEFT, []).append(type(self).__name__)
            if self.rule is not None:
                record = self.record(node, reason)
                if self.tags_what_it_leaves:
                    tag(node, record.reason, record.rule)
                report.append(record)
                fails = self.left_node_fails(node)
                if fails is not None:
                    logger.warning("xnnguard: %s; %s", record, fails)
                else:
                    logger.info("%s", record)
        if rewritten:
            graph_module.graph.eliminate_dead_code()
            drop_unused_attributes(graph_module)
            graph_module.graph.lint()
            graph_module.recompile()
            logger.debug("%s: %d %s rewritten", type(self).__name__, rewritten, self.subject)
        return ReportedPassResult(graph_module, bool(rewritten), report)

    def ensures(self, graph_module: torch.fx.GraphModule) -> None:
        name = type(self).__name__
        unhandled = [
            node.name
            for node in graph_module.graph.nodes
            if self.picks(node) and name not in node.meta.get(_LEFT, ())
        ]
        if unhandled:
            raise PostconditionError(name, f"to replace every {self.subject} it picks or to report it", unhandled)


class IdentityPass(NodeRewritePass):
    """Replaces each node it picks by its first argument: for ops that compute their input's values
    (a ``detach``, a slice that keeps the whole dim)."""

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        source = node.args[0]
        assert isinstance(source, torch.fx.Node)
        node.replace_all_uses_with(source)
        graph_module.graph.erase_node(node)
        return None
