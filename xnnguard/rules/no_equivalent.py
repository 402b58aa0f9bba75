"""What nothing XNNPACK runs can compute: integer tensors, and gathers by indices the program computes.

The XNNPACK runtime of ExecuTorch 1.5.1 defines floating-point and 8-bit quantized tensors only (int32
holds quantized biases), and none of its node types reads an index tensor: it has no gather, embedding
lookup, comparison or integer arithmetic. So a node that computes an int64, int32, int16 or bool tensor,
or that gathers rows by a tensor known only when the program runs (a graph input such as Qwen2-VL's patch
position ids), stays on portable kernels whatever xnnguard rewrites. A gather by constant indices is
something else: ``xnnguard.rewrite.fold`` computes it at export.

This module is the one place that rule lives; the partitioner's report names such a node under
``Rule.NO_XNNPACK_EQUIVALENT``, so "ops left outside" can tell this floor from work still to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xnnguard.graph.ops import is_op
from xnnguard.graph.shapes import tensor_value

if TYPE_CHECKING:
    import torch

__all__ = ["no_xnnpack_equivalent"]

_GATHERS = frozenset({"index", "index_select", "gather", "embedding", "take"})


def _integer(dtype: object) -> bool:
    import torch

    return dtype in (torch.int64, torch.int32, torch.int16, torch.bool)


def no_xnnpack_equivalent(node: torch.fx.Node) -> str | None:
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
    return None
