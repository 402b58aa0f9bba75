"""``make demo`` keeps working: the stock program of a built-in case fails where xnnguard's runs."""

from __future__ import annotations

from pathlib import Path

from xnnguard import demo


def test_the_demo_shows_stock_failing_and_xnnguard_running_on_patchify(tmp_path: Path) -> None:
    patchify = next(case for case in demo.CASES if case.name.startswith("patchify"))
    [(name, stock, guarded)] = demo.run_demo(tmp_path, (patchify,))
    assert stock.verdict == "load error"
    assert guarded.verdict == "ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "patchify__8_D_permute.stock.pte",
        "patchify__8_D_permute.xnnguard.pte",
    ]
