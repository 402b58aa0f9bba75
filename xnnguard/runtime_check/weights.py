"""Weight integrity: each XNNPACK constant's bytes hash to the name ExecuTorch gave them.

ExecuTorch 1.5.1 stores every XNNPACK constant as named data whose key is the sha256 of its bytes
(``backends/xnnpack/operators/node_visitor.py:630-647``; a per-channel scale buffer is
``"scale_" + sha256``, :296-310), so a flipped byte anywhere in the weights is provable without a
reference file. Reading every byte is what makes this an option (``verify_pte(weights=True)``,
``xnnguard verify --weights``): the plain check reads the graphs only.

What cannot be checked is said, not passed over: constants whose key is not a sha256 (other exporters,
older releases), constants whose data is not in the program (a ``.ptd`` file or other external data,
which the runtime must be given at load), and constants stored in the blob's own constant section
(older releases, addressed by offset, unnamed).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from xnnguard.runtime_check.pte_reader import NamedData
from xnnguard.runtime_check.report import Problem
from xnnguard.runtime_check.xnnpack_blob import PerChannelGroupQuant, PerChannelQuant, XnnGraph

__all__ = ["WeightCheck", "check_weights"]

_SCALE_PREFIX = "scale_"
_HEX = frozenset("0123456789abcdef")


def _hash_name(key: str) -> str | None:
    """The sha256 a key names (None: the key is not a hash name)."""
    digest = key.removeprefix(_SCALE_PREFIX)
    return digest if len(digest) == 64 and set(digest) <= _HEX else None


@dataclass
class WeightCheck:
    """What the weight check of one program did: problems, how many blobs it proved, what it could not."""

    problems: list[Problem] = field(default_factory=list)
    checked: int = 0
    unchecked: Counter[str] = field(default_factory=Counter)  # reason -> constants

    def notes(self) -> tuple[str, ...]:
        return tuple(
            f"{count} constant{'s' * (count != 1)} {reason}: not checked" for reason, count in self.unchecked.items()
        )


def _constant_indices(graph: XnnGraph) -> Iterable[tuple[int, int]]:
    """(constant entry, value id) for each entry a value uses: its data, or its scale buffer."""
    for value in graph.values:
        if value.constant_buffer_idx:
            yield value.constant_buffer_idx, value.id
        quantization = value.quantization
        if isinstance(quantization, (PerChannelQuant, PerChannelGroupQuant)) and quantization.scale_buffer_idx:
            yield quantization.scale_buffer_idx, value.id


def check_weights(
    buffer: Any,
    graphs: Iterable[tuple[str, int, XnnGraph]],
    named_data: dict[str, NamedData],
    check: WeightCheck,
) -> None:
    """Hash every named constant the XNNPACK delegates use (each blob once) and compare with its name."""
    proven: dict[str, bool] = {}
    for method, delegate, graph in graphs:
        for index, value_id in _constant_indices(graph):
            if index >= len(graph.constant_data):
                continue  # a "constants" problem already
            key = graph.constant_data[index].named_key
            if key is None or not key:
                check.unchecked["in the delegate's own constant section (unnamed)"] += 1
                continue
            digest = _hash_name(key)
            if digest is None:
                check.unchecked["not named by the hash of their bytes"] += 1
                continue
            location = named_data.get(key)
            if location is None:
                check.unchecked["in external data (a .ptd file), not in the program"] += 1
                continue
            if key not in proven:
                actual = hashlib.sha256(buffer[location.offset : location.offset + location.size]).hexdigest()
                proven[key] = actual == digest
                check.checked += 1
                if not proven[key]:
                    check.problems.append(
                        Problem(
                            "weights",
                            f"constant {index} ({location.size} bytes) is named by sha256 {digest[:16]}... but its "
                            f"bytes hash to {actual[:16]}...: the weights were changed after export",
                            method=method,
                            delegate=delegate,
                            value=value_id,
                        )
                    )
