"""An XNNPACK partition must not output a memory-format round trip of one of its inputs.

This module is the one place that rule lives. Before serializing a delegate, ExecuTorch 1.5.1 drops the
copies that only move a tensor between memory formats (``XNNPACKRemoveCloneOpsTransform``,
``DimOrderOpsRevertPass``, then ``RemoveRedundantCopyPass`` removes a channels-last copy followed by a
contiguous one). When such a chain leads from a partition input straight to a partition output, the
output becomes the input itself, and the delegate fails to lower: "Output node '...' is already in the
inputs. This is likely due to pass through arguments, which are not supported in XNNPACK Delegate".
``x.to(memory_format=torch.channels_last).contiguous()`` returned from a model is enough.

The rule is about a partition, not a node alone: the same round trip between two ops of one partition
lowers fine. It answers for an output node of a given partition.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

__all__ = ["passthrough_output_violation"]

_COPIES = frozenset({"_to_copy", "_to_dim_order_copy"})
_CLONES = frozenset({"clone", "_clone_dim_order"})


def _op_name(node: torch.fx.Node) -> str:
    parts = getattr(node.target, "__name__", "").split(".")
    return parts[-2] if node.op == "call_function" and len(parts) >= 2 else ""


def _moves_memory_format_only(node: torch.fx.Node) -> bool:
    """A copy or clone whose output is its input's values with the same dtype (any dim order)."""
    if _op_name(node) not in _COPIES | _CLONES or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    out, source = node.meta.get("val"), node.args[0].meta.get("val")
    if not isinstance(out, torch.Tensor) or not isinstance(source, torch.Tensor):
        return False
    return out.dtype == source.dtype and out.shape == source.shape and out.device == source.device


def _copied(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose tensor ``node`` copies, for a node ``_moves_memory_format_only`` accepted."""
    source = node.args[0]
    assert isinstance(source, torch.fx.Node)
    return source


def _is_output_of(node: torch.fx.Node, partition: Collection[torch.fx.Node]) -> bool:
    return any(user not in partition for user in node.users)


def passthrough_output_violation(node: torch.fx.Node, partition: Collection[torch.fx.Node]) -> str | None:
    """Why ``node`` cannot be an output of ``partition`` (a set of nodes that contains it), or None.

    It cannot when it is the end of a chain of memory-format copies inside the partition that starts at
    a partition input and ends in that input's own dim order. A chain of clones alone is fine: XNNPACK
    keeps a clone that copies a delegate input to a delegate output.
    """
    if node not in partition or not _is_output_of(node, partition) or not _moves_memory_format_only(node):
        return None
    chain = [node]
    source = _copied(node)
    while source in partition and _moves_memory_format_only(source):
        chain.append(source)
        source = _copied(source)
    if source in partition or all(_op_name(link) in _CLONES for link in chain):
        return None
    if node.meta["val"].dim_order() != source.meta["val"].dim_order():
        return None
    return (
        f"it only moves the partition input {source.name} between memory formats and back: XNNPACK "
        "removes such copies, and a delegate cannot output its own input"
    )
