"""Run every inference batch norm on a 5-D tensor on its 4-D view (N, C, D*H, W).

Invariant established: no inference batch norm with a 5-D input of static C, D, H, W is left (a dynamic
batch is kept, as -1 in both views). XNNPACK 1.5.1 takes a
batch norm only on 2-4 dims (it decomposes it, or fuses it into a 2-D conv), so a BatchNorm3d that
``FoldBatchNorm3dPass`` could not fold into a conv (after a pooling, an add, a concat) would stay on
portable kernels. A batch norm normalizes per channel (dim 1), so merging depth and height changes
nothing it computes.
"""

from __future__ import annotations

import logging
import operator

import torch
import torch.nn.functional as F

from xnnguard.graph.shapes import shape_with_inferred_batch
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass

__all__ = ["RewriteBatchNorm3dPass"]

logger = logging.getLogger("xnnguard.rewrite")

_aten = torch.ops.aten
# op -> (index of momentum, index of eps, index of the "training" flag or None when inference-only)
_BATCH_NORMS = {
    _aten.batch_norm.default: (6, 7, 5),
    _aten._native_batch_norm_legit_no_training.default: (5, 6, None),
}


def _5d_shape(node: torch.fx.Node) -> list[int] | None:
    """``node``'s 5-D shape, -1 for a dynamic batch; None for another rank or another dynamic dim."""
    shape = shape_with_inferred_batch(node)
    return shape if shape is not None and len(shape) == 5 else None


class RewriteBatchNorm3dPass(NodeRewritePass):
    """Replaces ``batch_norm(x5d)`` (eval) by ``batch_norm(x.view(N, C, D*H, W)).view(x.shape)``."""

    pieces_stay_float = True  # the XNNPACK quantizer leaves a batch norm of its own float

    def picks(self, node: torch.fx.Node) -> bool:
        spec = _BATCH_NORMS.get(node.target) if node.op == "call_function" else None  # type: ignore[call-overload]
        if spec is None:
            return False
        _, _, training_index = spec
        if training_index is not None and node.args[training_index]:
            return False
        x = node.args[0]
        if not isinstance(x, torch.fx.Node) or _5d_shape(x) is None:
            return False
        if node.target is _aten.batch_norm.default:
            return True
        return all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        self._rewrite(graph_module, node)
        return None

    @staticmethod
    def _rewrite(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> None:
        momentum_index, eps_index, _ = _BATCH_NORMS[node.target]  # type: ignore[index]
        x, weight, bias, mean, var = node.args[:5]
        momentum, eps = float(node.args[momentum_index]), float(node.args[eps_index])  # type: ignore[arg-type]
        shape = _5d_shape(x)  # type: ignore[arg-type]
        assert shape is not None
        n, c, d, h, w = shape
        present = [value for value in (weight, bias) if value is not None]

        def replacement(
            x_: torch.Tensor, mean_: torch.Tensor, var_: torch.Tensor, *affine: torch.Tensor
        ) -> torch.Tensor:
            weight_ = affine[0] if weight is not None else None
            bias_ = affine[-1] if bias is not None else None
            y = F.batch_norm(x_.reshape(n, c, d * h, w), mean_, var_, weight_, bias_, False, momentum, eps)
            return y.reshape(shape)

        output = splice_before(graph_module, node, replacement, [x, mean, var, *present])  # type: ignore[list-item]
        if node.target is _aten.batch_norm.default:
            node.replace_all_uses_with(output)
        else:
            for user in list(node.users):
                user.replace_all_uses_with(output)
                graph_module.graph.erase_node(user)
        logger.debug("%s: batch norm runs on a 4-D view", node.name)
