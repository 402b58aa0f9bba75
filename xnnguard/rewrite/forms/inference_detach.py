"""A ``detach`` (or ``alias``) inside the graph is dropped: at inference it is the tensor it reads.

``x.detach()`` exports as ``aten.detach`` and reaches the edge dialect as ``alias_copy``, which no
ExecuTorch 1.5.1 XNNPACK config takes: the copy ran on portable kernels and cut the program in two (fuzz
seeds 151 and 156; stock too). Exported programs carry no autograd state, so its users may read its
input instead: the values are the same tensor's.

Kept: a ``detach`` whose output is a graph output while its input is a graph input or another output.
Dropping it would make an output alias an input or another output, which the program's memory plan
does not take; there it is a copy at the graph's edge, which cuts nothing.

Postcondition: every ``detach`` / ``alias`` left feeds the graph's output only and reads an input or an output.
"""

from __future__ import annotations

import torch

from xnnguard.rewrite.node_rewrite import IdentityPass

__all__ = ["InferenceDetachPass"]

_aten = torch.ops.aten
_IDENTITIES = frozenset({_aten.detach.default, _aten.alias.default})


def _output_node(node: torch.fx.Node) -> torch.fx.Node | None:
    return next((user for user in node.users if user.op == "output"), None)


def _must_stay(node: torch.fx.Node) -> bool:
    """Dropping ``node`` would make a graph output alias a graph input or another output."""
    if _output_node(node) is None:
        return False
    source = node.args[0]
    return isinstance(source, torch.fx.Node) and (source.op == "placeholder" or _output_node(source) is not None)


class InferenceDetachPass(IdentityPass):
    """Redirects the users of each ``detach(x)`` / ``alias(x)`` to ``x`` (where that aliases no output)."""

    subject = "detach"

    def picks(self, node: torch.fx.Node) -> bool:
        return (
            node.op == "call_function"
            and node.target in _IDENTITIES
            and isinstance(node.args[0], torch.fx.Node)
            and not _must_stay(node)
        )
