"""Verify already-lowered ``.pte`` files: every XNNPACK delegate blob, statically, plus a real load/run.

>>> report = verify_pte("model.pte")            # doctest: +SKIP
>>> report.ok, [p.kind for p in report.problems]  # doctest: +SKIP
"""

from xnnguard.runtime_check.pte_reader import PteReadError
from xnnguard.runtime_check.report import Problem, Report
from xnnguard.runtime_check.verify import assert_pte_ok, verify_pte

__all__ = ["Problem", "PteReadError", "Report", "assert_pte_ok", "verify_pte"]
