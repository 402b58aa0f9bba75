"""An implicit quantize/dequantize belongs to the partition of its op.

XNNPACK folds a q/dq that is marked implicit into the op next to it and emits nothing for the q/dq
itself. ExecuTorch 1.5.1's configs set that mark while they merely *check* an op, and the mark stays
when the op is then rejected (a 3-D conv, a conv whose output is not quantized): the q/dq lands in a
delegate that skips it, leaving a value nothing writes. Here a mark is only a proposal: it is taken
off right after each check and put back only once the partition of its op is really taken.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from executorch.backends.xnnpack.utils.quant_utils import (
    IS_IMPLICIT_Q_DQ_TAG,
    is_dequant,
    is_qparam,
    is_quant,
    tag_as_implicit_q_dq,
)

__all__ = ["is_quantization_node", "mark_implicit", "quantization_nodes", "take_marks"]


def is_quantization_node(node: torch.fx.Node) -> bool:
    """A quantize, dequantize or choose_qparams node: the ones a quantized op cannot live without."""
    return is_quant(node) or is_dequant(node) or is_qparam(node)


def quantization_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """Every q/dq node of ``graph``: the only nodes a config ever marks implicit."""
    return [n for n in graph.nodes if n.op == "call_function" and (is_quant(n) or is_dequant(n))]


def take_marks(nodes: Iterable[torch.fx.Node]) -> set[torch.fx.Node]:
    """Remove the implicit mark from ``nodes`` and return the ones that had it."""
    marked = set()
    for node in nodes:
        if node.meta.pop(IS_IMPLICIT_Q_DQ_TAG, False):
            marked.add(node)
    return marked


def mark_implicit(node: torch.fx.Node) -> None:
    """Mark ``node`` implicit: only for a q/dq in the same taken partition as its op."""
    tag_as_implicit_q_dq(node)
