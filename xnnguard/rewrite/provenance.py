"""Which rewrite put a node in the graph, and what that means for quantizing it.

The rewrites run before quantization, so the quantizer sees the pieces of a rewritten op as ops of their
own and would quantize between them: a rounding the original op does not have. Each node a rewrite
inserts carries a stamp in ``meta["custom"]`` (which ``torch.export`` carries over a re-export): the op it
stands in for, whether its pieces must stay float (the op it replaces is one the XNNPACK quantizer leaves
float, such as a 3-D average pooling: then so are its pieces), whether its output shares its input's
quantization (the original op is one the XNNPACK quantizer lets share it, a mean: its float pieces then
end in a quantize at that same scale), and a note when the rewrite's form rounds where the original op
does not. ``xnnguard.XNNPACKQuantizer`` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["RewriteStamp", "carry_stamp", "rewrite_stamp", "stamp"]

_KEY = "xnnguard_rewrite"
_CUSTOM = "custom"


@dataclass(frozen=True)
class RewriteStamp:
    origin: str  # the name of the node the rewrite replaced
    op: str  # its operator, for reports
    stays_float: bool
    note: str | None = None  # why the rewritten form cannot keep the original's quantization, if it cannot
    shares_input: bool = False  # the original's output shares its input's quantization (a mean)


def stamp(node: torch.fx.Node, mark: RewriteStamp) -> None:
    """Record on ``node`` that a rewrite inserted it (a node stamped before keeps its first stamp)."""
    custom = node.meta.setdefault(_CUSTOM, {})
    custom.setdefault(
        _KEY,
        {
            "origin": mark.origin,
            "op": mark.op,
            "stays_float": mark.stays_float,
            "note": mark.note,
            "shares_input": mark.shares_input,
        },
    )


def rewrite_stamp(node: torch.fx.Node) -> RewriteStamp | None:
    """The stamp of a node a rewrite inserted, or None for the model's own nodes."""
    found = (node.meta.get(_CUSTOM) or {}).get(_KEY)
    if not isinstance(found, dict):
        return None
    return RewriteStamp(
        str(found["origin"]),
        str(found["op"]),
        bool(found["stays_float"]),
        found.get("note"),
        bool(found.get("shares_input", False)),
    )


def carry_stamp(node: torch.fx.Node, origin: torch.fx.Node) -> None:
    """Give ``node``, which stands in for ``origin``, ``origin``'s stamp, if it has one.

    A node that replaces a piece of a rewritten op (a layout pass moving it, a later rewrite of it) is
    still a piece of that op: were it to lose the stamp, the quantizer would round where the op does not.
    """
    found = rewrite_stamp(origin)
    if found is not None:
        stamp(node, found)
