"""A 2-D max pooling whose stride exceeds its kernel as a pooling XNNPACK takes and a subsampling.

Invariant established: no ``max_pool2d`` (or ``max_pool2d_with_indices`` whose indices nobody reads) over
a static (H, W) with a stride above its kernel along a dim, in floor mode (or a ceil mode that adds no
window), is left. ExecuTorch 1.5.1's ``MaxPool2dConfig`` refuses a stride above the kernel: the pooling
ran on portable kernels between two delegates (fuzz seed 37: ``F.max_pool2d(x, 1, stride=(2, 1))``, a
subsampling, stock too).

The form: the pooling at the largest stride that divides the stride and fits the kernel (none at all
for a 1 x 1 kernel without padding), whose windows include every window of the original one, then
every (stride / that)-th of them along each dim, taken with views and unit-step slices
(``xnnguard.rewrite.conv3d.strided_select``). Exact: a max is one of its elements, and the kept windows
are the original ones. int8: max pooling and slices share their input's quantization; nothing rounds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xnnguard.report import Rule
from xnnguard.rewrite.conv3d.strided_select import select_every
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import user_kept_out
from xnnguard.rewrite.reduce.max_pool2d import POOLS, MaxPool2d, pooled_input, replace_pooling
from xnnguard.rewrite.size_args import Pair, pooled_length

__all__ = ["RewriteStridedMaxPool2dPass", "strided_max_pool2d"]

def strided_max_pool2d(x: torch.Tensor, kernel: Pair, stride: Pair, padding: Pair, dilation: Pair) -> torch.Tensor:
    """``F.max_pool2d(x, kernel, stride, padding, dilation)`` (floor mode) of a 4-D ``x``, for any stride."""
    pool_stride = tuple(max(t for t in range(1, k + 1) if s % t == 0) for k, s in zip(kernel, stride))
    out = [pooled_length(int(x.shape[2 + d]), kernel[d], stride[d], padding[d], dilation[d], False) for d in (0, 1)]
    trivial = kernel == (1, 1) and padding == (0, 0)
    y = x if trivial else F.max_pool2d(x, kernel, pool_stride, padding, dilation)
    c, h, w = (int(size) for size in y.shape[1:])  # the batch may be dynamic: every reshape infers it
    step_h, step_w = stride[0] // pool_stride[0], stride[1] // pool_stride[1]
    if step_h > 1 or h != out[0]:
        y = select_every(y.reshape(-1, h, w), 0, step_h, out[0]).reshape(-1, c, out[0], w)
    if step_w > 1 or w != out[1]:
        y = select_every(y.reshape(-1, w, 1), 0, step_w, out[1]).reshape(-1, c, out[0], out[1])
    return y


class RewriteStridedMaxPool2dPass(NodeRewritePass):
    """Replaces each 2-D max pooling with a stride above its kernel by a pooling XNNPACK takes and slices."""

    rule = Rule.NOT_REWRITTEN
    tags_what_it_leaves = False  # the partitioner decides about what is left
    subject = "2-D max pooling with a stride above its kernel"

    def picks(self, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node.target not in POOLS or user_kept_out(node):
            return False
        pool = MaxPool2d.of(node)
        return pool.stride[0] > pool.kernel[0] or pool.stride[1] > pool.kernel[1]

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        pooled = pooled_input(node)
        if isinstance(pooled, str):
            return pooled
        if not all(isinstance(size, int) for size in pooled.value.shape[1:]):
            return "a dynamic channel count, height or width"
        pool = MaxPool2d.of(node)
        sizes = [int(pooled.value.shape[2 + d]) for d in (0, 1)]
        if pool.ceil_mode and any(
            pooled_length(sizes[d], pool.kernel[d], pool.stride[d], pool.padding[d], pool.dilation[d], True)
            != pooled_length(sizes[d], pool.kernel[d], pool.stride[d], pool.padding[d], pool.dilation[d], False)
            for d in (0, 1)
        ):
            return "a ceil-mode window past the input"
        replace_pooling(graph_module, node, pooled,
                        lambda x: strided_max_pool2d(x, pool.kernel, pool.stride, pool.padding, pool.dilation))
        return None
