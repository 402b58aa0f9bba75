"""``make demo`` keeps working: the stock program of a built-in case fails where xnnguard's runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from xnnguard import demo

# Not release_sensitive: `make demo` runs in .venv, on the newest supported release.


@pytest.fixture(scope="module")
def patchify_row(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    patchify = next(case for case in demo.CASES if case.name.startswith("patchify"))
    [row] = demo.run_demo(tmp_path_factory.mktemp("demo"), (patchify,))
    return row


def test_the_demo_shows_stock_failing_to_load_and_xnnguard_running_patchify(patchify_row: tuple) -> None:
    _, stock, guarded = patchify_row
    assert stock.verdict == "load error"
    assert guarded.verdict == "ok"
    assert guarded.outside_ops <= 1  # the rewrite keeps the 8-D permute on XNNPACK


def test_the_demo_verification_flags_the_stock_file_and_passes_xnnguards(patchify_row: tuple) -> None:
    lines = demo._verification([patchify_row]).splitlines()
    assert "stock.pte: FLAGGED (rank): " in lines[0]
    assert lines[1].strip() == f"{Path(patchify_row[2].pte).name}: ok"


def test_the_demo_prints_no_third_party_chatter(tmp_path: Path) -> None:
    """No torchao CUDA-extension lines, pytree deprecations or cpuinfo lines: only the demo's own output."""
    result = subprocess.run(
        [sys.executable, "-m", "xnnguard.demo", "--case", "int8 conv2d + relu", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    assert result.stderr == ""
    assert "int8 conv2d + relu" in result.stdout and "int8_conv2d___relu.stock.pte: ok" in result.stdout
