"""Files inside the installed ExecuTorch package, found without importing it.

``xnnguard verify`` reads the flatbuffers schemas, the XNNPACK constants and the runtime's libraries of
the installed release; importing ``executorch.backends.xnnpack`` for them would pull in the whole export
stack (seconds a file check need not pay). So the package folder is looked up once, here, and every file
read inside it is named relative to it.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

__all__ = [
    "FLATC",
    "PROGRAM_SCHEMA",
    "XNNPACK_CONSTANTS",
    "XNNPACK_SCHEMA",
    "PackageFileError",
    "executorch_dir",
    "package_file",
]

# The files xnnguard reads, relative to the package folder (the same place in 1.4.0 to 1.5.1).
PROGRAM_SCHEMA = "exir/_serialize/program.fbs"  # the Program flatbuffer (and scalar_type.fbs, included)
XNNPACK_SCHEMA = "backends/xnnpack/serialization/runtime_schema.fbs"  # what the runtime reads of a blob
XNNPACK_CONSTANTS = "backends/xnnpack/utils/xnnpack_constants.py"  # XNN_MAX_TENSOR_DIMS, value flags
FLATC = "data/bin/flatc"  # the wheel's own flatc, which serialization runs


class PackageFileError(ImportError):
    """ExecuTorch is not installed, or the installed release lacks a file xnnguard reads."""


@cache
def executorch_dir() -> Path | None:
    """The installed ``executorch`` package's folder, or None when it is not installed."""
    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def package_file(relative_path: str) -> Path:
    """``relative_path`` inside the installed ExecuTorch (``"exir/_serialize/program.fbs"``), which must exist."""
    root = executorch_dir()
    if root is None:
        raise PackageFileError("the executorch package is not installed")
    path = root / relative_path
    if not path.exists():
        raise PackageFileError(f"the installed ExecuTorch has no {relative_path} ({path})")
    return path
