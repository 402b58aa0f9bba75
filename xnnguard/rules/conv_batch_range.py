"""A float32 2-D convolution over a dynamic batch loses part of that batch's range while it is lowered.

This module is the one place that rule lives. ATen's backend choice for a float32 NCHW convolution
with stride 1 and no dilation asks whether the batch is at least 16 (``use_nnpack`` in
``aten/src/ATen/native/Convolution.cpp``, which also wants a kernel under 17 and padding under the
kernel; at 12x12 inputs the guard came through a plain ``guard_bool`` of that choice too, so more than
NNPACK's check asks it). FakeTensor's convolution asks that choice, only to pick its
output's memory format, whenever the sizes have hints; on a dynamic batch ``batch >= 16`` is then a
guard, decided by the example's batch. The conditions below are the ones
``tests/test_dynamic_ranges.py`` checks against what lowering does. ExecuTorch traces every convolution
again after export (XNNPACK's ``ChannelsLastTaggedReshapePass`` in ``preprocess``, the delegate call's
fake kernel in ``to_executorch``), and that guard narrows the range the input buffers are planned for:
an example batch under 16 caps the program at 15 (``Error resizing tensor at input 0`` above it). An
example at 16 or more raises the lower bound instead, which the runtime does not check.

Frames folded into the batch (a video VAE's per-frame convolutions) count as a batch here.
``xnnguard.keep_dynamic_ranges`` lowers without the guard; the partitioner warns when it is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from xnnguard.graph.ops import is_op
from xnnguard.graph.shapes import tensor_value

if TYPE_CHECKING:
    import torch

__all__ = ["NNPACK_MIN_BATCH", "batch_range_narrowed_by"]

NNPACK_MIN_BATCH = 16  # ATen's use_nnpack: "ensure large enough batch size to ensure perf"
_NNPACK_MAX_KERNEL = 16


def batch_range_narrowed_by(node: torch.fx.Node) -> str | None:
    """How lowering will narrow the range of ``node``'s dynamic batch, or None when it will not.

    ``node`` is a convolution (``aten.convolution`` in any dialect); anything else is None.
    """
    import torch

    if not is_op(node, "convolution", "default") or len(node.args) < 9:
        return None
    value, weight = tensor_value(node.args[0]), tensor_value(node.args[1])
    stride, padding, dilation = (list(cast("Sequence[int]", node.args[i])) for i in (3, 4, 5))
    if value is None or weight is None or value.dtype != torch.float32 or value.dim() != 4 or weight.dim() != 4:
        return None
    if node.args[6] or any(s != 1 for s in stride) or any(d != 1 for d in dilation):  # transposed, strided, dilated
        return None
    kernel = weight.shape[2:]
    if any(k > _NNPACK_MAX_KERNEL for k in kernel) or any(p >= k for p, k in zip(padding, kernel)):
        return None
    batch = value.shape[0]
    if not isinstance(batch, torch.SymInt) or not torch.backends.nnpack.is_available():
        return None
    hint = batch.node.hint
    bounds = batch.node.shape_env.bound_sympy(batch.node.expr)
    if hint is None or hint >= NNPACK_MIN_BATCH or not bounds.upper.is_finite or bounds.upper < NNPACK_MIN_BATCH:
        return None  # an unbounded range is planned at the example's size anyway
    return (
        f"its batch {batch.node.expr} (range {bounds.lower}..{bounds.upper}, {hint} in the example) will be "
        f"capped below {NNPACK_MIN_BATCH}: FakeTensor's convolution guards on ATen's NNPACK batch size when "
        f"ExecuTorch traces it again"
    )
