"""What the batch-norm rewrites share: which nodes are inference batch norms, and the map one computes.

An inference batch norm is ``y = x * scale + shift`` per channel (dim 1), with
``scale = weight / sqrt(var + eps)`` and ``shift = bias - mean * scale``. The rewrites compute both in
float64 from the module's constants and round once to the batch norm's dtype, as ExecuTorch's own
``DecomposeBatchNorm`` does.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch.fx.node import Argument

from xnnguard.rewrite.attributes import attribute_tensor

__all__ = ["ChannelAffine", "channel_affine", "inference_batch_norm", "output_node"]

_aten = torch.ops.aten
# op -> (index of eps, index of the "training" flag or None when the op is inference-only)
_BATCH_NORMS = {
    _aten.batch_norm.default: (7, 5),
    _aten._native_batch_norm_legit_no_training.default: (6, None),
}


def inference_batch_norm(node: object) -> bool:
    """True for a batch norm with running statistics (``training=False``) whose output alone is read."""
    if getattr(node, "op", None) != "call_function":
        return False
    spec = _BATCH_NORMS.get(node.target)  # type: ignore[attr-defined]
    if spec is None:
        return False
    _, training_index = spec
    if training_index is not None and node.args[training_index]:  # type: ignore[attr-defined]
        return False
    return output_node(node) is not None  # type: ignore[arg-type]


def output_node(batch_norm: torch.fx.Node) -> torch.fx.Node | None:
    """The node that carries the normalized tensor: the op itself, or the only ``getitem(0)`` of it."""
    if batch_norm.target is _aten.batch_norm.default:
        return batch_norm
    users = list(batch_norm.users)
    if len(users) == 1 and users[0].target is operator.getitem and users[0].args[1] == 0:
        return users[0]
    return None


@dataclass(frozen=True)
class ChannelAffine:
    """``x * scale + shift`` per channel, in float64."""

    scale: torch.Tensor
    shift: torch.Tensor

    def then(self, after: ChannelAffine) -> ChannelAffine:
        """This map followed by ``after``."""
        return ChannelAffine(self.scale * after.scale, self.shift * after.scale + after.shift)


def _operand(graph_module: torch.fx.GraphModule, arg: Argument) -> torch.Tensor | bool | None:
    """A ``Tensor?`` operand: its value, None when absent, False when it is not a constant of the module."""
    if arg is None:
        return None
    value = attribute_tensor(graph_module, arg)
    return False if value is None else value


def channel_affine(graph_module: torch.fx.GraphModule, batch_norm: torch.fx.Node) -> ChannelAffine | None:
    """The map ``batch_norm`` computes, or None when its statistics or affine parameters are not constants."""
    eps_index, _ = _BATCH_NORMS[batch_norm.target]  # type: ignore[index]
    weight, bias, mean, var = (_operand(graph_module, arg) for arg in batch_norm.args[1:5])
    if any(value is False for value in (weight, bias, mean, var)) or mean is None or var is None:
        return None
    assert isinstance(mean, torch.Tensor) and isinstance(var, torch.Tensor)
    with torch.no_grad():
        scale = torch.rsqrt(var.double() + float(batch_norm.args[eps_index]))  # type: ignore[arg-type]
        if isinstance(weight, torch.Tensor):
            scale = scale * weight.double()
        shift = -mean.double() * scale
        if isinstance(bias, torch.Tensor):
            shift = shift + bias.double()
    return ChannelAffine(scale, shift)
