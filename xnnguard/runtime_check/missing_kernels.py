"""Operators a method calls outside its delegates that the installed runtime has no kernel for.

Found today only when the method is loaded (``kernel 'aten::max_pool3d_with_indices.out' not found``);
the runtime's registry can be asked up front. The installed runtime is ExecuTorch's Python runtime
with its quantized kernels (``executorch.kernels.quantized``), which programs with q/dq left outside
XNNPACK need anyway.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from functools import cache

from xnnguard.runtime_check.pte_reader import Method
from xnnguard.runtime_check.report import Problem

__all__ = ["missing_kernel_problems", "registered_operators"]

logger = logging.getLogger("xnnguard.runtime_check")


@cache
def registered_operators() -> frozenset[str] | None:
    """Names (``"aten::add.out"``) of every operator the installed runtime has a kernel for; None without a runtime."""
    try:
        from executorch.extension.pybindings import portable_lib
    except ImportError as error:
        logger.warning("no ExecuTorch runtime to ask for kernels (%s); kernel check skipped", error)
        return None
    with suppress(ImportError):
        import executorch.kernels.quantized  # noqa: F401  (registers the quantized_decomposed kernels)
    return frozenset(portable_lib._get_operator_names())


def missing_kernel_problems(method: Method, registered: frozenset[str]) -> list[Problem]:
    return [
        Problem(
            "missing_kernel",
            f"the runtime has no kernel for {operator}: loading the method fails (kernel not found)",
            method=method.name,
            op=operator,
        )
        for operator in method.kernel_operators
        if operator not in registered
    ]
