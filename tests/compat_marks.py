"""Skip markers for what a supported ExecuTorch release lacks, decided by ``xnnguard.compat`` (no version strings)."""

from __future__ import annotations

import pytest

from xnnguard import compat

needs_pre_decomposition_hook = pytest.mark.skipif(
    not compat.has_pre_decomposition_hook(),
    reason="this ExecuTorch has no Partitioner.transform_for_pre_decomposition (1.4): "
    "xnnguard rewrites from ops_to_not_decompose instead",
)
without_pre_decomposition_hook = pytest.mark.skipif(
    compat.has_pre_decomposition_hook(),
    reason="this ExecuTorch calls Partitioner.transform_for_pre_decomposition (1.5+): "
    "the ops_to_not_decompose fallback is not used",
)
