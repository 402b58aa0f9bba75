"""What counts as a constant pad, and a zero pad: ``F.pad`` in the two spellings an ATen graph holds.

A zero pad only moves values and adds zeros, which every affine quantization represents exactly and a
convolution's own padding adds too: the quantizer lets one share its input's quantization
(``xnnguard.quantizer.shared_quantization``) and the 3-D convolution rewrite takes one in front of it
as its padding (``xnnguard.rewrite.conv3d.absorbed_pad``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xnnguard.graph.ops import is_op

if TYPE_CHECKING:
    import torch

__all__ = ["constant_pad", "zero_pad_widths"]


def _argument(node: torch.fx.Node, index: int, name: str, default: object) -> object:
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def constant_pad(node: object) -> tuple[tuple[int, ...], float] | None:
    """``(widths, value)`` of a constant pad with static widths (as ``F.pad`` takes them: the last dim first,
    (before, after) per dim; negative ones crop), else None."""
    if is_op(node, "constant_pad_nd", "default"):
        value = _argument(node, 2, "value", 0)  # type: ignore[arg-type]
    elif is_op(node, "pad", "default"):
        if _argument(node, 2, "mode", "constant") != "constant":  # type: ignore[arg-type]
            return None
        value = _argument(node, 3, "value", None)  # type: ignore[arg-type]
    else:
        return None
    widths = _argument(node, 1, "pad", ())  # type: ignore[arg-type]
    if not isinstance(widths, (list, tuple)) or not all(isinstance(width, int) for width in widths):
        return None
    if value is None:
        value = 0.0
    if not isinstance(value, (int, float)):
        return None
    return tuple(widths), float(value)


def zero_pad_widths(node: object) -> tuple[int, ...] | None:
    """The widths of ``node`` when it is a constant pad with the value 0 and static widths, else None.

    Widths come as ``F.pad`` takes them, last dim first, and may be negative (a crop).
    """
    pad = constant_pad(node)
    return pad[0] if pad is not None and pad[1] == 0 else None
