"""What the views rewrites share: the graph's aliasing, read once per pass run, and the splice-and-redirect step.

A view (``select``, ``squeeze``...) shares its input's storage: replacing it by a ``reshape`` that copies
would lose the writes an in-place op makes to that storage after it. ``AliasAwarePass`` reads the
graph's aliasing (``xnnguard.graph.aliasing``) at the start of each run, so that its ``picks`` can leave
alone any view whose storage is written after it, and runs it again for its postcondition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch

from xnnguard.graph.aliasing import Aliasing
from xnnguard.pass_result import ReportedPassResult
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rules.tagged import tag_of

__all__ = ["AliasAwarePass", "replace_by", "view_sizes"]


class AliasAwarePass(NodeRewritePass):
    """A ``NodeRewritePass`` whose ``picks`` may ask ``self.aliasing`` (valid during call / ensures / applies_to)."""

    def __init__(self) -> None:
        super().__init__()
        self._aliasing: Aliasing | None = None

    @property
    def aliasing(self) -> Aliasing:
        assert self._aliasing is not None, "aliasing is read in call, ensures and applies_to"
        return self._aliasing

    @contextmanager
    def _read(self, graph_module: torch.fx.GraphModule) -> Iterator[None]:
        self._aliasing = Aliasing(graph_module.graph)
        try:
            yield
        finally:
            self._aliasing = None

    def picks(self, node: torch.fx.Node) -> bool:
        if self._aliasing is None:  # asked on its own
            with self._read(node.graph.owning_module):  # type: ignore[arg-type]
                return self.picks(node)
        return node.op == "call_function" and not tag_of(node) and self.chooses(node)

    def chooses(self, node: torch.fx.Node) -> bool:
        """True for a node this pass rewrites (``aliasing`` is available)."""
        raise NotImplementedError

    def call(self, graph_module: torch.fx.GraphModule) -> ReportedPassResult:
        with self._read(graph_module):
            return super().call(graph_module)

    def ensures(self, graph_module: torch.fx.GraphModule) -> None:
        with self._read(graph_module):
            super().ensures(graph_module)

    def applies_to(self, graph_module: torch.fx.GraphModule) -> bool:
        with self._read(graph_module):
            return super().applies_to(graph_module)


def view_sizes(sizes: Sequence[int | torch.SymInt]) -> list[int | torch.SymInt]:
    """``sizes`` for a ``reshape``, the only dynamic one (if only one is) written -1.

    A reshape whose sizes are graph values (``sym_size`` nodes) is refused by XNNPACK ("invalid dtype":
    its size inputs are ints); with -1 it takes one dynamic dim.
    """
    dynamic = [i for i, size in enumerate(sizes) if not isinstance(size, int)]
    return [-1 if len(dynamic) == 1 and i == dynamic[0] else size for i, size in enumerate(sizes)]


def replace_by(
    graph_module: torch.fx.GraphModule,
    node: torch.fx.Node,
    replacement: Callable[..., torch.Tensor],
    inputs: Sequence[torch.fx.Node | torch.Tensor],
) -> torch.fx.Node:
    """Splice ``replacement(*inputs)`` in front of ``node`` and give ``node``'s users its result."""
    output = splice_before(graph_module, node, replacement, inputs)
    node.replace_all_uses_with(output)
    return output
