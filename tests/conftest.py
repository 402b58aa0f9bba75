"""Every test starts from the same random state.

Under pytest-xdist a test's random inputs would otherwise depend on which tests ran before it in the same
worker, so a numeric test could pass locally and fail in CI on inputs nobody can reproduce.
"""

from __future__ import annotations

import random

import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded() -> None:
    random.seed(0)
    torch.manual_seed(0)
