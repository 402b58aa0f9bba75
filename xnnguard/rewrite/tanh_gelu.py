"""A float32 tanh GELU as ``x * sigmoid(2c * (x + 0.044715 x^3))``, the ops XNNPACK computes it right with.

Invariant established: no float32 ``gelu(approximate="tanh")`` within XNNPACK's rank limit is left.
ExecuTorch 1.5.1's ``GeluConfig`` takes every float32 ``gelu`` and its ``GeluVisitor`` serializes an
``XNNGelu`` node without the ``approximate`` argument, so XNNPACK computes the erf GELU in its place:
up to 4.7e-4 off (at x = -2.7; fuzz seed 100, stock too), a hundred times float32 rounding. The form is
the tanh GELU itself (``0.5 x (1 + tanh(z)) = x * sigmoid(2z)``, ``z = c (x + 0.044715 x^3)``), as a
float16 GELU is written (``xnnguard.rewrite.half.gelu``); an erf GELU is XNNPACK's own and stays. A
tanh GELU this leaves is kept from XNNPACK by ``xnnguard.rules.tanh_gelu``.
int8: the stock XNNPACK quantizer leaves a GELU float, so the pieces stay float.
"""

from __future__ import annotations

import torch

from xnnguard.graph.shapes import tensor_value
from xnnguard.rewrite.half.gelu import tanh_gelu
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import high_rank, user_kept_out
from xnnguard.rules.tanh_gelu import is_tanh_gelu

__all__ = ["RewriteTanhGeluPass"]


class RewriteTanhGeluPass(NodeRewritePass):
    """Replaces each float32 tanh GELU by its form written with multiplies, an add and a sigmoid."""

    subject = "float32 tanh GELU"
    pieces_stay_float = True  # the XNNPACK quantizer leaves a GELU float
    # rule None: every one it picks it rewrites; a float16 one is RewriteHalfGeluPass's

    def picks(self, node: torch.fx.Node) -> bool:
        if not is_tanh_gelu(node) or user_kept_out(node) or high_rank(node):
            return False
        x = tensor_value(node.args[0])
        return x is not None and x.dtype == torch.float32

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        x = node.args[0]
        assert isinstance(x, torch.fx.Node)
        node.replace_all_uses_with(splice_before(graph_module, node, tanh_gelu, [x]))
        return None
