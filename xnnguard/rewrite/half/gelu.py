"""A float16 GELU as ``x * sigmoid(2c * (x + 0.044715 x^3))``, ops XNNPACK runs in float16.

Invariant established: no float16 ``gelu`` within XNNPACK's rank limit is left. ExecuTorch 1.4 and 1.5's
``GeluConfig`` refuses float16 ("XNNPACK does not support GELU for fp16", ExecuTorch #16680: the XNNPACK
it pinned then lacked the kernel; #16679 tracks taking it again), so each transformer MLP ran its GELU
on a portable kernel between two delegates. XNNPACK's own float16 GELU kernel is not taken instead:
on x86 it is a scalar rational approximation 3e-3 from the exact GELU near 2.6, more than this form.

The form is the tanh GELU (``0.5 x (1 + tanh(z)) = x * sigmoid(2z)``, ``z = c (x + 0.044715 x^3)``,
``c = sqrt(2/pi)``): for ``approximate="tanh"`` it is that op; for the erf GELU it differs from it by at
most 4.7e-4 (at x = -2.7), below half a float16 step at 1 (4.9e-4) and below what the float16 roundings of
the form's own six ops add (measured on XNNPACK: at most 2e-3 from the exact erf GELU, one float16 step
at 2.5; PyTorch's float16 GELU, computed in float32, is at most 1e-3 from it). It is never used in
float32, where XNNPACK takes GELU itself and 4.7e-4 would be far above rounding.
"""

from __future__ import annotations

import math

import torch

from xnnguard.graph.shapes import tensor_value
from xnnguard.rewrite.dtypes import is_half
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import high_rank, user_kept_out

__all__ = ["RewriteHalfGeluPass", "tanh_gelu"]

_aten = torch.ops.aten
_TWICE_C = 2.0 * math.sqrt(2.0 / math.pi)
_CUBIC = 0.044715


def tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    """The tanh GELU as ``x * sigmoid(2c (x + 0.044715 x^3))``: mul, mul, add, mul, sigmoid, mul."""
    return x * torch.sigmoid(x * (_TWICE_C + (_TWICE_C * _CUBIC) * (x * x)))


class RewriteHalfGeluPass(NodeRewritePass):
    """Replaces each float16 GELU by the tanh form written with multiplies, an add and a sigmoid."""

    subject = "float16 GELU"
    # rule None: a GELU it does not pick (float32) is XNNPACK's own; every one it picks it rewrites

    def picks(self, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node.target is not _aten.gelu.default:
            return False
        if user_kept_out(node) or high_rank(node):
            return False
        x = tensor_value(node.args[0])
        return x is not None and is_half(x.dtype)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        x = node.args[0]
        assert isinstance(x, torch.fx.Node)
        node.replace_all_uses_with(splice_before(graph_module, node, tanh_gelu, [x]))
        return None
