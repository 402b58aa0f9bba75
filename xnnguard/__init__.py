"""xnnguard: safe XNNPACK lowering on released ExecuTorch (1.4.0 to 1.5.x).

The public API is small; names load lazily so that ``xnnguard verify`` starts without importing the
whole export stack. Importing xnnguard with an ExecuTorch outside the supported releases raises
``xnnguard.compat.UnsupportedExecuTorchError`` naming both (``xnnguard.compat``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from xnnguard.boundary.releases import require_supported_executorch

__version__ = "0.1.0"

require_supported_executorch()

_PUBLIC = {
    "XnnpackPartitioner": "xnnguard.partition",
    "TagHighRankPass": "xnnguard.tagging",
    "TagConv3dPass": "xnnguard.tagging",
    "DO_NOT_DELEGATE": "xnnguard.tagging",
    "KeptOut": "xnnguard.report",
    "Rule": "xnnguard.report",
    "XNN_MAX_TENSOR_DIMS": "xnnguard.rules.rank_limit",
    "XNNPACKQuantizer": "xnnguard.quantizer",
    "rewrite_for_xnnpack": "xnnguard.rewrite",
    "XnnpackRewriter": "xnnguard.rewrite",
    "RewriteError": "xnnguard.rewrite",
    "verify_pte": "xnnguard.runtime_check",
    "keep_dynamic_ranges": "xnnguard.dynamic_ranges",
    "assert_pte_ok": "xnnguard.runtime_check",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:  # the lazy names, for type checkers; "X as X" marks a re-export
    from xnnguard.dynamic_ranges import keep_dynamic_ranges as keep_dynamic_ranges
    from xnnguard.partition import XnnpackPartitioner as XnnpackPartitioner
    from xnnguard.quantizer import XNNPACKQuantizer as XNNPACKQuantizer
    from xnnguard.report import KeptOut as KeptOut, Rule as Rule
    from xnnguard.rewrite import (
        RewriteError as RewriteError,
        XnnpackRewriter as XnnpackRewriter,
        rewrite_for_xnnpack as rewrite_for_xnnpack,
    )
    from xnnguard.rules.rank_limit import XNN_MAX_TENSOR_DIMS as XNN_MAX_TENSOR_DIMS
    from xnnguard.runtime_check import assert_pte_ok as assert_pte_ok, verify_pte as verify_pte
    from xnnguard.tagging import (
        DO_NOT_DELEGATE as DO_NOT_DELEGATE,
        TagConv3dPass as TagConv3dPass,
        TagHighRankPass as TagHighRankPass,
    )


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'xnnguard' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
