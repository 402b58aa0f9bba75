"""ExecuTorch's XNNPACK constants, read from ExecuTorch's own file without importing its backend package.

``executorch.backends.xnnpack``'s ``__init__`` imports the partitioner, the quantizer and torchao: seconds
that ``xnnguard verify`` (a CI gate reading flatbuffers) need not pay. The constants file itself is plain
Python with no imports, so it is executed on its own; the values stay ExecuTorch's.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

from xnnguard.boundary.package_files import XNNPACK_CONSTANTS, package_file

__all__ = [
    "XNN_INVALID_VALUE_ID",
    "XNN_MAX_TENSOR_DIMS",
    "XNN_VALUE_FLAG_EXTERNAL_INPUT",
    "XNN_VALUE_FLAG_EXTERNAL_OUTPUT",
]


def _load() -> ModuleType:
    path = package_file(XNNPACK_CONSTANTS)
    spec = importlib.util.spec_from_file_location("xnnguard._executorch_xnnpack_constants", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"ExecuTorch's XNNPACK constants are missing: {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_constants = _load()

XNN_MAX_TENSOR_DIMS: int = _constants.XNN_MAX_TENSOR_DIMS
XNN_INVALID_VALUE_ID: int = _constants.XNN_INVALID_VALUE_ID
XNN_VALUE_FLAG_EXTERNAL_INPUT: int = _constants.XNN_VALUE_FLAG_EXTERNAL_INPUT
XNN_VALUE_FLAG_EXTERNAL_OUTPUT: int = _constants.XNN_VALUE_FLAG_EXTERNAL_OUTPUT
