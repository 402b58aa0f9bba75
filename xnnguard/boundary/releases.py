"""What differs between the ExecuTorch releases xnnguard supports, found in one place.

xnnguard supports ExecuTorch ``SUPPORTED_EXECUTORCH`` (1.4.0 to 1.5.x, each with torch 2.13 and torchao
0.18). ``import xnnguard`` refuses any other release (``require_supported_executorch``), because every
guarantee here was tested on these and a release outside fails somewhere inside instead.

Each difference is detected by what the installed release can do, not by its version string, and the
behaviour that depends on it says so where it lives:

* ``has_pre_decomposition_hook``: 1.5 calls ``Partitioner.transform_for_pre_decomposition`` in
  ``to_edge_transform_and_lower``; 1.4 has no such hook. ``xnnguard.XnnpackPartitioner`` then runs its
  pre-decomposition rewrites from ``ops_to_not_decompose`` (``xnnguard.partition.partitioner``).
* ``load_quantized_kernels``: the 1.4.0 wheel's ``libquantized_ops_aot_lib.so`` finds the runtime
  library it needs only once the runtime is loaded (a misspelled RUNPATH), and
  ``executorch.kernels.quantized`` swallows the failure; here the runtime is loaded and the library
  loaded again when the quantized out-variants are missing.
* ``ensure_flatc``: releases before 1.4 look for ``flatc`` on ``PATH`` and in ``FLATC_EXECUTABLE`` only,
  not in the wheel, so a venv used without activating it cannot serialize. Here ``FLATC_EXECUTABLE``
  points to the wheel's own ``flatc`` when nothing else would be found (harmless on 1.4+, which looks in
  the wheel first). Such releases are outside the supported range; this matters with
  ``XNNGUARD_ALLOW_UNSUPPORTED_EXECUTORCH=1`` only.
* ``has_runtime``: whether ExecuTorch's Python runtime loads here (1.3.1's, built against torch 2.12,
  does not on torch 2.13). The test suite skips what needs it.
* ``has_recipe_api``: whether ``executorch.export`` has the recipe registry ``xnnguard.recipes`` plugs into.
* ``has_bfloat16_opt_in``: whether the XNNPACK configs take bfloat16 when made with ``enable_bf16=True``
  (1.5; 1.4 takes no bfloat16). ``xnnguard.rules.bfloat16`` says what XNNPACK then runs.

Nothing here imports torch or ExecuTorch at module import: ``import xnnguard`` stays cheap.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import shutil
import warnings
from functools import cache
from pathlib import Path

from xnnguard.boundary.package_files import FLATC, executorch_dir

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

# The same range as pyproject.toml's dependency: the releases the test suite runs on (`make compat`).
SUPPORTED_EXECUTORCH = ">=1.4.0,<1.6"
_LOWEST = (1, 4, 0)
_BELOW = (1, 6, 0)
ALLOW_UNSUPPORTED_ENV = "XNNGUARD_ALLOW_UNSUPPORTED_EXECUTORCH"


class UnsupportedExecuTorchError(ImportError):
    """The installed ExecuTorch is outside the releases xnnguard supports (or is missing)."""


UnsupportedExecuTorchError.__module__ = "xnnguard.compat"  # where users catch it, and what a traceback names


def executorch_version() -> str | None:
    """The installed ExecuTorch's version (``"1.5.1"``), or None when ExecuTorch is not installed."""
    try:
        return importlib.metadata.version("executorch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, int, int] | None:
    """``"1.5.1+cpu"`` -> (1, 5, 1); None for a string that does not start with a release number."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if found is None:
        return None
    major, minor, micro = found.groups()
    return int(major), int(minor), int(micro or 0)


def is_supported(version: str) -> bool:
    """True for a release in ``SUPPORTED_EXECUTORCH``, judged by its release number (``1.6.0.dev1`` is outside)."""
    release = _release(version)
    return release is not None and _LOWEST <= release < _BELOW


def require_supported_executorch() -> None:
    """Raise ``UnsupportedExecuTorchError`` unless the installed ExecuTorch is a supported release.

    With ``XNNGUARD_ALLOW_UNSUPPORTED_EXECUTORCH=1`` an unsupported release only warns: for trying a
    newer release, or lowering (not running) with 1.3.1 on torch 2.13.
    """
    version = executorch_version()
    if version is not None and is_supported(version):
        return
    installed = "no ExecuTorch is installed" if version is None else f"ExecuTorch {version} is installed"
    message = (
        f"xnnguard supports ExecuTorch {SUPPORTED_EXECUTORCH} (1.4.0, 1.4.1, 1.5.0, 1.5.1 tested), but {installed}: "
        f"pip install 'executorch{SUPPORTED_EXECUTORCH}'"
    )
    if version is not None and os.environ.get(ALLOW_UNSUPPORTED_ENV) == "1":
        warnings.warn(f"{message} ({ALLOW_UNSUPPORTED_ENV}=1: going on untested)", stacklevel=2)
        ensure_flatc()
        return
    raise UnsupportedExecuTorchError(f"{message} (or set {ALLOW_UNSUPPORTED_ENV}=1 to try it untested)")


def ensure_flatc() -> None:
    """Point ``FLATC_EXECUTABLE`` to the wheel's ``flatc`` when ExecuTorch before 1.4 would find none.

    Those releases look on ``PATH`` and in ``FLATC_EXECUTABLE`` only, so ``.venv/bin/python`` run
    without activating the venv fails to serialize any XNNPACK delegate (``FileNotFoundError: 'flatc'``).
    Set before the first serialization (ExecuTorch caches the path it found).
    """
    if os.environ.get("FLATC_EXECUTABLE") or shutil.which("flatc"):
        return
    root = executorch_dir()
    bundled = root / FLATC if root is not None else None
    if bundled is not None and bundled.is_file():
        os.environ["FLATC_EXECUTABLE"] = str(bundled)


@cache
def has_pre_decomposition_hook() -> bool:
    """True when ``to_edge_transform_and_lower`` calls ``Partitioner.transform_for_pre_decomposition`` (1.5+).

    The base class defines the method in exactly the releases whose lowering calls it.
    """
    from executorch.exir.backend.partitioner import Partitioner

    return hasattr(Partitioner, "transform_for_pre_decomposition")


@cache
def has_runtime() -> bool:
    """True when ExecuTorch's Python runtime (``portable_lib``) loads with the installed torch."""
    try:
        importlib.import_module("executorch.extension.pybindings.portable_lib")
    except ImportError:
        return False
    return True


def quantized_kernels_loaded() -> bool:
    """True when the quantized_decomposed out-variants (what ``to_executorch()`` needs for q/dq) are registered."""
    import torch

    namespace = torch.ops.quantized_decomposed
    return all(hasattr(getattr(namespace, op, None), "out") for op in ("quantize_per_tensor", "dequantize_per_tensor"))


def load_quantized_kernels() -> None:
    """Register ExecuTorch's quantized out-variants, which q/dq left outside XNNPACK need at ``to_executorch()``.

    ``import executorch.kernels.quantized`` does it, except on a wheel whose kernel library loads only
    once the runtime library is loaded (1.4.0): its import logs the failure at INFO and goes on, and a
    second import does nothing. So when the out-variants are still missing the runtime is loaded and the
    library loaded again. Raises ``RuntimeError`` when they cannot be registered at all.
    """
    if quantized_kernels_loaded():
        return
    import executorch.kernels.quantized as quantized_kernels

    if quantized_kernels_loaded():
        return
    import torch

    libraries = sorted(Path(next(iter(quantized_kernels.__path__))).glob("libquantized_ops_aot_lib*.so"))
    if has_runtime():  # the runtime library the kernel library is linked against, now loaded
        for library in libraries:
            torch.ops.load_library(str(library))
    if not quantized_kernels_loaded():
        raise RuntimeError(
            "ExecuTorch's quantized kernels (quantized_decomposed::*.out) cannot be loaded with this torch and "
            f"ExecuTorch ({executorch_version()}): a program with quantize/dequantize outside XNNPACK cannot be "
            f"serialized; libraries tried: {[str(library) for library in libraries]}"
        )


@cache
def has_recipe_api() -> bool:
    """True when ``executorch.export`` has the recipe registry and provider class ``xnnguard.recipes`` uses."""
    try:
        export = importlib.import_module("executorch.export")
    except ImportError:
        return False
    names = ("BackendRecipeProvider", "ExportRecipe", "RecipeType", "recipe_registry", "export")
    return all(hasattr(export, name) for name in names)


@cache
def has_bfloat16_opt_in() -> bool:
    """True when ExecuTorch's XNNPACK configs take bfloat16 if made with ``enable_bf16=True`` (1.5)."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS

    return bool(getattr(ALL_PARTITIONER_CONFIGS[0](enable_bf16=True), "enable_bf16", False))
