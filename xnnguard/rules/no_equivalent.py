"""What nothing XNNPACK runs can compute: integer tensors, gathers by indices the program computes, and
broadcasts to a size known only at run time.

The XNNPACK runtime of ExecuTorch 1.5.1 defines floating-point and 8-bit quantized tensors only (int32
holds quantized biases), and none of its node types reads an index tensor: it has no gather, embedding
lookup, comparison or integer arithmetic. So a node that computes an int64, int32, int16 or bool tensor,
or that gathers rows by a tensor known only when the program runs (a graph input such as Qwen2-VL's patch
position ids), stays on portable kernels whatever xnnguard rewrites. A gather by constant indices is
something else: ``xnnguard.rewrite.fold`` computes it at export.

Nor has it a broadcast node: a tensor takes a run-time size (a dynamic batch) only from an input of that
size. So an ``expand`` along a dynamic dim (MViT's class token to the batch) that no elementwise consumer
broadcasts in its place (``xnnguard.rewrite.views.expand`` drops those) has no XNNPACK form: any would
compute it from another tensor's values (``0 * x + token``), which a NaN or an infinity in ``x`` breaks.

This module is the one place that rule lives; the partitioner's report names such a node under
``Rule.NO_XNNPACK_EQUIVALENT``, so "ops left outside" can tell this floor from work still to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xnnguard.graph.ops import is_op
from xnnguard.graph.shapes import dynamic_broadcast_dim, tensor_value
from xnnguard.report import Rule
from xnnguard.rules.rule import Effect, RuleCheck, Scope

if TYPE_CHECKING:
    from torch.fx import Node

__all__ = ["RULE", "no_xnnpack_equivalent"]

_GATHERS = frozenset({"index", "index_select", "gather", "embedding", "take"})
_EXPANDS = frozenset({"expand", "expand_copy"})


def _integer(dtype: object) -> bool:
    import torch

    return dtype in (torch.int64, torch.int32, torch.int16, torch.bool)


def no_xnnpack_equivalent(node: Node) -> str | None:
    """Why no XNNPACK node type computes what ``node`` does, or None when some could."""
    value = tensor_value(node)
    if value is not None and _integer(value.dtype):
        name = str(value.dtype).removeprefix("torch.")
        return f"computes {'a' if name == 'bool' else 'an'} {name} tensor: XNNPACK takes no integer tensors"
    if is_op(node, _GATHERS):
        indices = [arg for arg in node.all_input_nodes if (v := tensor_value(arg)) is not None and _integer(v.dtype)]
        if indices:
            return (
                f"gathers by {indices[0].name}, which the program computes or reads as input: XNNPACK has no "
                "gather (a gather by constant indices would have been folded at export)"
            )
    source = tensor_value(node.all_input_nodes[0]) if is_op(node, _EXPANDS) and node.all_input_nodes else None
    dim = dynamic_broadcast_dim(source.shape, value.shape) if source is not None and value is not None else None
    if dim is not None:
        return (
            f"broadcasts {node.all_input_nodes[0].name} along dim {dim}, whose size is known only at run time: "
            "XNNPACK has no broadcast node, and its elementwise ops take a run-time size only from an input of it"
        )
    return None


RULE = RuleCheck(
    Rule.NO_XNNPACK_EQUIVALENT,
    Scope.EXPLANATION,
    "integer tensors, gathers by run-time indices and broadcasts to a run-time size have no XNNPACK node",
    lambda node, _context: no_xnnpack_equivalent(node),
    Effect.EXPLAIN,
)
