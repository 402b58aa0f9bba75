"""A slice that keeps a whole dim is its input: dropped.

``x[:, 0, :, :]`` records a slice for a ``:`` unless PyTorch can prove at trace time that it keeps the
whole dim. Exported with ``Dim.DYNAMIC(min=..., max=...)``, a dim is traced with no upper bound (the
bounds narrow the range only after tracing), so ``s <= INT64_MAX`` is not provable and every ``:`` over
it stays as ``slice(x, d, 0, INT64_MAX)``; with a named ``Dim`` (a finite max) it is elided. ExecuTorch
1.5.1's ``SliceCopyConfig`` refuses any slice with a symbolic dim, so each such identity ran on the
portable kernel between two delegates: Wan's temporal upsampling (``torch.stack((x[:, 0, :, :, :, :],
x[:, 1, :, :, :, :]), 3)``) cut the Wan VAE decoder, exported with a dynamic frame count as the
benchmark does, into 3 delegates.

``WholeSlicePass`` replaces a slice with start 0 (or None), step 1 and a result of its input's size in
every dim by its input. Left as it was: a slice a graph output reads (the output would become another
node, maybe an input).
"""

from __future__ import annotations

import torch

from xnnguard.graph.ops import is_op
from xnnguard.graph.shapes import same_size, tensor_value
from xnnguard.rewrite.node_rewrite import IdentityPass

__all__ = ["WholeSlicePass", "is_whole_slice"]

_DEFAULTS = {"dim": 0, "start": None, "end": None, "step": 1}


def is_whole_slice(node: torch.fx.Node) -> bool:
    """True for ``slice(x, d, 0, end, 1)`` whose result has ``x``'s sizes (symbolic ones the same symbols),
    read by no graph output."""
    if not is_op(node, frozenset({"slice", "slice_copy"}), "Tensor") or not node.args:
        return False
    before, after = tensor_value(node.args[0]), tensor_value(node)
    if before is None or after is None or before.dim() != after.dim():
        return False
    given = dict(zip(_DEFAULTS, node.args[1:], strict=False)) | dict(node.kwargs)
    bounds = _DEFAULTS | given
    if bounds["start"] not in (None, 0) or bounds["step"] not in (None, 1):
        return False
    if not all(same_size(a, b) for a, b in zip(before.shape, after.shape, strict=True)):
        return False
    return not any(user.op == "output" for user in node.users)


class WholeSlicePass(IdentityPass):
    """Replaces ``slice(x, d, 0, INT64_MAX)`` (any slice that keeps all of ``x``) by ``x``."""

    subject = "slice that keeps its whole input"

    def picks(self, node: torch.fx.Node) -> bool:
        return is_whole_slice(node)
