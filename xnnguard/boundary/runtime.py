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
    "DataFileNotSupported",
    "backend_names",
    "load_module",
    "load_program",
    "operator_names",
    "pybindings",
    "reset_threadpool",
    "runtime_imported",
]

# Imported once the runtime is loaded (it imports the native extension, ``_C`` in 1.5, ``_portable_lib`` in 1.4).
_RUNTIME_MODULE = "executorch.extension.pybindings.portable_lib"

# Folders of the package whose shared libraries make up the runtime and its kernels (relative to it).
RUNTIME_LIBRARY_DIRS = ("extension/pybindings", "kernels/quantized", "lib")


def pybindings() -> ModuleType:
    """``portable_lib``, imported (it prints on import: callers that care capture stderr around this)."""
    from executorch.extension.pybindings import portable_lib

    return portable_lib


def runtime_imported() -> bool:
    """True when this process has loaded the runtime's native library already."""
    return _RUNTIME_MODULE in sys.modules


class DataFileNotSupported(RuntimeError):
    """This runtime's bindings cannot be given a ``.ptd`` when they load a program (ExecuTorch 1.4's)."""


def load_program(source: str | os.PathLike[str] | bytes, data_path: str | None = None) -> Any:
    """A ``Program`` (its methods loaded one by one with ``load_method``) from a path or the bytes of a ``.pte``,
    with the external named data of ``data_path`` (a ``.ptd``) when given.

    Loaded with ``Verification::InternalConsistency`` (the flatbuffers verifier and ``validate_program``), as
    the bindings' ``Module`` loads: a program that loads this way loads with ``Minimal`` too.
    """
    runtime = pybindings()
    options: dict[str, Any] = {"program_verification": runtime.Verification.InternalConsistency}
    if data_path is not None:
        options["data_path"] = data_path
    try:
        if isinstance(source, (str, os.PathLike)):
            return runtime._load_program(os.fspath(source), **options)
        return runtime._load_program_from_buffer(bytes(source), **options)
    except TypeError as error:  # 1.4's bindings have no data_path argument
        if data_path is not None and "incompatible function arguments" in str(error):
            raise DataFileNotSupported("this ExecuTorch runtime cannot load a program with a .ptd file") from None
        raise


def load_module(source: str | os.PathLike[str] | bytes, etdump: bool = False) -> Any:
    """A ``Module`` (``forward(inputs)``) from a path or the bytes of a ``.pte``; all methods load at once.

    ``etdump``: record an ETDump of every execution (each XNNPACK operator's time among its events),
    written by the module's ``write_etdump_result_to_file(path)``: the per-op profile of
    ``benchmarks.profile_ops``.
    """
    runtime = pybindings()
    if isinstance(source, (str, os.PathLike)):
        return runtime._load_for_executorch(os.fspath(source), enable_etdump=etdump)
    return runtime._load_for_executorch_from_buffer(source, enable_etdump=etdump)


def operator_names() -> frozenset[str]:
    """The operators the runtime has kernels registered for (``aten::add.out``, ...)."""
    return frozenset(pybindings()._get_operator_names())


def backend_names() -> frozenset[str]:
    """The backends registered in the runtime (``XnnpackBackend``, ...), available here or not."""
    return frozenset(pybindings()._get_registered_backend_names())


def reset_threadpool(threads: int) -> None:
    """Size the runtime's thread pool; a delegate keeps the pool it saw when it was loaded, so call this first."""
    pybindings()._unsafe_reset_threadpool(threads)
