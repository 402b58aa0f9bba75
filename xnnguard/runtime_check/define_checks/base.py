"""The vocabulary the define-time checks share: findings, a node with its values at hand, datatype sets.

XNNPACK and ExecuTorch's ``XNNCompiler`` check a delegate in three places: when each value and node
is defined, when the runtime is created (operators, weight packing) and when shapes are propagated at
the first execute. The checks in this package evaluate those rules on the serialized graph; each is
named after the rule and cites where it lives (XNNPACK 92a7ad50, the pin of ExecuTorch 1.5.1, and
``backends/xnnpack/runtime/XNNCompiler.cpp`` of ExecuTorch cff6f4dd, which the 1.5.1 runtime matches;
the research note ``xnnpack-define-checks.md`` has the evidence).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from xnnguard.boundary.xnnpack_constants import XNN_INVALID_VALUE_ID
from xnnguard.runtime_check.xnnpack_blob import XnnNode, XnnValue

__all__ = [
    "AT_LOAD",
    "AT_RUN",
    "BYTE_ADDRESSABLE",
    "FLOAT",
    "QUANTIZED_8BIT",
    "Finding",
    "NodeCheck",
    "NodeView",
    "byte_size",
    "element_bytes",
    "f32",
    "is_normal_positive",
    "quantized_label",
]

AT_LOAD = "the runtime fails to load the method"
AT_RUN = "the method fails when it first runs"

FLOAT = frozenset({"fp32", "fp16", "bf16"})
QUANTIZED_8BIT = frozenset({"qint8", "quint8"})
# xnn_datatype_is_byte_addressable (src/datatype.c): everything but the 4-bit, 2-bit and packed types
BYTE_ADDRESSABLE = frozenset(
    {"fp32", "fp16", "bf16", "int32", "qint8", "quint8", "qint32", "qcint8", "qcint32", "qdint8"}
)
_ELEMENT_BITS = {
    "fp32": 32,
    "fp16": 16,
    "bf16": 16,
    "int32": 32,
    "qint8": 8,
    "quint8": 8,
    "qint32": 32,
    "qcint8": 8,
    "qcint32": 32,
    "qcint4": 4,
    "qbint4": 4,
    "qdint8": 8,
    "qpint8": 8,
    "pfp32": 32,
}
_F32 = struct.Struct("<f")
_SMALLEST_NORMAL_F32 = 2.0**-126


@dataclass(frozen=True)
class Finding:
    """One rule a node or value breaks: which kind of problem, in a sentence, and the value it is about."""

    kind: str
    message: str
    value: int | None = None


def f32(number: float) -> float:
    """``number`` rounded to float32, as XNNPACK computes it."""
    try:
        return float(_F32.unpack(_F32.pack(number))[0])
    except OverflowError:
        return math.copysign(math.inf, number)


def is_normal_positive(scale: float) -> bool:
    """``scale > 0 && isnormal(scale)`` on a float32 (src/tensor.c:357): rejects 0, negatives, subnormals, inf, NaN."""
    return math.isfinite(scale) and scale >= _SMALLEST_NORMAL_F32


def element_bytes(datatype: str) -> float:
    """Bytes per element of a datatype (0.5 for the 4-bit ones; 1 for one unknown here)."""
    return _ELEMENT_BITS.get(datatype, 8) / 8


def byte_size(value: XnnValue) -> int | None:
    """Bytes the runtime reads for ``value`` (4-bit types pack two per byte); None for an unknown datatype."""
    bits = _ELEMENT_BITS.get(value.datatype)
    if bits is None:
        return None
    return (math.prod(value.dims) * bits + 7) // 8


def quantized_label(value: XnnValue) -> str:
    """``qint8(scale 0.0236, zero point -17)``, ``fp32``: how messages name a value's type."""
    from xnnguard.runtime_check.xnnpack_blob import PerTensorQuant

    quantization = value.quantization
    if isinstance(quantization, PerTensorQuant):
        return f"{value.datatype}(scale {quantization.scale:.7g}, zero point {quantization.zero_point})"
    return value.datatype


class NodeView:
    """A node with the values it names at hand: ``view.value("filter_id")``, ``view.param("groups")``."""

    __slots__ = ("node", "values")

    def __init__(self, node: XnnNode, values: dict[int, XnnValue]) -> None:
        self.node = node
        self.values = values

    @property
    def op(self) -> str:
        return self.node.op

    def value(self, id_field: str) -> XnnValue | None:
        """The value an id field names; None when the field holds no value or names an undefined one."""
        value_id = self.node.ids.get(id_field, XNN_INVALID_VALUE_ID)
        if value_id == XNN_INVALID_VALUE_ID:
            return None
        return self.values.get(value_id)

    def param(self, name: str) -> Any:
        return self.node.params.get(name)

    def min_max(self) -> tuple[float, float]:
        """``output_min_max``, or the (-inf, +inf) XNNCompiler assumes without it (XNNCompiler.cpp:89-99)."""
        return self.node.output_min_max or (-math.inf, math.inf)


NodeCheck = Callable[[NodeView], Iterator[Finding]]
