"""ATen's 3-D size arguments (stride, padding, dilation, kernel_size...) spelled out per dim.

ATen takes one value for every dim, one per dim, or an empty list meaning "the default" (a pooling's
stride is then its kernel size); the 3-D rewrites read them all through ``triple``.
"""

from __future__ import annotations

__all__ = ["Triple", "triple"]

Triple = tuple[int, int, int]


def triple(value: object, default: Triple | None = None) -> Triple:
    """``value`` as (depth, height, width); ``default`` when it is an empty list."""
    if isinstance(value, (list, tuple)) and len(value) == 0 and default is not None:
        return default
    values = [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]  # type: ignore[call-overload]
    return (values[0],) * 3 if len(values) == 1 else (values[0], values[1], values[2])
