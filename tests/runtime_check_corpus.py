"""Known-good and known-bad ``.pte`` files for the verifier, each lowered once per test session.

Every test module that reads the corpus carries ``ON_ONE_WORKER``: under pytest-xdist each worker would
lower its own copy of every program it reads, and build its module fixtures (sandboxes, mutation runs)
again each time the worker comes back to the module.

Bad ones come from STOCK ExecuTorch 1.5.1's XnnpackPartitioner (what teams ship today); good ones
from float and quantized Conv2d/Linear models and from ``xnnguard.XnnpackPartitioner`` on the bad
models. Each entry says which problem kinds the static verifier must report for it (none for good).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from testbed.lowered import lower
from testbed.quantize import quantize_pt2e, xnnpack_quantizer
from xnnguard.example_models import Conv2dReLU, Conv3dReLU, PermuteAdd

__all__ = ["CORPUS", "ON_ONE_WORKER", "Entry", "inputs_of", "program", "write_program"]

ON_ONE_WORKER = pytest.mark.xdist_group("runtime_check_corpus")


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


class MoveValues(torch.nn.Module):
    """Ops that move values: a permute, a concatenation and a pad (XNNPACK transpose, concatenate, pad)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = torch.cat([a.permute(0, 2, 1, 3), b], dim=1)
        return F.pad(y, (1, 1, 0, 2)) * 2


class Zoo(torch.nn.Module):
    """One delegate of many node types: max/average/global pooling, sigmoid, resize, transposed and
    depthwise convolutions, slice, softmax, transpose and a batch matmul."""

    def __init__(self) -> None:
        super().__init__()
        self.deconv = torch.nn.ConvTranspose2d(4, 4, 2, stride=2)
        self.dw = torch.nn.Conv2d(4, 4, 3, padding=1, groups=4)

    def forward(self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = F.max_pool2d(x, 2, 2)  # the stride written out: 1.4's stock MaxPool2dConfig raises without it
        y = torch.sigmoid(m) + F.avg_pool2d(x, 2)
        u = F.interpolate(y, scale_factor=2, mode="bilinear") + self.deconv(m)
        d = self.dw(u)
        g = torch.mean(d, dim=(2, 3), keepdim=True)
        return torch.softmax(d[:, :, 1:5, :] - g, dim=-1), torch.bmm(a, b.transpose(1, 2))


class TwoDelegates(torch.nn.Module):
    """Two linears around a cumulative sum, which XNNPACK does not take: two delegates, a kernel call between."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(8, 8)
        self.second = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.cumsum(self.first(x), dim=1))


class ConvPad(torch.nn.Module):
    """Issue 13: a static-int8 conv, then a pad that no conv absorbs (ExecuTorch's InsertPadQDQPass fires)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(F.pad(self.conv(x), (0, 1, 0, 1)))


@dataclass(frozen=True)
class Entry:
    build: Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]
    quantizer: Callable[[], object] | None
    guarded: bool  # lowered with xnnguard.XnnpackPartitioner instead of the stock one
    # what verify_pte must report without loading; None: judged by the numbers the program returns
    static_kinds: frozenset[str] | None
    transform: Callable[[torch.nn.Module], torch.nn.Module] | None = None  # e.g. torchao's quantize_


def _seeded(builder: Callable[[], torch.nn.Module], *shape: int) -> Callable[[], tuple]:
    def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        torch.manual_seed(0)
        return builder().eval(), (torch.randn(*shape),)

    return build


_rank7 = _seeded(lambda: PermuteAdd(7), 2, 3, 2, 3, 2, 3, 2)
_conv3d = _seeded(Conv3dReLU, 1, 3, 4, 6, 6)
_conv2d = _seeded(lambda: Conv2dReLU(relu=False), 1, 3, 8, 8)
_conv_linear = _seeded(ConvLinear, 1, 3, 8, 8)
_linear = _seeded(lambda: torch.nn.Linear(8, 4), 2, 3, 8)
_mlp = _seeded(lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)), 4, 16)


def _several(builder: Callable[[], torch.nn.Module], *shapes: tuple[int, ...]) -> Callable[[], tuple]:
    def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        torch.manual_seed(0)
        return builder().eval(), tuple(torch.randn(*shape) for shape in shapes)

    return build


def _per_tensor() -> object:
    return xnnpack_quantizer(per_channel=False)


def _float_output() -> object:
    return xnnpack_quantizer(per_channel=False, float_output=True)


