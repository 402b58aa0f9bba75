"""Operators a method calls outside its delegates that the installed runtime has no kernel for, and
delegates of a backend it does not register.

Found today only when the method is loaded (``kernel 'aten::max_pool3d_with_indices.out' not found``);
the runtime's registry can be asked up front. The installed runtime is ExecuTorch's Python runtime
with its quantized kernels (``executorch.kernels.quantized``), which programs with q/dq left outside
XNNPACK need anyway.

Asking the registry means importing the runtime, which imports torch: seconds that a static check of
one file should not cost. So the registry is read once per installed runtime, in a child process, and
kept in a small cache file keyed by the runtime libraries' paths, sizes and modification times
(``$XNNGUARD_CACHE_DIR``, else ``$XDG_CACHE_HOME/xnnguard``, else ``~/.cache/xnnguard``). A process that
has imported the runtime already (``--load``, tests) asks it directly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from contextlib import suppress
from functools import cache
from pathlib import Path

from xnnguard.boundary.package_files import executorch_dir
from xnnguard.boundary.runtime import RUNTIME_LIBRARY_DIRS, backend_names, operator_names, runtime_imported
from xnnguard.runtime_check.pte_reader import Method
from xnnguard.runtime_check.report import Problem

__all__ = [
    "missing_backend_problems",
    "missing_kernel_problems",
    "registered_backends",
    "registered_operators",
    "runtime_fingerprint",
]

logger = logging.getLogger("xnnguard.runtime_check")

_PRINT_REGISTRY = (
    "import json, sys, warnings\n"
    "warnings.simplefilter('ignore')\n"
    "from xnnguard.runtime_check.missing_kernels import _live_backends, _live_registry\n"
    "json.dump({'operators': sorted(_live_registry()), 'backends': sorted(_live_backends())}, sys.stdout)\n"
)


def _live_registry() -> frozenset[str]:
    """The registry of the runtime imported into this process (imports it if needed)."""
    from xnnguard.runtime_check.runtime_load import import_runtime

    import_runtime()  # with its quantized kernels registered
    return operator_names()


def _live_backends() -> frozenset[str]:
    """The backends registered in the runtime imported into this process (imports it if needed)."""
    from xnnguard.runtime_check.runtime_load import import_runtime

    import_runtime()
    return backend_names()


def runtime_fingerprint() -> str | None:
    """A digest of the installed runtime's shared libraries (path, size, mtime); None without ExecuTorch."""
    root = executorch_dir()
    if root is None:
        return None
    entries = []
    for directory in RUNTIME_LIBRARY_DIRS:
        for library in sorted((root / directory).glob("*.so*")):
            status = library.stat()
            entries.append(f"{library}:{status.st_size}:{status.st_mtime_ns}")
    if not entries:
        return None
    return hashlib.sha256("\n".join([sys.executable, *entries]).encode()).hexdigest()[:24]


def _cache_directory() -> Path:
    if configured := os.environ.get("XNNGUARD_CACHE_DIR"):
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "xnnguard")


def _registry_from_child() -> frozenset[str] | None:
    """Ask a child process (which imports the runtime there, not here) for its operators."""
    found = _registries_from_child()
    return None if found is None else found[0]


def _registries_from_child() -> tuple[frozenset[str], frozenset[str]] | None:
    """Ask a child process for its operators and its backends."""
    try:
        result = subprocess.run(
            [sys.executable, "-c", _PRINT_REGISTRY],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        found = json.loads(result.stdout)
        return frozenset(found["operators"]), frozenset(found["backends"])
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError) as error:
        logger.warning("cannot read the ExecuTorch runtime's kernel registry (%s); kernel check skipped", error)
        return None


def _store(path: Path, names: frozenset[str]) -> None:
    """Write the cache atomically; a cache that cannot be written only costs the next run its child."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as file:
            json.dump(sorted(names), file)
        os.replace(file.name, path)
    except OSError as error:
        logger.info("kernel registry not cached (%s)", error)


@cache
def _registries() -> tuple[frozenset[str], frozenset[str] | None] | None:
    """(operators, backends) of the installed runtime: from this process if it has the runtime, else from the
    cache files, else from a child (then cached). Backends are None when only an older cache has operators."""
    if runtime_imported():
        return _live_registry(), _live_backends()
    fingerprint = runtime_fingerprint()
    if fingerprint is None:
        logger.warning("no ExecuTorch runtime to ask for kernels; kernel check skipped")
        return None
    operators_path = _cache_directory() / f"kernels-{fingerprint}.json"
    backends_path = _cache_directory() / f"backends-{fingerprint}.json"
    with suppress(OSError, ValueError):
        names = frozenset(json.loads(operators_path.read_text()))
        logger.debug("kernel registry from %s", operators_path)
        backends = None
        with suppress(OSError, ValueError):
            backends = frozenset(json.loads(backends_path.read_text()))
        if backends is not None:
            return names, backends
    logger.info("reading the ExecuTorch runtime's kernel registry once (cached in %s)", operators_path.parent)
    found = _registries_from_child()
    if found is not None:
        _store(operators_path, found[0])
        _store(backends_path, found[1])
    return found


def registered_operators() -> frozenset[str] | None:
    """Names (``"aten::add.out"``) of every operator the installed runtime has a kernel for; None without a runtime."""
    found = _registries()
    return None if found is None else found[0]


def registered_backends() -> frozenset[str] | None:
    """Names (``"XnnpackBackend"``) of every backend the installed runtime registers; None without a runtime."""
    found = _registries()
    return None if found is None else found[1]


def _looks_damaged(backend: str, registered: frozenset[str]) -> bool:
    """A backend id that is not printable ASCII, or one byte off a registered one (``XnnpackBackenc``)."""
    if not backend.isascii() or not backend.isprintable():
        return True
    return any(
        len(name) == len(backend) and sum(a != b for a, b in zip(name, backend)) == 1 for name in registered
    )


def missing_backend_problems(method: Method, registered: frozenset[str]) -> list[Problem]:
    """Delegates whose backend id is a damaged one: the runtime registers no such backend, so loading the
    method fails ("Backend %s is not registered", ``method.cpp:84``). An id the runtime does not register but
    that looks like another backend's name (a runtime built for a device has backends this one lacks) is not
    a problem: such delegates are listed as not checked."""
    return [
        Problem(
            "missing_backend",
            f"delegate {delegate.index} is for backend {delegate.backend!r}, which the runtime does not register "
            "(a damaged id): loading the method fails",
            method=method.name,
            delegate=delegate.index,
        )
        for delegate in method.delegates
        if delegate.backend not in registered and _looks_damaged(delegate.backend, registered)
    ]


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
