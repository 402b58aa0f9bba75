"""Merge partitions the stock grouping leaves apart although their union is a valid delegate.

ExecuTorch's ``GroupBasedPartitioner`` merges its proposed partitions in one greedy pass: each pair is
asked once, in a fixed order, and a pair refused because the union would have closed a cycle through a
third partition is not asked again once that third partition has joined one of them. Config groups that
span wide stretches of the graph make this common: with dynamic int8, two linears reading one
activation share one ``choose_qparams`` and form one group, and a max over a dim after one of them
leaves it (and everything from there to the next stage) a delegate of its own, with nothing outside
between the two (Hiera: 4 delegates). Every delegate boundary costs a call and layout copies.

``merge_partitions`` asks again, until no pair merges. A union is taken only when it is convex: no path
leaves it and comes back, the condition the stock loop (and every delegate) needs.
"""

from __future__ import annotations

import torch
from torch.fx.passes.infra.partitioner import Partition

__all__ = ["merge_partitions"]


def merge_partitions(partitions: list[Partition], graph: torch.fx.Graph) -> list[Partition]:
    """``partitions``, with every pair whose union is convex merged, until none is left to merge.

    The first partition of a merged pair keeps its id and takes the other's nodes; the order of the
    list is kept otherwise.
    """
    order = {node: index for index, node in enumerate(graph.nodes)}
    merged = list(partitions)
    changed = True
    while changed:  # a merge can make a pair refused before mergeable: ask every pair again
        changed = False
        for i, first in enumerate(merged):
            j = i + 1
            while j < len(merged):
                if _is_convex(set(first.nodes) | set(merged[j].nodes), order):
                    for node in merged.pop(j).nodes:
                        first.add_node(node)
                    changed = True
                else:
                    j += 1
    return merged


def _is_convex(members: set[torch.fx.Node], order: dict[torch.fx.Node, int]) -> bool:
    """True when no path from a member through a non-member reaches a member again.

    Only nodes before the last member can lead back into ``members``, so the search stops there.
    """
    last = max(order[node] for node in members)
    pending = [user for node in members for user in node.users if user not in members]
    seen: set[torch.fx.Node] = set()
    while pending:
        node = pending.pop()
        if node in seen or order[node] > last:
            continue
        seen.add(node)
        for user in node.users:
            if user in members:
                return False
            pending.append(user)
    return True
