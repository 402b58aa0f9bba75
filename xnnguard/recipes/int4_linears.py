"""torchao's int8 dynamic activation, int4 weight scheme on the linears XNNPACK can run it on; int8 weights on the rest.

XNNPACK runs int4 weights blockwise, in blocks of a multiple of 32 input features: ExecuTorch asserts
``group_size % 32 == 0`` when it serializes the weight (a per-channel int4 weight is one block of the
whole input), and torchao's own quantization asserts that the input size divides into blocks. So the stock
recipes end on the first ``Linear(16, 10)``: per channel with ``AssertionError: Delegation to XNNPACK
requires group_size to be a multiple of 32, but got 16`` while lowering, per group with ``Expecting input
size at 1 dimension: 16 to be divisible by block_size at 1 dimension: 32`` while quantizing.

``Int4WhereXnnpackTakesIt`` is one torchao config (a recipe applies one): each linear whose input size is
a multiple of the block (32 per channel, ``group_size`` per group) gets int4 weights as asked; any other
gets int8 weights per output channel with the same int8 dynamic activations (XNNPACK's ``qd8-f32-qc8w``,
which takes any input size), and a record in ``report`` naming it and why. ``select`` is the recipe's
filter: it sees each module's name, so it makes the records; the handler sees only the module, so it
decides again from the same sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torchao.core.config import AOBaseConfig
from torchao.quantization import quantize_
from torchao.quantization.granularity import PerAxis, PerGroup
from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig
from torchao.quantization.transform_module import register_quantize_module_handler

from xnnguard.report import KeptOut, Rule

__all__ = ["INT4_BLOCK", "Int4WhereXnnpackTakesIt"]

INT4_BLOCK = 32  # XNNPACK's int4 weights come in blocks of a multiple of this many input features


@dataclass
class Int4WhereXnnpackTakesIt(AOBaseConfig):
    """int8 dynamic activations with int4 weights (per output channel, or per ``group_size`` inputs) where
    XNNPACK takes them, int8 weights per output channel elsewhere. ``report``: one record per such linear."""

    group_size: int | None = None  # None: per output channel
    records: dict[str, KeptOut] = field(default_factory=dict)

    @property
    def report(self) -> list[KeptOut]:
        return list(self.records.values())

    def block(self, linear: torch.nn.Linear) -> int:
        return self.group_size if self.group_size is not None else linear.in_features

    def why_not_int4(self, linear: torch.nn.Linear) -> str | None:
        """Why XNNPACK cannot take ``linear`` with int4 weights, or None when it can."""
        block, size = self.block(linear), linear.in_features
        if size % block:
            return f"its {size} input features do not divide into blocks of {block} (group_size)"
        if block % INT4_BLOCK:
            return f"XNNPACK takes int4 weights in blocks of a multiple of {INT4_BLOCK} input features, not {block}"
        return None

    def select(self, module: torch.nn.Module, fqn: str) -> bool:
        """The recipe's filter: every linear is quantized; one that cannot take int4 is recorded here."""
        if not isinstance(module, torch.nn.Linear) or type(module.weight.detach()) is not torch.Tensor:
            return False  # not a linear, or one whose (shared) weight is quantized already
        reason = self.why_not_int4(module)
        if reason is not None:
            self.records[fqn] = KeptOut(
                fqn or "(the model)", "torch.nn.Linear", Rule.INT4_WEIGHT_BLOCKS,
                f"linear not given int4 weights: {reason}; int8 weights per output channel instead",
            )
        else:
            self.records.pop(fqn, None)
        return True

    def scheme(self, linear: torch.nn.Linear) -> Int8DynamicActivationIntxWeightConfig:
        """torchao's config for ``linear``: int4 as asked, or int8 per output channel."""
        if self.why_not_int4(linear) is not None:
            return Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(axis=0))
        granularity = PerAxis(axis=0) if self.group_size is None else PerGroup(group_size=self.group_size)
        int4 = getattr(torch, "int4")  # noqa: B009  (torch's type stubs do not declare int4)
        return Int8DynamicActivationIntxWeightConfig(weight_dtype=int4, weight_granularity=granularity)


@register_quantize_module_handler(Int4WhereXnnpackTakesIt)
def _quantize(module: torch.nn.Module, config: Int4WhereXnnpackTakesIt) -> torch.nn.Module:
    """Quantize one linear (``select`` chose it) with the scheme its sizes allow; torchao swaps its weight."""
    assert isinstance(module, torch.nn.Linear)
    quantize_(module, config.scheme(module))
    return module
