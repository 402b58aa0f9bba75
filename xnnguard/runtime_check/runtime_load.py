"""Load (and optionally run) a program with the real ExecuTorch runtime, capturing what it logs.

The static checks say what *will* fail; this asks the runtime itself. Its log lines are captured into
the report instead of landing on the terminal: the pybindings print them through ``sys.stderr`` and
native libraries write to file descriptor 2, so both point at one temporary file for the duration.
Both are process-wide, so one load runs at a time per process (the CLI parallelizes with processes).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from xnnguard.boundary.releases import load_quantized_kernels
from xnnguard.boundary.runtime import load_program, pybindings
from xnnguard.runtime_check.report import Problem

__all__ = ["RuntimeOutcome", "StderrCapture", "captured_stderr", "import_runtime", "load_and_run"]

logger = logging.getLogger("xnnguard.runtime_check")

_LOG_LIMIT = 64 * 1024  # keep the last 64 KiB of runtime log per file
_stderr_lock = threading.RLock()  # reentrant: importing the runtime captures inside a load that captures

# ExecuTorch ScalarType code -> torch dtype name, for generating inputs of the declared dtype.
_SCALAR_TYPES = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "float16",
    6: "float32",
    7: "float64",
    11: "bool",
    15: "bfloat16",
}


@dataclass
class RuntimeOutcome:
    problems: list[Problem] = field(default_factory=list)
    log: str = ""
    loaded: bool = False
    ran: bool = False


class StderrCapture:
    """Text written to stderr while capturing; ``mark()`` then ``text(mark)`` gives one step's lines."""

    def __init__(self, sink: Any) -> None:
        self._sink = sink

    def mark(self) -> int:
        sys.stderr.flush()
        return os.fstat(self._sink.fileno()).st_size

    def text(self, start: int = 0) -> str:
        end = self.mark()
        start = max(start, end - _LOG_LIMIT)
        return os.pread(self._sink.fileno(), end - start, start).decode("utf-8", errors="replace")


@contextmanager
def captured_stderr() -> Iterator[StderrCapture]:
    """Send ``sys.stderr`` and fd 2 to one temporary file while the block runs.

    The pybindings write the runtime's log through ``sys.stderr``; XNNPACK and cpuinfo write to fd 2.
    """
    with _stderr_lock, tempfile.TemporaryFile(mode="w+b") as sink:
        sys.stderr.flush()
        saved_fd, saved_stream = os.dup(2), sys.stderr
        os.dup2(sink.fileno(), 2)
        # Not a with block: the stream must outlive the yield. The finally below closes it.
        sys.stderr = open(os.dup(sink.fileno()), "w", encoding="utf-8", errors="replace", buffering=1)  # noqa: SIM115
        try:
            yield StderrCapture(sink)
        finally:
            sys.stderr.close()
            sys.stderr = saved_stream
            os.dup2(saved_fd, 2)
            os.close(saved_fd)


# The runtime's log lines that explain a failure: ExecuTorch words them "failed", "error", "not found"
# ("kernel 'aten::max_pool3d_with_indices.out' not found", the 0x14 of a missing kernel), "missing", "invalid"...
_EXPLAINS = re.compile(r"fail|error|not found|missing|invalid|unsupported|mismatch|cannot|expect", re.IGNORECASE)


def _runtime_errors(log: str) -> str:
    """The runtime's own explanation: the log lines that say something failed (not cpuinfo's probing)."""
    lines = [line.strip() for line in log.splitlines() if _EXPLAINS.search(line)]
    return "; ".join(line for line in lines if not line.startswith("[cpuinfo"))[-1000:]


def _inputs(meta: Any) -> list[Any] | None:
    """Generated inputs of the declared shapes and dtypes, or None when one is not a tensor we can make."""
    import torch

    generator = torch.Generator().manual_seed(0)
    inputs = []
    for index in range(meta.num_inputs()):
        try:
            info = meta.input_tensor_meta(index)
        except Exception:  # a non-tensor input: the runtime raises for it
            return None
        dtype_name = _SCALAR_TYPES.get(info.dtype())
        if dtype_name is None:
            return None
        dtype = getattr(torch, dtype_name)
        sizes = tuple(info.sizes())
        if dtype.is_floating_point:
            inputs.append(torch.randn(sizes, generator=generator).to(dtype))
        else:
            inputs.append(torch.zeros(sizes, dtype=dtype))
    return inputs


def import_runtime() -> Any:
    """The runtime's pybindings with the quantized kernels registered, imported once per process.

    Importing them prints: torchao's optional CUDA extensions, ExecuTorch's experimental-API warning,
    native lines. That goes to the captured stream, not to the user's terminal.
    """
    with captured_stderr(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        portable_lib = pybindings()

        # q/dq left outside XNNPACK need these kernels (a shipped runtime links them); on 1.4.0 they
        # register only once the runtime is loaded, whatever was imported first
        with suppress(ImportError, RuntimeError):
            load_quantized_kernels()
    return portable_lib


def _loaded_program(source: Any, data_path: str | None) -> Any:
    import_runtime()  # with its quantized kernels registered, and its import noise captured
    return load_program(source, data_path)


def _failure(kind: str, what: str, error: BaseException, log: str, method: str | None = None) -> Problem:
    explanation = _runtime_errors(log)
    return Problem(kind, f"{what}: {error}" + (f" ({explanation})" if explanation else ""), method=method)


def load_and_run(source: Any, method_names: list[str], *, run: bool, data_path: str | None = None) -> RuntimeOutcome:
    """Load every method of ``source`` (a path or bytes, with the ``.ptd`` at ``data_path`` if given); with
    ``run``, execute each once on generated inputs."""
    outcome = RuntimeOutcome()
    with captured_stderr() as capture:
        mark = capture.mark()
        try:
            program = _loaded_program(source, data_path)
        except Exception as error:  # the runtime reports each failure as an exception with its message
            outcome.problems.append(_failure("load", "the runtime cannot load the program", error, capture.text(mark)))
            outcome.log = capture.text()
            return outcome
        methods: dict[str, Any] = {}
        for name in method_names:
            mark = capture.mark()
            try:
                methods[name] = program.load_method(name)
            except Exception as error:
                outcome.problems.append(
                    _failure("load", "the runtime cannot load the method", error, capture.text(mark), name)
                )
        outcome.loaded = len(methods) == len(method_names)
        ran = []
        for name, method in methods.items() if run else ():
            inputs = _inputs(method.method_meta())
            if inputs is None:
                logger.info("not running %s: an input is not a tensor of a known dtype", name)
                continue
            mark = capture.mark()
            try:
                method.call(inputs)
                ran.append(name)
            except Exception as error:
                outcome.problems.append(
                    _failure("run", "the method fails on generated inputs", error, capture.text(mark), name)
                )
        outcome.ran = bool(ran) and len(ran) == len(method_names)
        outcome.log = capture.text()
    return outcome
