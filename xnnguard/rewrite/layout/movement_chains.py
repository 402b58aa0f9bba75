"""A chain of reshapes and permutes that moves no element is one reshape.

Invariant established: no chain of two or more statically shaped reshapes and permutes (each read only
by the next) takes a tensor to a tensor with its elements in the same row-major order; such a chain is
replaced by one ``reshape`` (none when the shapes are equal). Checked by running the chain on the
tensor of element indices, so the result is exactly the one the chain computed.

Why: each rewrite of a 3-D op works on frames folded into the batch, (N*D, C, H, W), and returns to
(N, C, D, H, W) for the next op, which folds them again. Between two such ops XNNPACK ran a transpose
back and a transpose forth, and ExecuTorch's NHWC pass a layout conversion around each (a 3x3x3 conv
after another, a Conv3d then a MaxPool3d). One reshape between them costs one conversion out of NHWC,
or nothing when the shapes are equal and the two convs then share their NHWC layout.
A chain with a dynamic size or an arg computed in the graph is left as it is (nothing is delegated
differently, only one copy more runs).
"""

from __future__ import annotations

import logging

import torch
from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.graph.shapes import static_shape
from xnnguard.pass_result import PostconditionError, ReportedPassResult
from xnnguard.rewrite.insert import call_like

__all__ = ["CollapseMovementChainsPass", "movement_chain"]

logger = logging.getLogger("xnnguard.rewrite")

_aten = torch.ops.aten
_MOVEMENT = frozenset({_aten.reshape.default, _aten.view.default, _aten._unsafe_view.default, _aten.permute.default})


def _is_movement(node: object) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _MOVEMENT


def _static_args(node: torch.fx.Node) -> bool:
    """Sizes and dims written as plain ints (none read from the graph), and a static output."""
    return static_shape(node) is not None and not any(
        isinstance(leaf, torch.fx.Node) for leaf in torch.utils._pytree.tree_leaves((node.args[1:], node.kwargs))
    )


def movement_chain(end: torch.fx.Node) -> list[torch.fx.Node]:
    """The reshapes and permutes ending at ``end``, first first: each read only by the next one."""
    chain = [end]
    while True:
        source = chain[-1].args[0]
        if not isinstance(source, torch.fx.Node) or not _is_movement(source):
            break
        if len(source.users) != 1 or not _static_args(source):
            break
        chain.append(source)
    return chain[::-1]


def _moves_nothing(chain: list[torch.fx.Node]) -> bool:
    """True when ``chain`` leaves every element of its source at the same row-major position."""
    source = chain[0].args[0]
    shape = static_shape(source)
    if shape is None:
        return False
    indices = torch.arange(torch.Size(shape).numel()).reshape(shape)
    moved = indices
    for node in chain:
        moved = node.target(moved, *node.args[1:], **node.kwargs)  # type: ignore[operator]
    return bool(torch.equal(moved.reshape(-1), indices.reshape(-1)))


def _collapsible(end: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The chain ending at ``end`` when it is collapsible and maximal, else None."""
    if not _is_movement(end) or not _static_args(end):
        return None
    (only_user, *others) = end.users if end.users else (None,)
    if not others and _is_movement(only_user) and _static_args(only_user):  # type: ignore[arg-type]
        return None  # not the end: the chain goes on
    chain = movement_chain(end)
    if len(chain) < 2 or not any(node.target is _aten.permute.default for node in chain):
        return None  # reshapes alone: ExecuTorch already folds consecutive views
    return chain if _moves_nothing(chain) else None


class CollapseMovementChainsPass(PassBase):
    """Replaces each chain of reshapes and permutes that moves no element by one reshape."""

    def call(self, graph_module: torch.fx.GraphModule) -> ReportedPassResult:
        graph = graph_module.graph
        collapsed = 0
        for end in list(graph.nodes):
            chain = _collapsible(end)
            if chain is None:
                continue
            source = chain[0].args[0]
            assert isinstance(source, torch.fx.Node)
            shape = static_shape(end)
            assert shape is not None
            if static_shape(source) == shape:
                end.replace_all_uses_with(source)
            else:
                with graph.inserting_before(end):
                    end.replace_all_uses_with(call_like(graph, end, _aten.reshape.default, (source, list(shape))))
            collapsed += 1
        if collapsed:
            graph.eliminate_dead_code()
            graph.lint()
            graph_module.recompile()
            logger.debug("%s: %d reshape/permute chains collapsed", type(self).__name__, collapsed)
        return ReportedPassResult(graph_module, bool(collapsed))

    def ensures(self, graph_module: torch.fx.GraphModule) -> None:
        left = [node.name for node in graph_module.graph.nodes if _collapsible(node) is not None]
        if left:
            raise PostconditionError(type(self).__name__, "to collapse every chain that moves no element", left)
