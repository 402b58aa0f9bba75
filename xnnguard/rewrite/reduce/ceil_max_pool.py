"""A ceil-mode 2-D max pooling XNNPACK refuses as an explicit ``-inf`` pad and a floor-mode pooling.

Invariant established: no ``max_pool2d`` (or ``max_pool2d_with_indices`` whose indices nobody reads) in
ceil mode over a static (H, W) of a tensor with a dynamic dim (a dynamic batch), or with a stride above
its kernel, is left. ExecuTorch 1.5.1's ``MaxPool2dConfig`` writes ceil mode as padding it computes from
static shapes, and refuses it under any dynamic dim: the pooling ran on portable kernels between two
delegates (fuzz seeds 159, 163 and 196 with a dynamic batch; a 3-D max pooling in ceil mode, whose 2-D
stages keep it, too). A stride above the kernel it refuses in any mode; the floor-mode pooling this pass
leaves is then ``strided_max_pool``'s (fuzz seed 263: ``MaxPool2d((1, 2), stride=2, ceil_mode=True)``).

The form: the ceil-mode windows past the input's end, padded with ``-inf`` (``size_args.ceil_extra``),
then the same pooling in floor mode. Exact: a ceil-mode window starts inside the input or its left
padding, so each holds an element of the input, and ``-inf`` is never its maximum. A ceil mode that adds
no window is just dropped. int8: the pad quantizes ``-inf`` to the grid's lowest value, again never a
window's maximum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import user_kept_out
from xnnguard.rewrite.reduce.max_pool2d import POOLS, MaxPool2d, pooled_input, replace_pooling
from xnnguard.rewrite.size_args import Pair, ceil_extra

__all__ = ["RewriteCeilMaxPool2dPass", "ceil_max_pool2d"]

def ceil_max_pool2d(x: torch.Tensor, kernel: Pair, stride: Pair, padding: Pair, dilation: Pair) -> torch.Tensor:
    """``F.max_pool2d(x, ..., ceil_mode=True)`` of a 4-D ``x`` with a static (H, W), in floor mode."""
    extra = [ceil_extra(int(x.shape[2 + d]), kernel[d], stride[d], padding[d], dilation[d], True) for d in (0, 1)]
    if any(extra):
        x = F.pad(x, (0, extra[1], 0, extra[0]), value=float("-inf"))
    return F.max_pool2d(x, kernel, stride, padding, dilation)


def _has_dynamic_dim(value: torch.Tensor) -> bool:
    return not all(isinstance(size, int) for size in value.shape)


class RewriteCeilMaxPool2dPass(NodeRewritePass):
    """Replaces each ceil-mode 2-D max pooling XNNPACK refuses by a pad and a floor-mode one."""

    rule = Rule.NOT_REWRITTEN
    tags_what_it_leaves = False  # the partitioner decides about what is left
    subject = "ceil-mode 2-D max pooling (under dynamic shapes, or with a stride above its kernel)"

    def picks(self, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node.target not in POOLS or user_kept_out(node):
            return False
        value, pool = tensor_value(node.args[0]), MaxPool2d.of(node)
        if not pool.ceil_mode or value is None:
            return False
        return _has_dynamic_dim(value) or any(s > k for s, k in zip(pool.stride, pool.kernel))

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        pooled = pooled_input(node)
        if isinstance(pooled, str):
            return pooled
        if not all(isinstance(size, int) for size in pooled.value.shape[2:]):
            return "a dynamic height or width: which ceil-mode windows exist depends on it"
        pool = MaxPool2d.of(node)
        replace_pooling(graph_module, node, pooled,
                        lambda x: ceil_max_pool2d(x, pool.kernel, pool.stride, pool.padding, pool.dilation))
        return None
