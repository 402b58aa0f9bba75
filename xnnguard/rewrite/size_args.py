"""ATen's size arguments (stride, padding, dilation, kernel_size...) spelled out per dim, and the pooling
window arithmetic read from them.

ATen takes one value for every dim, one per dim, or an empty list meaning "the default" (a pooling's
stride is then its kernel size); the 2-D and 3-D rewrites read them all through ``pair`` and ``triple``.
``pooled_length`` is PyTorch's pooling output length along one dim, ceil mode included, and
``ceil_extra`` the zeros that give a floor-mode pooling the ceil-mode windows.
"""

from __future__ import annotations

__all__ = ["Pair", "Triple", "ceil_extra", "pair", "pooled_length", "triple"]

Pair = tuple[int, int]
Triple = tuple[int, int, int]


def _per_dim(value: object, dims: int, default: tuple[int, ...] | None) -> tuple[int, ...]:
    if isinstance(value, (list, tuple)) and len(value) == 0 and default is not None:
        return default
    values = [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]  # type: ignore[call-overload]
    return (values[0],) * dims if len(values) == 1 else tuple(values[:dims])


def pair(value: object, default: Pair | None = None) -> Pair:
    """``value`` as (height, width); ``default`` when it is an empty list."""
    return _per_dim(value, 2, default)  # type: ignore[return-value]


def triple(value: object, default: Triple | None = None) -> Triple:
    """``value`` as (depth, height, width); ``default`` when it is an empty list."""
    return _per_dim(value, 3, default)  # type: ignore[return-value]


def pooled_length(size: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output length along a dim of ``size`` (a ceil-mode window must start inside the
    input or its left padding)."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


def ceil_extra(size: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> int:
    """Zeros to append along a dim of ``size`` so that a floor-mode pooling has the ceil-mode windows."""
    out = pooled_length(size, kernel, stride, padding, dilation, ceil_mode)
    return max(0, (out - 1) * stride + dilation * (kernel - 1) + 1 - (size + 2 * padding))
