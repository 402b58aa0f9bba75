"""XNNPACK takes tensors of at most ``XNN_MAX_TENSOR_DIMS`` (6) dims.

This module is the one place that rule lives: the tag pass, the partitioner and the verifier all ask it.
The limit is ExecuTorch's own constant, so a release that raises it raises ours. torch is imported only
by the functions that look at graph nodes, so the verifier can ask this module without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from xnnguard.boundary.xnnpack_constants import XNN_MAX_TENSOR_DIMS
from xnnguard.report import Rule
from xnnguard.rules.rule import RuleCheck, Scope

if TYPE_CHECKING:
    import torch

__all__ = ["RULE", "XNN_MAX_TENSOR_DIMS", "exceeds_rank_limit", "rank_violation"]


def exceeds_rank_limit(num_dims: int) -> bool:
    """True when XNNPACK refuses a tensor of ``num_dims`` dims ("Failed to define tensor" at load)."""
    return num_dims > XNN_MAX_TENSOR_DIMS


def _tensor_ranks(value: object) -> Iterator[int]:
    """Ranks of every tensor in a node's ``meta["val"]`` (a tensor, or a tuple/list of them)."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value.dim()
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensor_ranks(item)


def rank_violation(node: torch.fx.Node) -> str | None:
    """Why ``node`` cannot go to XNNPACK because of a tensor rank, or None when every rank fits.

    Both sides count: an op with a 7-D input and a 4-D output (a reshape) is as impossible for
    XNNPACK as one with a 7-D output, because the input must be defined as an XNNPACK tensor too.
    """
    for rank in _tensor_ranks(node.meta.get("val")):
        if exceeds_rank_limit(rank):
            return f"output has {rank} dims > {XNN_MAX_TENSOR_DIMS}"
    for index, arg in enumerate(node.all_input_nodes):
        for rank in _tensor_ranks(arg.meta.get("val")):
            if exceeds_rank_limit(rank):
                return f"input {index} ({arg.name}) has {rank} dims > {XNN_MAX_TENSOR_DIMS}"
    return None


RULE = RuleCheck(
    Rule.HIGH_RANK,
    Scope.NODE,
    f"XNNPACK takes tensors of at most {XNN_MAX_TENSOR_DIMS} dims, inputs and outputs alike",
    lambda node, _context: rank_violation(node),
)
