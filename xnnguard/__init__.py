"""xnnguard: safe XNNPACK lowering on released ExecuTorch (1.5.x).

The public API is small; names load lazily so that ``xnnguard verify`` starts without importing the
whole export stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_PUBLIC = {
    "XnnpackPartitioner": "xnnguard.passes",
    "TagHighRankPass": "xnnguard.passes",
    "TagConv3dPass": "xnnguard.passes",
    "DO_NOT_DELEGATE": "xnnguard.passes",
    "KeptOut": "xnnguard.report",
    "Rule": "xnnguard.report",
    "XNN_MAX_TENSOR_DIMS": "xnnguard.rank_limit",
    "XNNPACKQuantizer": "xnnguard.quantizer",
    "rewrite_for_xnnpack": "xnnguard.passes",
    "XnnpackRewriter": "xnnguard.passes",
    "RewriteError": "xnnguard.passes",
    "verify_pte": "xnnguard.runtime_check",
    "assert_pte_ok": "xnnguard.runtime_check",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:  # the lazy names, for type checkers; "X as X" marks a re-export
    from xnnguard.passes import (
        DO_NOT_DELEGATE as DO_NOT_DELEGATE,
        RewriteError as RewriteError,
        TagConv3dPass as TagConv3dPass,
        TagHighRankPass as TagHighRankPass,
        XnnpackPartitioner as XnnpackPartitioner,
        XnnpackRewriter as XnnpackRewriter,
        rewrite_for_xnnpack as rewrite_for_xnnpack,
    )
    from xnnguard.quantizer import XNNPACKQuantizer as XNNPACKQuantizer
    from xnnguard.rank_limit import XNN_MAX_TENSOR_DIMS as XNN_MAX_TENSOR_DIMS
    from xnnguard.report import KeptOut as KeptOut, Rule as Rule
    from xnnguard.runtime_check import assert_pte_ok as assert_pte_ok, verify_pte as verify_pte


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'xnnguard' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
