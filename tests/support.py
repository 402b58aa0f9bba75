"""Test-only helpers: what several test files ask of a lowered program or a rewritten graph, and two models.

The lowering flow itself (export, rewrite, quantize, lower, run, compare) is ``testbed``'s, shared with
the benchmarks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import pytest
import torch

from xnnguard.report import STOCK_RULES, KeptOut
from xnnguard.rules.rank_limit import exceeds_rank_limit

__all__ = [
    "ClassToken",
    "SeparableBlock",
    "assert_within_rank_limit",
    "dynamic_int8_in_slow_tier",
    "max_rank",
    "ops",
    "own_records",
    "rows_in_slow_tier",
]


def dynamic_int8_in_slow_tier(modes: Sequence[str]) -> list[Any]:
    """A per-family test's precisions with its dynamic-int8 row in the slow tier (docs/testing.md).

    Dynamic quantization quantizes only the linears and convs around a rewritten op, and
    ``tests/test_rewrites_in_int8.py`` keeps a dynamic-int8 row of each rewrite family in the default tier.
    """
    return rows_in_slow_tier(modes, lambda mode: "dynamic" in mode)


def rows_in_slow_tier(
    rows: Iterable[Any],
    slow: Collection[Any] | Callable[..., bool],
    ids: Sequence[str] | Callable[..., str] | None = None,
) -> list[Any]:
    """``rows`` as parameters, those ``slow`` picks in the slow tier (docs/testing.md); each caller says why,
    and where the behaviour stays covered in the default tier.

    A row is one value, or a tuple of values for a parametrization of several names. ``slow`` is a collection
    of rows, or a predicate called with a row's values; ``ids`` a name per row, or a function of its values.
    """
    rows = list(rows)
    if ids is not None and not callable(ids) and len(ids) != len(rows):
        raise ValueError(f"{len(ids)} ids for {len(rows)} rows")
    params = []
    for index, row in enumerate(rows):
        values = row if isinstance(row, tuple) else (row,)
        is_slow = slow(*values) if callable(slow) else row in slow
        name = ids(*values) if callable(ids) else None if ids is None else ids[index]
        params.append(pytest.param(*values, marks=pytest.mark.slow if is_slow else (), id=name))
    return params


def own_records(records: Sequence[KeptOut]) -> list[KeptOut]:
    """The records of xnnguard's own rules: without those giving ExecuTorch's reason for the other nodes outside."""
    return [record for record in records if record.rule not in STOCK_RULES]


def ops(ep: torch.export.ExportedProgram) -> set[str]:
    """Short names of the ATen ops of ``ep`` (``conv3d``, ``max_pool2d``...)."""
    return {str(n.target).split(".")[-2] for n in ep.graph.nodes if n.op == "call_function" and "." in str(n.target)}


def max_rank(ep: torch.export.ExportedProgram) -> int:
    ranks = [n.meta["val"].dim() for n in ep.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    return max(ranks)


def assert_within_rank_limit(ep: torch.export.ExportedProgram) -> None:
    assert not exceeds_rank_limit(max_rank(ep)), f"a tensor of {max_rank(ep)} dims"


class ClassToken(torch.nn.Module):
    """A learned class token put in front of the tokens of every image of the batch (ViT, MViT), then a
    linear: nothing a rewrite changes but the token's expand (to a dynamic batch: sized by the input)."""

    def __init__(self) -> None:
        super().__init__()
        self.token = torch.nn.Parameter(torch.randn(1, 1, 16))
        self.linear = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.cat((self.token.expand(x.shape[0], -1, -1), x), dim=1))


class ClassTokenOfIds(torch.nn.Module):
    """A class token in front of embedded token ids: under a dynamic batch no float input carries the batch
    size, so the token's expand stays an expand (XNNPACK has no broadcast node)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 16)
        self.token = torch.nn.Parameter(torch.randn(1, 1, 16))
        self.linear = torch.nn.Linear(16, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.cat((self.token.expand(ids.shape[0], -1, -1), self.embed(ids)), dim=1))


class SeparableBlock(torch.nn.Module):
    """R(2+1)D's residual block in miniature: spatial then temporal conv, twice, and the skip added."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(  # R(2+1)D's stem: it ends with a temporal conv, as every block does
            torch.nn.Conv3d(3, channels, (1, 3, 3), padding=(0, 1, 1)),
            torch.nn.ReLU(inplace=True),
            torch.nn.Conv3d(channels, channels, (3, 1, 1), padding=(1, 0, 0)),
            torch.nn.ReLU(inplace=True),
        )
        self.body = torch.nn.Sequential(
            torch.nn.Conv3d(channels, channels, (1, 3, 3), padding=(0, 1, 1)),
            torch.nn.ReLU(inplace=True),
            torch.nn.Conv3d(channels, channels, (3, 1, 1), padding=(1, 0, 0)),
        )
        self.relu = torch.nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        out = self.body(x)
        out += x
        return self.relu(out)
