"""Known-good and known-bad ``.pte`` files for the verifier, each lowered once per test session.

Bad ones come from STOCK ExecuTorch 1.5.1's XnnpackPartitioner (what teams ship today); good ones
from float and quantized Conv2d/Linear models and from ``xnnguard.XnnpackPartitioner`` on the bad
models. Each entry says which problem kinds the static verifier must report for it (none for good).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from tests.support import lower, quantize_pt2e, xnnpack_quantizer
from xnnguard.example_models import Conv2dReLU, Conv3dReLU, PermuteAdd

__all__ = ["CORPUS", "Entry", "inputs_of", "program", "write_program"]


class ConvLinear(torch.nn.Module):
    """A Conv2d feeding a Linear: both gemm kinds XNNPACK takes, small enough to lower fast."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.linear = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.relu(self.conv(x)).flatten(1))


class MaxPool3d(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool3d(x, 2)


@dataclass(frozen=True)
class Entry:
    build: Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]
    quantizer: Callable[[], object] | None
    guarded: bool  # lowered with xnnguard.XnnpackPartitioner instead of the stock one
    # what verify_pte must report without loading; None: judged by the numbers the program returns
    static_kinds: frozenset[str] | None


def _seeded(builder: Callable[[], torch.nn.Module], *shape: int) -> Callable[[], tuple]:
    def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        torch.manual_seed(0)
        return builder().eval(), (torch.randn(*shape),)

    return build


_rank7 = _seeded(lambda: PermuteAdd(7), 2, 3, 2, 3, 2, 3, 2)
_conv3d = _seeded(Conv3dReLU, 1, 3, 4, 6, 6)
_conv2d = _seeded(lambda: Conv2dReLU(relu=False), 1, 3, 8, 8)
_conv_linear = _seeded(ConvLinear, 1, 3, 8, 8)


def _per_tensor() -> object:
    return xnnpack_quantizer(per_channel=False)


def _float_output() -> object:
    return xnnpack_quantizer(per_channel=False, float_output=True)


_orphaned = frozenset({"unwritten_output", "extern_ids"})

CORPUS: dict[str, Entry] = {
    "stock_rank7": Entry(_rank7, None, False, frozenset({"rank"})),
    "stock_qconv3d_relu": Entry(_conv3d, _per_tensor, False, _orphaned | {"unsupported_input"}),
    "stock_qconv2d_float_output": Entry(_conv2d, _float_output, False, _orphaned),
    "stock_maxpool3d": Entry(_seeded(MaxPool3d, 1, 2, 4, 4, 4), None, False, frozenset({"missing_kernel"})),
    "stock_float_conv_linear": Entry(_conv_linear, None, False, frozenset()),
    "stock_qconv_linear": Entry(_conv_linear, lambda: xnnpack_quantizer(per_channel=True), False, frozenset()),
    "guarded_rank7": Entry(_rank7, None, True, frozenset()),
    "guarded_qconv3d_relu": Entry(_conv3d, _per_tensor, True, frozenset({"unsupported_input"})),
    "guarded_qconv2d_float_output": Entry(_conv2d, _float_output, True, frozenset()),
}


def inputs_of(name: str) -> tuple[torch.Tensor, ...]:
    return CORPUS[name].build()[1]


@cache
def reference_model(name: str) -> Callable[..., torch.Tensor]:
    """What the program should compute: the eager model, or the converted pt2e model when quantized."""
    entry = CORPUS[name]
    model, inputs = entry.build()
    return quantize_pt2e(model, inputs, entry.quantizer()) if entry.quantizer else model


@cache
def program(name: str) -> bytes:
    """The serialized program of corpus entry ``name`` (lowered on first use, then cached)."""
    import executorch.kernels.quantized  # noqa: F401  (q/dq the stock partitioner leaves outside need kernels)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    import xnnguard

    entry = CORPUS[name]
    model, inputs = entry.build()
    exported = torch.export.export(reference_model(name), inputs) if entry.quantizer else model
    partitioner = xnnguard.XnnpackPartitioner() if entry.guarded else XnnpackPartitioner()
    return lower(exported, inputs, partitioner).buffer


def write_program(directory: Path, name: str) -> Path:
    path = directory / f"{name}.pte"
    if not path.exists():
        path.write_bytes(program(name))
    return path
