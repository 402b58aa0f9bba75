"""ExecuTorch's Python runtime (``executorch.extension.pybindings.portable_lib``), as xnnguard uses it.

Every function the pybindings export starts with an underscore, the documented ones too
(``_load_for_executorch_from_buffer``): this module is the one place xnnguard calls them. The runtime reads
the caller's buffer in place, so whoever loads from ``bytes`` keeps them alive as long as the program or
module made from them.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any

__all__ = [
    "RUNTIME_LIBRARY_DIRS",
    "load_module",
    "load_program",
    "operator_names",
    "pybindings",
    "reset_threadpool",
    "runtime_imported",
]

# The native extension portable_lib imports: present in sys.modules once the runtime is loaded.
_NATIVE_MODULE = "executorch.extension.pybindings._C"

# Folders of the package whose shared libraries make up the runtime and its kernels (relative to it).
RUNTIME_LIBRARY_DIRS = ("extension/pybindings", "kernels/quantized", "lib")


def pybindings() -> ModuleType:
    """``portable_lib``, imported (it prints on import: callers that care capture stderr around this)."""
    from executorch.extension.pybindings import portable_lib

    return portable_lib


def runtime_imported() -> bool:
    """True when this process has loaded the runtime's native library already."""
    return _NATIVE_MODULE in sys.modules


def load_program(source: str | os.PathLike[str] | bytes) -> Any:
    """A ``Program`` (its methods loaded one by one with ``load_method``) from a path or the bytes of a ``.pte``."""
    runtime = pybindings()
    if isinstance(source, (str, os.PathLike)):
        return runtime._load_program(os.fspath(source))
    return runtime._load_program_from_buffer(bytes(source))


def load_module(source: str | os.PathLike[str] | bytes) -> Any:
    """A ``Module`` (``forward(inputs)``) from a path or the bytes of a ``.pte``; all methods load at once."""
    runtime = pybindings()
    if isinstance(source, (str, os.PathLike)):
        return runtime._load_for_executorch(os.fspath(source))
    return runtime._load_for_executorch_from_buffer(source)


def operator_names() -> frozenset[str]:
    """The operators the runtime has kernels registered for (``aten::add.out``, ...)."""
    return frozenset(pybindings()._get_operator_names())


def reset_threadpool(threads: int) -> None:
    """Size the runtime's thread pool; a delegate keeps the pool it saw when it was loaded, so call this first."""
    pybindings()._unsafe_reset_threadpool(threads)
