"""A 2-D average pooling 1.5.1's XNNPACK config refuses, as one it takes times a constant divisor ratio.

Invariant established: no ``avg_pool2d`` over static (H, W) with ``ceil_mode``, with
``count_include_pad`` and a padding, or with a ``divisor_override`` other than the window's size is left.
ExecuTorch 1.5.1's ``AvgPoolingConfig`` refuses all three, so the pooling ran on portable kernels and cut
the program in two (fuzz seeds 142, 152, 155, 163 and 166; stock too).

XNNPACK's average pooling sums a window and divides by the number of input elements it covers (its own
padding is not counted). The form: the zeros a ceil-mode window reaches past the input appended after H
and W (``F.pad``), the pooling 1.5.1 takes (the same kernel, stride and padding, ``count_include_pad=False``,
floor mode), then a multiply by ``ratio = reference(ones) / form(ones)``, measured once in float64 on a
tensor of ones: both divide the same window sum, so the ratio of their divisors does not depend on the
input. Nothing multiplies where the ratio is 1 everywhere; a number where it is one number; else a
constant (H_out, W_out) map. Exact up to one rounding (the multiply).

int8: the stock XNNPACK quantizer leaves ``avg_pool2d`` float, so the pieces stay float.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from xnnguard.graph.args import schema_arguments
from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import user_kept_out
from xnnguard.rewrite.size_args import Pair, ceil_extra, pair

__all__ = ["AvgPool2d", "RewriteAvgPool2dPass", "avg_pool2d_form"]

_aten = torch.ops.aten


@dataclass(frozen=True)
class AvgPool2d:
    """One ``avg_pool2d``, normalized: every argument spelled out per dim, over a static (H, W)."""

    size: Pair
    kernel: Pair
    stride: Pair
    padding: Pair
    ceil_mode: bool = False
    count_include_pad: bool = True
    divisor_override: int | None = None

    @classmethod
    def of(cls, node: torch.fx.Node) -> AvgPool2d | None:
        """The pooling ``node`` computes, or None when it is not an ``avg_pool2d`` over a static (H, W)."""
        if node.op != "call_function" or node.target is not _aten.avg_pool2d.default:
            return None
        x = tensor_value(node.args[0])
        arguments = schema_arguments(node)
        if x is None or arguments is None or x.dim() not in (3, 4):
            return None
        size = tuple(x.shape[-2:])
        if not all(isinstance(s, int) for s in size):
            return None
        kernel = pair(arguments["kernel_size"])
        divisor = arguments.get("divisor_override")
        return cls(
            size=(int(size[0]), int(size[1])),
            kernel=kernel,
            stride=pair(arguments.get("stride", []), default=kernel),
            padding=pair(arguments.get("padding", 0)),
            ceil_mode=bool(arguments.get("ceil_mode", False)),
            count_include_pad=bool(arguments.get("count_include_pad", True)),
            divisor_override=divisor if isinstance(divisor, int) else None,
        )

    def refused(self) -> bool:
        """What 1.5.1's ``AvgPoolingConfig`` refuses: ceil mode, a counted padding, another divisor."""
        counted_padding = self.count_include_pad and any(self.padding)
        other_divisor = self.divisor_override not in (None, self.kernel[0] * self.kernel[1])
        return self.ceil_mode or counted_padding or other_divisor

    def ceil_extra(self, dim: int) -> int:
        """Zeros to append along spatial ``dim`` (0 = H) so that floor mode has the ceil-mode windows."""
        return ceil_extra(self.size[dim], self.kernel[dim], self.stride[dim], self.padding[dim], 1, self.ceil_mode)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(
            x, self.kernel, self.stride, self.padding, self.ceil_mode, self.count_include_pad, self.divisor_override
        )

    def taken(self, x: torch.Tensor) -> torch.Tensor:
        """The pooling 1.5.1 takes, over ``x`` with the ceil-mode zeros appended (no divisor correction)."""
        extra_h, extra_w = self.ceil_extra(0), self.ceil_extra(1)
        if extra_h or extra_w:
            x = F.pad(x, (0, extra_w, 0, extra_h))
        return F.avg_pool2d(x, self.kernel, self.stride, self.padding, ceil_mode=False, count_include_pad=False)

    def ratio(self) -> torch.Tensor | float | None:
        """What multiplies ``taken`` into ``reference``: None (nothing), a number or an (H_out, W_out) map."""
        ones = torch.ones(1, 1, *self.size, dtype=torch.float64)
        ratio = (self.reference(ones) / self.taken(ones))[0, 0]
        if torch.allclose(ratio, torch.ones_like(ratio), rtol=0, atol=1e-12):
            return None
        first = float(ratio.flatten()[0])
        if torch.allclose(ratio, torch.full_like(ratio, first), rtol=0, atol=1e-12):
            return first
        return ratio  # float64: the rewrite casts it to the graph's dtype


def avg_pool2d_form(x: torch.Tensor, pool: AvgPool2d, ratio: torch.Tensor | float | None) -> torch.Tensor:
    """``pool`` of ``x`` as XNNPACK's average pooling times ``ratio`` (``pool.ratio()``; traced by the rewrite)."""
    y = pool.taken(x)
    return y if ratio is None else y * ratio


class RewriteAvgPool2dPass(NodeRewritePass):
    """Replaces each ``avg_pool2d`` 1.5.1 refuses by a zero pad, a pooling it takes and a multiply."""

    rule = Rule.NOT_REWRITTEN
    subject = "2-D average pooling"
    pieces_stay_float = True  # the XNNPACK quantizer leaves avg_pool2d float

    def picks(self, node: torch.fx.Node) -> bool:
        pool = AvgPool2d.of(node)
        return pool is not None and pool.refused() and not user_kept_out(node)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        pool = AvgPool2d.of(node)
        assert pool is not None
        x = node.args[0]
        assert isinstance(x, torch.fx.Node)
        ratio = pool.ratio()
        if isinstance(ratio, torch.Tensor):  # a constant in the graph's dtype: no conversion in the program

            def replacement(x_: torch.Tensor, map_: torch.Tensor) -> torch.Tensor:
                return avg_pool2d_form(x_, pool, map_)

            output = splice_before(graph_module, node, replacement, [x, ratio.to(x.meta["val"].dtype)])
        else:
            output = splice_before(graph_module, node, lambda x_: avg_pool2d_form(x_, pool, ratio), [x])
        node.replace_all_uses_with(output)
        return None