def _dynamic() -> object:
    return xnnpack_quantizer(per_channel=True, dynamic=True)


def _int4_weights(model: torch.nn.Module) -> torch.nn.Module:
    """torchao's int8 dynamic activations with int4 weights in groups of 32 (XNNPACK's qbint4)."""
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
    return model


_orphaned = frozenset({"unwritten_output", "extern_ids"})
_ok = frozenset[str]()

CORPUS: dict[str, Entry] = {
    "stock_rank7": Entry(_rank7, None, False, frozenset({"rank"})),
    # the orphaned q/dq also leaves a Clamp from fp32 to qint8, which XNNPACK cannot create
    "stock_qconv3d_relu": Entry(_conv3d, _per_tensor, False, _orphaned | {"unsupported_input", "datatype"}),
    "stock_qconv2d_float_output": Entry(_conv2d, _float_output, False, _orphaned),
    "stock_maxpool3d": Entry(_seeded(MaxPool3d, 1, 2, 4, 4, 4), None, False, frozenset({"missing_kernel"})),
    "stock_float_conv_linear": Entry(_conv_linear, None, False, frozenset()),
    "stock_qconv_linear": Entry(_conv_linear, lambda: xnnpack_quantizer(per_channel=True), False, frozenset()),
    "guarded_rank7": Entry(_rank7, None, True, frozenset()),
    "guarded_qconv3d_relu": Entry(_conv3d, _per_tensor, True, frozenset({"unsupported_input"})),
    "guarded_qconv2d_float_output": Entry(_conv2d, _float_output, True, frozenset()),
    # per channel, the weight's dequantize runs as a kernel outside XNNPACK, the input's orphaned q/dq remain
    "stock_qconv3d_relu_per_channel": Entry(
        _conv3d,
        lambda: xnnpack_quantizer(per_channel=True),
        False,
        frozenset({"unwritten_output", "datatype", "unsupported_input"}),
    ),
    # the mutation test's sources and the define-time checks' programs: all load and run
    "stock_qconv_linear_per_tensor": Entry(_conv_linear, _per_tensor, False, _ok),
    "stock_move_values": Entry(_several(MoveValues, (1, 3, 4, 5), (1, 2, 3, 5)), None, False, _ok),
    "stock_zoo": Entry(_several(Zoo, (1, 4, 8, 8), (2, 3, 4), (2, 5, 4)), None, False, _ok),
    "stock_dynamic_linear": Entry(_linear, _dynamic, False, _ok),
    "stock_dynamic_conv1x1": Entry(_seeded(lambda: torch.nn.Conv2d(8, 16, 1), 2, 8, 5, 5), _dynamic, False, _ok),
    "stock_mlp": Entry(_mlp, None, False, _ok),
    "stock_two_delegates": Entry(_seeded(TwoDelegates, 2, 8), None, False, _ok),
    "stock_int4_linear": Entry(_seeded(lambda: torch.nn.Linear(64, 16), 2, 64), None, False, _ok, _int4_weights),
    # issue 13: StaticConstantPad with an fp32 input and a qint8 output, which XNNPACK refuses at load
    "stock_qconv_pad": Entry(
        _seeded(ConvPad, 1, 4, 8, 8),
        lambda: xnnpack_quantizer(per_channel=True),
        False,
        frozenset({"quant_params", "datatype"}),
    ),
}


def inputs_of(name: str) -> tuple[torch.Tensor, ...]:
    return CORPUS[name].build()[1]


@cache
def reference_model(name: str) -> Callable[..., torch.Tensor]:
    """What the program should compute: the eager model, or the converted pt2e model when quantized."""
    entry = CORPUS[name]
    model, inputs = entry.build()
    if entry.transform is not None:
        return entry.transform(model)
    return quantize_pt2e(model, inputs, entry.quantizer()) if entry.quantizer else model


@cache
def program(name: str) -> bytes:
    """The serialized program of corpus entry ``name`` (lowered on first use, then cached)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    import xnnguard

    entry = CORPUS[name]
    model, inputs = entry.build()
    exported = torch.export.export(reference_model(name), inputs) if entry.quantizer else model
    if entry.transform is not None:
        exported = reference_model(name)
    partitioner = xnnguard.XnnpackPartitioner() if entry.guarded else XnnpackPartitioner()
    return lower(exported, inputs, partitioner).buffer


def write_program(directory: Path, name: str) -> Path:
    path = directory / f"{name}.pte"
    if not path.exists():
        path.write_bytes(program(name))
    return path
