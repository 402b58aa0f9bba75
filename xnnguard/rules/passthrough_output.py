"""An XNNPACK partition output must stay a value of its own once XNNPACK drops memory-format copies.

This module is the one place that rule lives. Before serializing a delegate, ExecuTorch 1.5.1 drops the
copies that only move a tensor between memory formats (``XNNPACKRemoveCloneOpsTransform``,
``DimOrderOpsRevertPass``, then ``RemoveRedundantCopyPass`` removes a channels-last copy followed by a
contiguous one). An output made by such a chain becomes the chain's source, and the delegate fails to
lower ("Output node '...' is already in the inputs. This is likely due to pass through arguments, which
are not supported in XNNPACK Delegate") when that source is

* a partition input: ``x.to(memory_format=torch.channels_last).contiguous()`` returned from a model;
* another output of the partition, or the source of one that comes earlier: ``h = x.permute(...)`` read
  both by a delegated op after a non-delegated one and, made contiguous, by the non-delegated op
  (``h + group_norm(h.contiguous())``, the residual block of every video VAE and 3-D UNet).

The rule is about a partition, not a node alone: the same copies between two ops of one partition lower
fine. It answers for an output node of a given partition.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, cast

from xnnguard.graph.ops import is_op
from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rules.rule import Context, RuleCheck, Scope

if TYPE_CHECKING:
    import torch

__all__ = ["RULE", "passthrough_output_violation"]

_COPIES = frozenset({"_to_copy", "_to_dim_order_copy"})
_CLONES = frozenset({"clone", "_clone_dim_order"})


def _moves_memory_format_only(node: torch.fx.Node) -> bool:
    """A copy or clone whose output is its input's values with the same dtype (any dim order)."""
    if not is_op(node, _COPIES | _CLONES) or not node.args:
        return False
    out, source = tensor_value(node), tensor_value(node.args[0])
    if out is None or source is None:
        return False
    return out.dtype == source.dtype and out.shape == source.shape and out.device == source.device


def _copied(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose tensor ``node`` copies, for a node ``_moves_memory_format_only`` accepted."""
    return cast("torch.fx.Node", node.args[0])  # a node: only nodes carry a value


def _is_output_of(node: torch.fx.Node, partition: Collection[torch.fx.Node]) -> bool:
    return any(user not in partition for user in node.users)


def _source(node: torch.fx.Node, partition: Collection[torch.fx.Node]) -> tuple[torch.fx.Node, bool] | None:
    """What the output ``node`` becomes once XNNPACK drops the copies it is made by, and whether those
    copies are clones only; None when ``node`` stays a value of its own.

    The copies are the chain of memory-format-only copies inside ``partition`` that ends at ``node``;
    XNNPACK drops them when the chain ends in the dim order it started from.
    """
    if not _moves_memory_format_only(node):
        return None
    chain = [node]
    source = _copied(node)
    while source in partition and _moves_memory_format_only(source):
        chain.append(source)
        source = _copied(source)
    if node.meta["val"].dim_order() != source.meta["val"].dim_order():
        return None
    return source, all(is_op(link, _CLONES) for link in chain)


def passthrough_output_violation(node: torch.fx.Node, partition: Collection[torch.fx.Node]) -> str | None:
    """Why ``node`` cannot be an output of ``partition`` (a set of nodes that contains it), or None."""
    if node not in partition or not _is_output_of(node, partition):
        return None
    found = _source(node, partition)
    if found is None:
        return None
    source, clones_only = found
    if source not in partition:
        if clones_only:  # XNNPACK keeps a clone that copies a delegate input to a delegate output
            return None
        return (
            f"it only moves the partition input {source.name} between memory formats and back: XNNPACK "
            "removes such copies, and a delegate cannot output its own input"
        )
    if _is_output_of(source, partition):
        return (
            f"it only copies {source.name}, another output of the partition: XNNPACK removes the copy, "
            "and a delegate cannot output one value twice"
        )
    for other in node.graph.nodes:
        if other is node:
            return None
        found = _source(other, partition) if other in partition and _is_output_of(other, partition) else None
        if found is not None and found[0] is source:
            return (
                f"it only copies {source.name}, as the partition output {other.name} does: XNNPACK removes "
                "both copies, and a delegate cannot output one value twice"
            )
    return None


def _check(node: torch.fx.Node, context: Context) -> str | None:
    return None if context.partition is None else passthrough_output_violation(node, context.partition)


RULE = RuleCheck(
    Rule.PASSTHROUGH_OUTPUT,
    Scope.PARTITION,
    "a partition output stays a value of its own once XNNPACK drops its copies",
    _check,
)
