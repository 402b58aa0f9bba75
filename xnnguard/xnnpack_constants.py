"""ExecuTorch's XNNPACK constants, read from ExecuTorch's own file without importing its backend package.

``executorch.backends.xnnpack``'s ``__init__`` imports the partitioner, the quantizer and torchao: seconds
that ``xnnguard verify`` (a CI gate reading flatbuffers) need not pay. The constants file itself is plain
Python with no imports, so it is executed on its own; the values stay ExecuTorch's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from xnnguard.compat import SUPPORTED_EXECUTORCH

__all__ = [
    "XNN_INVALID_VALUE_ID",
    "XNN_MAX_TENSOR_DIMS",
    "XNN_VALUE_FLAG_EXTERNAL_INPUT",
    "XNN_VALUE_FLAG_EXTERNAL_OUTPUT",
]


def _load() -> ModuleType:
    package = importlib.util.find_spec("executorch")
    if package is None or not package.submodule_search_locations:
        raise ImportError(f"xnnguard needs ExecuTorch (executorch{SUPPORTED_EXECUTORCH}) installed")
    path = Path(package.submodule_search_locations[0], "backends", "xnnpack", "utils", "xnnpack_constants.py")
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
