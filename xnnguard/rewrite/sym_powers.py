"""Integer powers of sizes as products: ``powers_as_products``.

A rewrite writes the sizes of the views it makes from the fake values' SymInts; exporting the rewritten
module again spells each such size as graph nodes, and a size with the square of a dynamic size in it
(``reshape(t ** 2, 1)`` of a ``t x t`` tensor, Swin3D's ``(49 * t ** 2) // t``) as an ``operator.pow``
node on SymInts. ExecuTorch's edge verifier takes ``operator.mul`` on sizes but not ``operator.pow``
("invalid target for call_function <built-in function pow>"), so the rewritten program no longer lowered
where the one it came from did. ``x ** k`` with a literal integer ``k >= 1`` is ``x * x * ... * x``: the
same SymInt, the same value.
"""

from __future__ import annotations

import operator

import torch
from torch.export import ExportedProgram

__all__ = ["powers_as_products"]


def _integer_power(node: torch.fx.Node) -> tuple[torch.fx.Node, int] | None:
    """(base, exponent) of an ``operator.pow`` of a size node by a literal integer >= 1, else None."""
    if node.op != "call_function" or node.target is not operator.pow or node.kwargs or len(node.args) != 2:
        return None
    base, exponent = node.args
    if not isinstance(base, torch.fx.Node) or not isinstance(base.meta.get("val"), (int, torch.SymInt)):
        return None
    if type(exponent) is not int or exponent < 1:
        return None
    return base, exponent


def powers_as_products(ep: ExportedProgram) -> ExportedProgram:
    """``ep`` with each ``size ** k`` (integer ``k >= 1``) a chain of ``operator.mul``; ``ep`` itself, changed."""
    graph = ep.graph_module.graph
    changed = False
    for node in list(graph.nodes):
        power = _integer_power(node)
        if power is None:
            continue
        base, exponent = power
        product, value = base, base.meta["val"]
        with graph.inserting_before(node):
            for _ in range(exponent - 1):
                value = value * base.meta["val"]
                product = graph.call_function(operator.mul, (product, base))
                product.meta.update(node.meta)
                product.meta["val"] = value
        node.replace_all_uses_with(product)
        graph.erase_node(node)
        changed = True
    if changed:
        graph.lint()
        ep.graph_module.recompile()
    return ep
