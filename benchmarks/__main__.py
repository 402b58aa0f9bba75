"""Run every ``benchmarks/bench_*.py`` module's ``main()`` (or only those named): ``python -m benchmarks [NAME...]``.

A ``main()`` that returns ``False`` missed a target; one that raises failed; any other result (figures,
None, True) counts as done. Exit code 0 when nothing missed or failed, 1 otherwise.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
import traceback
import warnings
from pathlib import Path


def _bench_modules(names: list[str]) -> list[str]:
    found = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name.startswith("bench_"))
    if not names:
        return found
    unknown = [n for n in names if n not in found and f"bench_{n}" not in found]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {', '.join(unknown)}; there are: {', '.join(found)}")
    return [n if n in found else f"bench_{n}" for n in names]


def _verdict(result: object) -> str:
    """``False``: a target was missed; ``True``: every target met; anything else (figures, None): it ran."""
    if result is False:
        return "TARGET MISSED"
    return "targets met" if result is True else "done"


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore")
    failed = []
    for name in _bench_modules(argv):
        started = time.perf_counter()
        try:
            result = importlib.import_module(f"benchmarks.{name}").main()
            verdict = _verdict(result)
        except Exception:
            traceback.print_exc()
            verdict = "FAILED"
        print(f"{name}: {verdict} ({time.perf_counter() - started:.0f} s)\n")
        if verdict in ("TARGET MISSED", "FAILED"):
            failed.append(name)
    if failed:
        print(f"missed or failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
