"""An activation that quantization fuses into its conv or linear stays right after it in a rewrite.

The XNNPACK quantizer observes ``conv -> relu`` and ``linear -> relu`` once, after the ReLU, and
XNNPACK folds a ReLU or Hardtanh into its conv or linear as an output clamp. A rewrite that leaves the
activation behind its views and concatenations (a Conv3d as conv2d per frame run, then a cat and a
permute; a linear on 8-D rows, then a reshape back) separates the pair: the conv's output is then
rounded to a grid that spans its negative values too, about twice as coarse, before the ReLU, which the
original op never does. A rewrite that replaces a conv or linear takes its activation along and applies
it to each conv or linear it emits (exact: the activation is elementwise, the views only move values).
The in-place forms (``nn.ReLU(inplace=True)``, as torchvision's video models write it) are the same
activation: the producer's output has no other reader, so applying it out of place changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["FusedActivation", "fused_activation", "replace_uses"]

_aten = torch.ops.aten


@dataclass(frozen=True)
class FusedActivation:
    """The activation ``node`` applies to its producer's output, as a function of tensors."""

    node: torch.fx.Node
    apply: Callable[[torch.Tensor], torch.Tensor]


def fused_activation(producer: torch.fx.Node) -> FusedActivation | None:
    """The ReLU or Hardtanh that is ``producer``'s only user and reads nothing else, or None."""
    if len(producer.users) != 1:
        return None
    (user,) = producer.users
    if user.op != "call_function" or not user.args or user.args[0] is not producer:
        return None
    if user.target in (_aten.relu.default, _aten.relu_.default):
        return FusedActivation(user, F.relu)
    if user.target in (_aten.hardtanh.default, _aten.hardtanh_.default):
        low, high = (float(v) for v in (user.args[1:3] or (-1.0, 1.0)))  # type: ignore[arg-type]
        return FusedActivation(user, lambda y: F.hardtanh(y, low, high))
    return None


def replace_uses(producer: torch.fx.Node, fused: FusedActivation | None, output: torch.fx.Node) -> None:
    """Make the readers of ``producer`` (of its activation, when ``fused``) read ``output`` instead.

    The activation node is erased here: dead-code elimination keeps an in-place one (it counts as a side
    effect), and with it the op it was rewritten from.
    """
    last = fused.node if fused is not None else producer
    last.replace_all_uses_with(output)
    if fused is not None:
        fused.node.graph.erase_node(fused.node)
