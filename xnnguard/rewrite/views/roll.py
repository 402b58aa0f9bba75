"""``torch.roll`` by static shifts as a ``cat`` of two slices per rolled dim.

Invariant established: no ``roll`` along dims of static size is left. ``to_edge`` decomposes a roll into
``arange`` + ``fmod`` + ``index_select`` per dim (Swin's shifted windows roll twice per block), none of
which ExecuTorch 1.5.1's XNNPACK partitioner takes.

Why it is exact: rolling a dim of size ``n`` by ``s`` (``0 < s < n`` after ``s % n``) puts the last ``s``
elements first: ``cat([x[n - s:], x[:n - s]])`` along that dim, the same elements moved to the same
places. A roll with no dims (of the flattened tensor) is left as it is.

int8: the stock quantizer leaves ``roll`` float; so are the slices and the ``cat``
(``pieces_stay_float``): a quantized ``cat`` would requantize.
"""

from __future__ import annotations

import torch

from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.views.base import AliasAwarePass, replace_by

__all__ = ["RollAsSlicesPass", "roll_as_slices"]

_aten = torch.ops.aten


def roll_as_slices(x: torch.Tensor, shifts: list[int], dims: list[int]) -> torch.Tensor:
    """``torch.roll(x, shifts, dims)`` with slices and ``cat`` (each rolled dim of static size)."""
    for shift, dim in zip(shifts, dims):
        size = x.shape[dim]
        shift %= size
        if shift:
            head = torch.ops.aten.slice.Tensor(x, dim, size - shift, size)
            x = torch.cat([head, torch.ops.aten.slice.Tensor(x, dim, 0, size - shift)], dim)
    return x


class RollAsSlicesPass(AliasAwarePass):
    """Rewrites each roll along static dims into slices and ``cat``."""

    rule = Rule.NOT_REWRITTEN  # reported; the portable kernels run what is left
    tags_what_it_leaves = False  # untagged: XNNPACK still takes what it can of the op as it is
    subject = "roll"
    pieces_stay_float = True

    def chooses(self, node: torch.fx.Node) -> bool:
        return node.target is _aten.roll.default

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        x = node.args[0]
        value = tensor_value(x)
        shifts = list(node.args[1]) if len(node.args) > 1 else []  # type: ignore[arg-type]
        dims = list(node.args[2]) if len(node.args) > 2 else list(node.kwargs.get("dims", []))  # type: ignore[arg-type]
        if value is None or not isinstance(x, torch.fx.Node):
            return "its input is not a tensor"
        if not dims or len(dims) != len(shifts):
            return "it rolls the flattened tensor"
        if not all(isinstance(s, int) for s in shifts):
            return "its shifts are not constants"
        dims = [int(d) % value.dim() for d in dims]
        if not all(isinstance(value.shape[d], int) for d in dims):
            return "a rolled dim has a dynamic size"
        replace_by(graph_module, node, lambda v: roll_as_slices(v, shifts, dims), [x])
        return None
