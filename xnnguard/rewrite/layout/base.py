"""``LayoutPass``: the skeleton the layout passes share: find a site, move values, check none is left.

A layout pass changes where values sit, never what they are, and never which ops XNNPACK takes: it has
nothing to report, and a site it cannot handle stays as it was.
"""

from __future__ import annotations

import logging
from typing import Generic, TypeVar

import torch
from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.pass_result import PostconditionError, ReportedPassResult

__all__ = ["LayoutPass"]

logger = logging.getLogger("xnnguard.rewrite")

Site = TypeVar("Site")

_MAX_SWEEPS = 32


class LayoutPass(PassBase, Generic[Site]):
    """Applies ``rewrite`` at every node ``site`` finds something at, in graph order; ``ensures`` none is left."""

    promise = ""  # what ``ensures`` checks, for its error: "to ... every ..."

    def site(self, node: torch.fx.Node) -> Site | None:
        """What the pass would change at ``node``, or None."""
        raise NotImplementedError

    def rewrite(self, graph: torch.fx.Graph, node: torch.fx.Node, site: Site) -> None:
        """Change the graph at ``node``; ``node``'s readers read the new value after it."""
        raise NotImplementedError

    def call(self, graph_module: torch.fx.GraphModule) -> ReportedPassResult:
        """Sweeps the graph until a sweep finds no site.

        One sweep is not enough: a rewrite frees nodes that an earlier site shared with it (a permute two
        chains read), and a site passed over then, because what it would free was read elsewhere, is one
        once the dead nodes are gone. Each rewrite moves ops toward their sources or shortens a chain,
        so the sweeps end; ``_MAX_SWEEPS`` only guards against a pass that would not.
        """
        graph = graph_module.graph
        changed = 0
        for _ in range(_MAX_SWEEPS):
            found = 0
            for node in list(graph.nodes):
                site = self.site(node)
                if site is not None:
                    self.rewrite(graph, node, site)
                    found += 1
            if not found:
                break
            graph.eliminate_dead_code()
            changed += found
        if changed:
            graph.lint()
            graph_module.recompile()
            logger.debug("%s: %d sites", type(self).__name__, changed)
        return ReportedPassResult(graph_module, bool(changed))

    def ensures(self, graph_module: torch.fx.GraphModule) -> None:
        left = [node.name for node in graph_module.graph.nodes if self.site(node) is not None]
        if left:
            raise PostconditionError(type(self).__name__, self.promise, left)
