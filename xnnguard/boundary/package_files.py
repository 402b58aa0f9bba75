"""Files inside the installed ExecuTorch package, found without importing it.

``xnnguard verify`` reads the flatbuffers schemas, the XNNPACK constants and the runtime's libraries of
the installed release; importing ``executorch.backends.xnnpack`` for them would pull in the whole export
stack (seconds a file check need not pay). So the package folder is looked up once, here, and every file
read inside it is named relative to it.
"""

from __future__ import annotations

import importlib.util
import re
from functools import cache
from pathlib import Path

__all__ = [
    "FLATC",
    "FLAT_TENSOR_HEADER",
    "FLAT_TENSOR_SCHEMA",
    "PROGRAM_HEADER",
    "PROGRAM_SCHEMA",
    "XNNPACK_CONSTANTS",
    "XNNPACK_SCHEMA",
    "PackageFileError",
    "executorch_dir",
    "max_schema_version",
    "package_file",
]

# The files xnnguard reads, relative to the package folder (the same place in 1.4.0 to 1.5.1).
PROGRAM_SCHEMA = "exir/_serialize/program.fbs"  # the Program flatbuffer (and scalar_type.fbs, included)
XNNPACK_SCHEMA = "backends/xnnpack/serialization/runtime_schema.fbs"  # what the runtime reads of a blob
XNNPACK_CONSTANTS = "backends/xnnpack/utils/xnnpack_constants.py"  # XNN_MAX_TENSOR_DIMS, value flags
FLAT_TENSOR_SCHEMA = "extension/flat_tensor/serialize/flat_tensor.fbs"  # a .ptd file (external named data)
FLATC = "data/bin/flatc"  # the wheel's own flatc, which serialization runs
# The runtime's headers the wheel ships: the highest schema version its Program and FlatTensor loaders read.
PROGRAM_HEADER = "include/executorch/runtime/executor/program.h"
FLAT_TENSOR_HEADER = "include/executorch/extension/flat_tensor/flat_tensor_data_map.h"
_SCHEMA_VERSION = re.compile(r"kMaxSupportedSchemaVersion\s*=\s*(\d+)")


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


@cache
def max_schema_version(header: str) -> int | None:
    """``kMaxSupportedSchemaVersion`` in the runtime header ``header`` (``PROGRAM_HEADER``, ``FLAT_TENSOR_HEADER``):
    the highest schema version the runtime loads (ExecuTorch 1.5.1: 0). None when the release has no such
    limit (1.4's runtime does not check the version) or does not ship the header."""
    try:
        found = _SCHEMA_VERSION.search(package_file(header).read_text())
    except (PackageFileError, OSError):
        return None
    return None if found is None else int(found.group(1))
