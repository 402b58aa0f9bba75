"""Pieces every network module shares: the size names, a seeded build, the transformer MLP.

Kept tiny on purpose: each network module is meant to read like the architecture it follows, so only
what is literally the same layer in several of them lives here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

SIZES = ("bench", "test", "full")

Built = tuple[nn.Module, tuple[torch.Tensor, ...]]
Config = TypeVar("Config")


def pick(size: str, configs: dict[str, Config]) -> Config:
    """The config for ``size``; a clear error naming the sizes there are, not a KeyError."""
    if size not in configs:
        raise ValueError(f"unknown size {size!r}; the sizes are {', '.join(configs)}")
    return configs[size]


def seeded(seed: int, make: Callable[[], Built]) -> Built:
    """``make()`` under a fixed seed, model in eval mode: the same weights and inputs in every process.

    The timing protocol builds the model again in a fresh process for each side, so both must see
    identical weights and inputs.
    """
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model, inputs = make()
    return model.eval(), inputs


class Mlp(nn.Sequential):
    """Linear -> GELU -> Linear, the transformer MLP of torchvision's ``ops.MLP`` (dropout 0: left out)."""

    def __init__(self, dim: int, hidden: int, out: int | None = None) -> None:
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, out or dim))


def reinit_norms(model: nn.Module) -> nn.Module:
    """Give every norm's affine weights and running stats random values, as a trained model has.

    Fresh norms (weight 1, bias 0, mean 0, var 1) make batch-norm folding and norm rewrites look exact
    for the wrong reason; perturbed ones exercise the arithmetic.
    """
    for module in model.modules():
        weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
        is_norm = isinstance(module, nn.modules.batchnorm._NormBase | nn.GroupNorm | nn.LayerNorm)
        if is_norm and isinstance(weight, nn.Parameter) and isinstance(bias, nn.Parameter):
            with torch.no_grad():
                weight.uniform_(0.5, 1.5)
                bias.uniform_(-0.2, 0.2)
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
            assert module.running_var is not None
            module.running_mean.uniform_(-0.2, 0.2)
            module.running_var.uniform_(0.5, 1.5)
    return model
