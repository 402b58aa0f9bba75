"""Give a 2-D convolution's input a ``cat`` as producer, so 1.5.1 can lower it dynamically quantized.

For a dynamically quantized conv, 1.5.1's ``ChannelsLastTaggedReshapePass`` looks for the tensor to
convert to NHWC by walking up from the conv's input through every op whose first argument is a tensor,
and stops only at an op whose first argument is not (a ``cat``, whose first argument is a list) or at a
graph input. Behind a view or permute chain it walks past the real input to the 5-D model input and
fails ("required rank 4 tensor to use channels_last format"). A conv input built by a ``cat`` along a
dimension of the 4-D tensor itself stops the walk on the right tensor. The rewrites use this where their
conv input would otherwise come from a view; it costs one copy of that input.
"""

from __future__ import annotations

import torch

__all__ = ["as_cat", "cat_dim"]


def as_cat(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself, produced by a ``cat`` of its two halves along its longest static dim.

    A dynamic dim (a batch) is never cut: xnnguard's partitioner delegates a slice that keeps it whole
    (``xnnguard.partition.symbolic_slice``), and a tensor with no static dim is returned as it is.
    """
    dim = cat_dim(x.shape)
    if dim is None:
        return x
    size = int(x.shape[dim])
    half = size // 2
    # Slices, not ``narrow``: the XNNPACK quantizer gives a slice its input's qparams and leaves a narrow
    # unannotated, whose output then gets the cat's own; XNNPACK does not take a quantized slice whose
    # input and output qparams differ, so static int8 would split the delegate at every such cat.
    # aten.slice itself: indexing would add a no-op slice of every dim before ``dim``, the batch's too.
    halves = [torch.ops.aten.slice.Tensor(x, dim, 0, half), torch.ops.aten.slice.Tensor(x, dim, half, size)]
    return torch.cat(halves, dim)


def cat_dim(shape: torch.Size) -> int | None:
    """The dim to cut a tensor of ``shape`` along for ``as_cat``: its longest static one, None if all are < 2."""
    static = [d for d in range(len(shape)) if isinstance(shape[d], int)]
    if not static:
        return None
    dim = max(static, key=lambda d: int(shape[d]))
    return dim if int(shape[dim]) >= 2 else None
