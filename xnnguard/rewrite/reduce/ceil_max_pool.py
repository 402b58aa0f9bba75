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

from xnnguard.graph.args import schema_arguments
from xnnguard.graph.ops import values_only_users
from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import user_kept_out
from xnnguard.rewrite.size_args import Pair, ceil_extra, pair

__all__ = ["RewriteCeilMaxPool2dPass", "ceil_max_pool2d"]

_aten = torch.ops.aten
_POOLS = {_aten.max_pool2d.default, _aten.max_pool2d_with_indices.default}


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
        if node.op != "call_function" or node.target not in _POOLS or user_kept_out(node):
            return False
        value = tensor_value(node.args[0])
        arguments = schema_arguments(node) or {}
        if not bool(arguments.get("ceil_mode", False)) or value is None:
            return False
        kernel = pair(arguments.get("kernel_size"))
        stride = pair(arguments.get("stride", []), default=kernel)
        return _has_dynamic_dim(value) or any(s > k for s, k in zip(stride, kernel))

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        users = values_only_users(node) if node.target is _aten.max_pool2d_with_indices.default else [node]
        if users is None:
            return "its indices are used"
        x = node.args[0]
        value = tensor_value(x)
        if not isinstance(x, torch.fx.Node) or value is None or value.dim() != 4:
            return "its input is not a 4-D tensor"
        if not all(isinstance(size, int) for size in value.shape[2:]):
            return "a dynamic height or width: which ceil-mode windows exist depends on it"
        arguments = schema_arguments(node) or {}
        kernel = pair(arguments.get("kernel_size"))
        stride = pair(arguments.get("stride", []), default=kernel)
        padding, dilation = pair(arguments.get("padding", 0)), pair(arguments.get("dilation", 1))
        output = splice_before(
            graph_module, node, lambda x_: ceil_max_pool2d(x_, kernel, stride, padding, dilation), [x]
        )
        for user in users:
            user.replace_all_uses_with(output)
            if user is not node:
                graph_module.graph.erase_node(user)
        return None
