"""``verify_pte``: every check on one ``.pte``, statically and, on request, with the real runtime."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from xnnguard.runtime_check.checks import delegate_problems
from xnnguard.runtime_check.define_checks import define_problems
from xnnguard.runtime_check.kernel_limits import unsupported_input_problems
from xnnguard.runtime_check.missing_kernels import missing_kernel_problems, registered_operators
from xnnguard.runtime_check.pte_reader import PteReadError, PteSource, open_pte, read_methods, source_name
from xnnguard.runtime_check.report import Problem, Report
from xnnguard.runtime_check.xnnpack_blob import XNNPACK_BACKEND_ID, BlobFormatError, read_xnnpack_blob

__all__ = ["PteReadError", "assert_pte_ok", "verify_pte"]

logger = logging.getLogger("xnnguard.runtime_check")


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a program is read and checked.

    Reading a big delegate allocates tens of thousands of small acyclic objects, and each collection
    they trigger walks the whole heap (torch's included): on a 10,000-node delegate that is two thirds
    of the time. Reference counting frees what a check allocates; anything else waits for the next collection.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def verify_pte(source: PteSource, *, load: bool = False, run: bool = False, kernels: bool = True) -> Report:
    """Check every XNNPACK delegate of ``source`` (a path, bytes or memoryview).

    Static checks: tensor ranks, dataflow (values read but never written, outputs never written) and
    external ids, per method and delegate; with ``kernels``, operators outside the delegates that the
    installed runtime has no kernel for, or a kernel that cannot take their arguments (a 3-D
    convolution on the portable kernel). ``load`` also loads each method with the real runtime, ``run``
    also executes it once on generated inputs; their log lines go into ``Report.runtime_log``.

    Raises ``PteReadError`` (naming the input and the damage) when ``source`` is not a readable program.
    """
    name = source_name(source)
    load = load or run
    problems: list[Problem] = []
    delegates = nodes = values = 0
    other: list[str] = []
    with _gc_paused(), open_pte(source) as buffer:
        methods = read_methods(buffer, name)
        for method in methods:
            for delegate in method.delegates:
                if delegate.backend != XNNPACK_BACKEND_ID:
                    other.append(delegate.backend)
                    continue
                try:
                    graph = read_xnnpack_blob(delegate.blob)
                except BlobFormatError as error:
                    message = f"the XNNPACK blob is damaged: {error}"
                    problems.append(Problem("blob_format", message, method=method.name, delegate=delegate.index))
                    continue
                delegates += 1
                nodes += len(graph.nodes)
                values += len(graph.values)
                problems += delegate_problems(graph, delegate.calls, method.name, delegate.index)
                problems += define_problems(graph, delegate.calls, method.name, delegate.index)
    registered = registered_operators() if kernels else None
    if registered is not None:
        for method in methods:
            problems += missing_kernel_problems(method, registered)
    if kernels:
        for method in methods:
            problems += unsupported_input_problems(method)
    report = Report(
        source=name,
        problems=tuple(problems),
        methods=len(methods),
        delegates=delegates,
        nodes=nodes,
        values=values,
        other_delegates=tuple(sorted(set(other))),
    )
    if load and "blob_format" in report.kinds():
        # The runtime trusts a blob's internals more than its flatbuffer framing: do not feed it a damaged one.
        logger.warning("%s: not loaded, an XNNPACK blob is damaged", name)
    elif load:
        from xnnguard.runtime_check.runtime_load import load_and_run

        outcome = load_and_run(source, [method.name for method in methods], run=run)
        report = replace(
            report,
            problems=report.problems + tuple(outcome.problems),
            loaded=outcome.loaded,
            ran=outcome.ran,
            runtime_log=outcome.log,
        )
    logger.debug("%s", report.summary())
    return report


def assert_pte_ok(source: PteSource, *, load: bool = False, run: bool = False, kernels: bool = True) -> Report:
    """``verify_pte`` for tests: raises ``AssertionError`` listing every problem, returns the report otherwise."""
    report = verify_pte(source, load=load, run=run, kernels=kernels)
    if not report.ok:
        raise AssertionError(str(report))
    return report
