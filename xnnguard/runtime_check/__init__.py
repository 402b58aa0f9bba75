"""Verify already-lowered ``.pte`` files: every XNNPACK delegate blob, statically, plus a real load/run.

``verify_pte(path)`` returns a ``Report`` (``ok``, ``problems`` with a ``kind`` each, one of ``KINDS``;
``coverage`` per method); ``assert_pte_ok`` raises ``AssertionError`` listing the problems. Names load
lazily, so that ``xnnguard --help`` imports nothing of the checker. The checker itself imports neither
torch nor the ExecuTorch runtime; only ``load``/``run`` do.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_PUBLIC = {
    "KINDS": "xnnguard.runtime_check.report",
    "verify_pte": "xnnguard.runtime_check.verify",
    "assert_pte_ok": "xnnguard.runtime_check.verify",
    "Report": "xnnguard.runtime_check.report",
    "Problem": "xnnguard.runtime_check.report",
    "PteReadError": "xnnguard.runtime_check.pte_reader",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:  # the lazy names, for type checkers; "X as X" marks a re-export
    from xnnguard.runtime_check.pte_reader import PteReadError as PteReadError
    from xnnguard.runtime_check.report import KINDS as KINDS, Problem as Problem, Report as Report
    from xnnguard.runtime_check.verify import assert_pte_ok as assert_pte_ok, verify_pte as verify_pte


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'xnnguard.runtime_check' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
