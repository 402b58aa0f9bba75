"""The supported ExecuTorch releases and what differs between them: ``xnnguard.boundary.releases``.

Kept under this name because user code and the README use it (``xnnguard.compat.UnsupportedExecuTorchError``,
``XNNGUARD_ALLOW_UNSUPPORTED_EXECUTORCH``); the rules live in the boundary package.
"""

from xnnguard.boundary.releases import (
    ALLOW_UNSUPPORTED_ENV,
    SUPPORTED_EXECUTORCH,
    UnsupportedExecuTorchError,
    ensure_flatc,
    executorch_version,
    has_bfloat16_opt_in,
    has_pre_decomposition_hook,
    has_recipe_api,
    has_runtime,
    is_supported,
    load_quantized_kernels,
    quantized_kernels_loaded,
    require_supported_executorch,
)

__all__ = [
    "ALLOW_UNSUPPORTED_ENV",
    "SUPPORTED_EXECUTORCH",
    "UnsupportedExecuTorchError",
    "ensure_flatc",
    "executorch_version",
    "has_bfloat16_opt_in",
    "has_pre_decomposition_hook",
    "has_recipe_api",
    "has_runtime",
    "is_supported",
    "load_quantized_kernels",
    "quantized_kernels_loaded",
    "require_supported_executorch",
]
