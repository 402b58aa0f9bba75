"""Coverage: per method, what runs in XNNPACK and which operators run outside it, in text and JSON."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

from testbed.lowered import lower
from xnnguard.cli import main
from xnnguard.runtime_check import verify_pte

pytestmark = pytest.mark.release_sensitive


class NormsAndMean(torch.nn.Module):
    """Two layer norms and a mean over the last dim: ops no XNNPACK config of 1.5.1 takes."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.first, self.second = torch.nn.LayerNorm(8), torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(self.linear(x)) * 2).mean(-1)


@cache
def norms_and_mean() -> bytes:
    torch.manual_seed(0)
    x = (torch.randn(2, 3, 8),)
    return lower(NormsAndMean().eval(), x, XnnpackPartitioner()).buffer


def test_the_report_counts_nodes_inside_and_operators_outside_per_method() -> None:
    (coverage,) = verify_pte(norms_and_mean()).coverage
    outside = dict(coverage.outside)
    assert outside["aten::native_layer_norm.out"] == 2 and outside["aten::mean.out"] == 1
    assert coverage.method == "forward" and coverage.delegates >= 1
    assert dict(coverage.inside)["XNNFullyConnected"] == 1


def test_the_text_report_has_one_summary_line_then_the_operators_outside(tmp_path: Path, capsys) -> None:
    path = tmp_path / "norms.pte"
    path.write_bytes(norms_and_mean())
    main(["verify", str(path)])
    lines = capsys.readouterr().out.splitlines()
    summary = next(index for index, line in enumerate(lines) if line.startswith("  forward: "))
    assert "XNNPACK node" in lines[summary] and "operator calls outside" in lines[summary]
    assert lines[summary + 1].startswith("    outside: aten::native_layer_norm.out x2, ")
    assert "aten::mean.out x1" in lines[summary + 1]


def test_the_json_report_has_the_same_counts(tmp_path: Path, capsys) -> None:
    path = tmp_path / "norms.pte"
    path.write_bytes(norms_and_mean())
    main(["verify", str(path), "--json"])
    (entry,) = json.loads(capsys.readouterr().out)["files"]
    (coverage,) = entry["coverage"]
    assert coverage["outside"]["aten::native_layer_norm.out"] == 2 and coverage["outside"]["aten::mean.out"] == 1
    assert coverage["xnnpack_nodes"]["XNNFullyConnected"] == 1


@pytest.mark.parametrize("mode", ["text", "json"])
def test_a_fully_delegated_method_says_nothing_runs_outside(mode: str, tmp_path: Path, capsys) -> None:
    torch.manual_seed(0)
    path = tmp_path / "linear.pte"
    path.write_bytes(lower(torch.nn.Linear(8, 4).eval(), (torch.randn(2, 8),), XnnpackPartitioner()).buffer)
    main(["verify", str(path), *(["--json"] if mode == "json" else [])])
    out = capsys.readouterr().out
    if mode == "json":
        assert json.loads(out)["files"][0]["coverage"][0]["outside"] == {}
    else:
        assert "  forward: 1 XNNPACK node in 1 delegate, nothing outside" in out
