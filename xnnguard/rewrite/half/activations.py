"""A float16 SiLU or hardsigmoid as the float16 ops it is, not the float32 ones ``to_edge`` decomposes it into.

Invariant established: no float16 ``silu`` or ``hardsigmoid`` within XNNPACK's rank limit is left.
ExecuTorch has no XNNPACK config that keeps either whole, and ``to_edge`` decomposes them with PyTorch's
reference implementations, which compute a float16 op in float32: ``_to_copy`` to float32, the
elementwise ops, ``_to_copy`` back. No XNNPACK config takes a dtype conversion, so every SiLU of a video
VAE's residual blocks cut its delegate twice (the test-size VAE: 23 delegates in float16, 1 in float32).

The forms are the decompositions' own, in float16: ``x * sigmoid(x)``, and ``clamp(x / 6 + 1/2, 0, 1)``
(``hardtanh``). Each op rounds to float16 where the decomposition rounds once at the end: within a
float16 step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from xnnguard.graph.shapes import tensor_value
from xnnguard.rewrite.dtypes import is_half
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import high_rank, user_kept_out

__all__ = ["RewriteHalfActivationsPass"]

_aten = torch.ops.aten

_FORMS: dict[object, Callable[[torch.Tensor], torch.Tensor]] = {
    _aten.silu.default: lambda x: x * torch.sigmoid(x),
    _aten.hardsigmoid.default: lambda x: torch.clamp(x * (1.0 / 6.0) + 0.5, 0.0, 1.0),
}


class RewriteHalfActivationsPass(NodeRewritePass):
    """Replaces each float16 SiLU and hardsigmoid by its decomposition in float16 ops."""

    subject = "float16 activation"
    # rule None: every activation it picks it rewrites

    def picks(self, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node.target not in _FORMS or user_kept_out(node) or high_rank(node):
            return False
        x = tensor_value(node.args[0])
        return x is not None and is_half(x.dtype)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        x = node.args[0]
        assert isinstance(x, torch.fx.Node)
        node.replace_all_uses_with(splice_before(graph_module, node, _FORMS[node.target], [x]))
        return None
