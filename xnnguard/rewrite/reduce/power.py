"""Small constant powers as the multiplies, roots and divisions XNNPACK runs.

Invariant established: no float32 or float16 ``pow(x, n)`` with a constant ``n`` in {2.0, 3, 4, -1, -2, 0.5, -0.5}
is left (``n`` an int or a float of that value) except ``pow(x, 2)`` with an int 2, which XNNPACK 1.5.1
takes itself as a square. Its ``PowConfig`` takes the int 2 only, so ``x ** 2.0`` (what ``x.pow(2.0)``,
``x ** 2.`` and many hand-written RMS norms and variances write) and any other power ran on portable
kernels between two delegates.

The forms are PyTorch's own for these exponents (``pow_tensor_scalar_optimized_kernel``): ``x*x``,
``x*x*x``, ``sqrt``, ``rsqrt``, ``1/x``, ``1/(x*x)``, so they are exact; ``x**4`` is ``(x*x)*(x*x)``,
two roundings where ``pow`` has one (within a float32 ulp or two).

int8: the stock XNNPACK quantizer leaves ``pow`` float; its pieces stay float (a quantized ``mul`` would
round where ``pow`` does not).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from xnnguard.graph.shapes import tensor_value
from xnnguard.rewrite.dtypes import rewritten_float
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import high_rank, user_kept_out

__all__ = ["RewritePowerPass"]

_aten = torch.ops.aten


def _square(x: torch.Tensor) -> torch.Tensor:
    return x * x


_FORMS: dict[float, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    2.0: lambda x, one: x * x,
    3.0: lambda x, one: x * x * x,
    4.0: lambda x, one: _square(_square(x)),
    0.5: lambda x, one: torch.sqrt(x),
    -0.5: lambda x, one: torch.rsqrt(x),
    -1.0: lambda x, one: torch.div(one, x),
    -2.0: lambda x, one: torch.div(one, x * x),
}


def _exponent(node: torch.fx.Node) -> float | None:
    """The constant exponent of ``pow(x, n)``, when it is one with a form here and XNNPACK does not take it."""
    n = node.args[1] if len(node.args) > 1 else node.kwargs.get("exponent")
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        return None
    if isinstance(n, int) and n == 2:
        return None  # XNNPACK's square
    return float(n) if float(n) in _FORMS else None


class RewritePowerPass(NodeRewritePass):
    """Replaces ``pow(x, n)`` for the small constant ``n`` above by multiplies, a root or a division."""

    subject = "power"
    pieces_stay_float = True  # the XNNPACK quantizer leaves pow float
    # rule None: a power with another exponent runs on portable kernels; nothing fails

    def picks(self, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node.target is not _aten.pow.Tensor_Scalar:
            return False
        if user_kept_out(node) or high_rank(node) or _exponent(node) is None:
            return False
        x, out = tensor_value(node.args[0]), tensor_value(node)
        return x is not None and out is not None and x.dtype == out.dtype and rewritten_float(x.dtype)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        exponent = _exponent(node)
        assert exponent is not None
        form = _FORMS[exponent]
        x = node.args[0]
        assert isinstance(x, torch.fx.Node)
        inputs: list[torch.fx.Node | torch.Tensor] = [x]
        if exponent < -0.5:
            inputs.append(torch.ones(1, dtype=x.meta["val"].dtype))  # the numerator: a constant XNNPACK reads
            output = splice_before(graph_module, node, form, inputs)
        else:
            output = splice_before(graph_module, node, lambda x_: form(x_, x_), inputs)
        node.replace_all_uses_with(output)
        return None
