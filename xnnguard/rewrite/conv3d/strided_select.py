"""Take every ``step``-th slice along a dim without a strided slice, which XNNPACK 1.5.1 does not take.

A step is taken by viewing ``step`` consecutive slices as one and keeping the first of each (a view and
a unit-step slice, both delegated); a last slice that would read past the end is taken on its own and
concatenated. The 3-D convolution rewrite uses it to pick a tap's input frames, the pooling rewrite to
subsample a stride-1 max pooling when the stride exceeds the kernel.
"""

from __future__ import annotations

import torch

__all__ = ["select_every"]


def select_every(x: torch.Tensor, first: int, step: int, count: int) -> torch.Tensor:
    """``x[:, first : first + step*count : step]`` of ``x`` (A, D, B), built from views and unit-step slices."""
    depth = x.shape[1]
    if step == 1 or count == 1:
        return x if first == 0 and count == depth else x[:, first : first + count]
    if first + step * count > depth:
        head = select_every(x, first, step, count - 1)
        last = first + step * (count - 1)
        return torch.cat([head, x[:, last : last + 1]], 1)
    block = x if first == 0 and step * count == depth else x[:, first : first + step * count]
    inner = x.shape[2]
    return block.reshape(x.shape[0], count, step * inner)[:, :, :inner]
