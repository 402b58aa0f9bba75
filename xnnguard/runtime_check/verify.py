"""``verify_pte``: every check on one ``.pte``, statically and, on request, with the real runtime.

Importing this module and a static check import neither torch nor the runtime: the kernel registry
comes from a cache (``missing_kernels``), and the runtime is imported only for ``load``/``run``.
"""

from __future__ import annotations

import gc
import logging
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from xnnguard.runtime_check.checks import delegate_problems
from xnnguard.runtime_check.define_checks import define_problems
from xnnguard.runtime_check.kernel_limits import Dependencies, output_dependencies, unsupported_input_problems
from xnnguard.runtime_check.missing_kernels import missing_kernel_problems, registered_operators
from xnnguard.runtime_check.pte_reader import Method, PteReadError, PteSource, open_pte, read_program, source_name
from xnnguard.runtime_check.report import MethodCoverage, Problem, Report
from xnnguard.runtime_check.weights import WeightCheck, check_weights
from xnnguard.runtime_check.xnnpack_blob import XNNPACK_BACKEND_ID, BlobFormatError, XnnGraph, read_xnnpack_blob

__all__ = ["PteReadError", "assert_pte_ok", "verify_pte", "warm_up"]

logger = logging.getLogger("xnnguard.runtime_check")

_PRIM_OPERATORS = "executorch_prim::"  # symbolic-size bookkeeping, not compute (see MethodCoverage)


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


def _most_first(counts: Counter[str]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _coverage(method: Method, graphs: list[XnnGraph]) -> MethodCoverage:
    inside = Counter(node.op for graph in graphs for node in graph.nodes)
    outside = Counter(call.operator for call in method.kernel_calls if not call.operator.startswith(_PRIM_OPERATORS))
    others = tuple(d.backend for d in method.delegates if d.backend != XNNPACK_BACKEND_ID)
    return MethodCoverage(method.name, len(graphs), _most_first(inside), _most_first(outside), others)


def warm_up() -> None:
    """Parse the FlatBuffers schemas the readers use (cached per process), e.g. before forking workers."""
    from xnnguard.runtime_check.pte_reader import _program_schema
    from xnnguard.runtime_check.xnnpack_blob import _schema

    _program_schema()
    _schema()


def verify_pte(
    source: PteSource, *, load: bool = False, run: bool = False, kernels: bool = True, weights: bool = False
) -> Report:
    """Check every XNNPACK delegate of ``source`` (a path, bytes or memoryview).

    Static checks, per method and delegate: tensor ranks, dataflow (values read but never written, outputs
    never written), external ids, and what XNNPACK checks when it defines, creates and first reshapes each
    node (``define_checks``); with ``kernels``, operators outside the delegates that the installed runtime
    has no kernel for, or a kernel that cannot take their arguments (a 3-D convolution on the portable
    kernel). ``weights`` also hashes every named XNNPACK constant and compares it with its name (reads
    every weight byte). ``load`` also loads each method with the real runtime, ``run`` also executes it
    once on generated inputs; their log lines go into ``Report.runtime_log``. The report's ``coverage``
    says, per method, what runs in XNNPACK and which operators run outside it.

    Raises ``PteReadError`` (naming the input and the damage) when ``source`` is not a readable program.
    """
    started = time.perf_counter()
    name = source_name(source)
    load = load or run
    problems: list[Problem] = []
    coverage: list[MethodCoverage] = []
    delegates = nodes = values = 0
    other: list[str] = []
    weight_check = WeightCheck() if weights else None
    dependencies: Dependencies = {}
    with _gc_paused(), open_pte(source) as buffer:
        program = read_program(buffer, name)
        methods = program.methods
        for method in methods:
            graphs: list[tuple[int, XnnGraph]] = []
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
                graphs.append((delegate.index, graph))
                dependencies.update(output_dependencies(delegate.index, graph))
                delegates += 1
                nodes += len(graph.nodes)
                values += len(graph.values)
                problems += delegate_problems(graph, delegate.calls, method.name, delegate.index)
                problems += define_problems(graph, delegate.calls, method.name, delegate.index)
            coverage.append(_coverage(method, [graph for _, graph in graphs]))
            if weight_check is not None:
                check_weights(
                    buffer, ((method.name, index, graph) for index, graph in graphs), program.named_data, weight_check
                )
    notes: list[str] = []
    registered = registered_operators() if kernels else None
    if registered is not None:
        for method in methods:
            problems += missing_kernel_problems(method, registered)
    elif kernels:
        notes.append("the ExecuTorch runtime's kernel registry could not be read: operators outside were not checked")
    if kernels:
        for method in methods:
            problems += unsupported_input_problems(method, dependencies)
    if weight_check is not None:
        problems += weight_check.problems
        notes += weight_check.notes()
    report = Report(
        source=name,
        problems=tuple(problems),
        methods=len(methods),
        delegates=delegates,
        nodes=nodes,
        values=values,
        other_delegates=tuple(sorted(set(other))),
        coverage=tuple(coverage),
        weights_checked=weight_check.checked if weight_check is not None else None,
        notes=tuple(notes),
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
    logger.info("%s (%.0f ms)", report.summary(), 1000 * (time.perf_counter() - started))
    return report


def assert_pte_ok(
    source: PteSource, *, load: bool = False, run: bool = False, kernels: bool = True, weights: bool = False
) -> Report:
    """``verify_pte`` for tests: raises ``AssertionError`` listing every problem, returns the report otherwise."""
    report = verify_pte(source, load=load, run=run, kernels=kernels, weights=weights)
    if not report.ok:
        raise AssertionError(str(report))
    return report
