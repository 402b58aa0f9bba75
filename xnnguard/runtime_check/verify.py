"""``verify_pte``: every check on one ``.pte``, statically and, on request, with the real runtime.

Importing this module and a static check import neither torch nor the runtime: the kernel registry
comes from a cache (``missing_kernels``), and the runtime is imported only for ``load``/``run``.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from xnnguard.boundary.runtime import DataFileNotSupported
from xnnguard.runtime_check.allocations import allocation_problems, method_memory
from xnnguard.runtime_check.checks import delegate_problems
from xnnguard.runtime_check.define_checks import define_problems
from xnnguard.runtime_check.kernel_limits import Dependencies, output_dependencies, unsupported_input_problems
from xnnguard.runtime_check.missing_kernels import (
    missing_backend_problems,
    missing_kernel_problems,
    registered_backends,
    registered_operators,
)
from xnnguard.runtime_check.named_data import data_maps, external_constant_problems, named_data_problems
from xnnguard.runtime_check.ptd_reader import DataFile, read_data_file
from xnnguard.runtime_check.pte_reader import (
    Method,
    Program,
    PteReadError,
    PteSource,
    open_pte,
    read_program,
    source_name,
)
from xnnguard.runtime_check.report import MethodCoverage, MethodMemory, Problem, Report
from xnnguard.runtime_check.weights import WeightCheck, check_weights
from xnnguard.runtime_check.xnnpack_blob import (
    XNNPACK_BACKEND_ID,
    BlobFormatError,
    GraphRejected,
    XnnGraph,
    read_xnnpack_blob,
)

__all__ = ["PteReadError", "assert_pte_ok", "verify_pte", "warm_up"]

logger = logging.getLogger("xnnguard.runtime_check")

PathOrData = str | os.PathLike[str] | DataFile
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


@dataclass
class _Read:
    """A program as the checks see it: its methods, every XNNPACK graph that could be read (by method, with
    its delegate index), the problem of each that could not (by method and delegate index), and the
    backends not checked."""

    program: Program
    graphs: dict[str, list[tuple[int, XnnGraph]]] = field(default_factory=dict)
    unreadable: dict[tuple[str, int], Problem] = field(default_factory=dict)
    other_backends: list[str] = field(default_factory=list)

    def all_graphs(self) -> Iterator[tuple[str, int, XnnGraph]]:
        for method, graphs in self.graphs.items():
            for index, graph in graphs:
                yield method, index, graph


def _read(buffer: Any, name: str) -> _Read:
    """Stage 1: the program and its XNNPACK graphs."""
    read = _Read(read_program(buffer, name))
    for method in read.program.methods:
        graphs = read.graphs.setdefault(method.name, [])
        for delegate in method.delegates:
            if delegate.backend != XNNPACK_BACKEND_ID:
                read.other_backends.append(delegate.backend)
                continue
            try:
                graphs.append((delegate.index, read_xnnpack_blob(delegate.blob)))
            except GraphRejected as rejected:
                message = (
                    f"the runtime's flatbuffers verifier rejects the XNNPACK graph at {rejected.path}: "
                    f'{rejected.reason}: the runtime fails to load the method ("FlatBuffer verification failed")'
                )
                problem = Problem("flatbuffer", message, method=method.name, delegate=delegate.index)
                read.unreadable[method.name, delegate.index] = problem
            except BlobFormatError as error:
                message = f"the XNNPACK blob is damaged: {error}"
                problem = Problem("blob_format", message, method=method.name, delegate=delegate.index)
                read.unreadable[method.name, delegate.index] = problem
    return read


def _delegate_problems(read: _Read) -> list[Problem]:
    """Stage 2: what the runtime checks of each XNNPACK delegate when it loads and first runs it, delegate by
    delegate (one that cannot be read is its ``blob_format`` problem)."""
    problems: list[Problem] = []
    for method in read.program.methods:
        failure = read.program.load_failures.get(method.name)
        if failure is not None:
            problems.append(Problem("method_load", failure, method=method.name))
        graphs = dict(read.graphs[method.name])
        for delegate in method.delegates:
            if (method.name, delegate.index) in read.unreadable:
                problems.append(read.unreadable[method.name, delegate.index])
            elif delegate.index in graphs:
                graph = graphs[delegate.index]
                problems += delegate_problems(graph, delegate.calls, method.name, delegate.index)
                problems += define_problems(graph, delegate.calls, method.name, delegate.index)
    return problems


def _named_data_problems(read: _Read, data_files: Sequence[DataFile]) -> list[Problem]:
    """Stage 3: every constant an XNNPACK delegate fetches by key is in the named data the runtime searches."""
    maps = data_maps(read.program, data_files)
    problems = [
        problem
        for method, index, graph in read.all_graphs()
        for problem in named_data_problems(graph, maps, method, index)
    ]
    for method_name, keys in read.program.external_constants.items():
        problems += external_constant_problems(method_name, keys, data_files)
    return problems


def _allocations(read: _Read, max_memory: int | None) -> tuple[list[Problem], list[MethodMemory]]:
    """Stage 4: what each method needs (``Report.memory``), sizes that cannot be allocated, and ``max_memory``."""
    problems: list[Problem] = []
    memory: list[MethodMemory] = []
    for method in read.program.methods:
        graphs = read.graphs[method.name]
        needs = method_memory(method, [graph for _, graph in graphs])
        memory.append(needs)
        problems += allocation_problems(method, graphs, needs, max_memory)
    return problems, memory


def _operator_problems(read: _Read) -> tuple[list[Problem], list[str]]:
    """Stage 5: operators outside the delegates the installed runtime has no kernel for, or whose kernel
    cannot take the call (with a note when the kernel registry cannot be read)."""
    methods = read.program.methods
    dependencies: Dependencies = {}
    for _, index, graph in read.all_graphs():
        dependencies.update(output_dependencies(index, graph))
    problems: list[Problem] = []
    notes: list[str] = []
    registered = registered_operators()
    backends = registered_backends()
    if registered is not None:
        for method in methods:
            problems += missing_kernel_problems(method, registered)
            problems += missing_backend_problems(method, backends) if backends is not None else []
    else:
        notes.append("the ExecuTorch runtime's kernel registry could not be read: operators outside were not checked")
    for method in methods:
        problems += unsupported_input_problems(method, dependencies)
    return problems, notes


def _weight_check(buffer: Any, read: _Read) -> WeightCheck:
    """Stage 6 (``weights``): every named XNNPACK constant hashed and compared with its name."""
    check = WeightCheck()
    for method, graphs in read.graphs.items():
        check_weights(buffer, ((method, index, graph) for index, graph in graphs), read.program.named_data, check)
    return check


def _report(
    name: str,
    read: _Read,
    problems: list[Problem],
    notes: list[str],
    weights: WeightCheck | None,
    memory: list[MethodMemory],
) -> Report:
    graphs = [graph for _, _, graph in read.all_graphs()]
    return Report(
        source=name,
        problems=tuple(problems),
        methods=len(read.program.methods),
        delegates=len(graphs),
        nodes=sum(len(graph.nodes) for graph in graphs),
        values=sum(len(graph.values) for graph in graphs),
        other_delegates=tuple(sorted(set(read.other_backends))),
        coverage=tuple(
            _coverage(method, [graph for _, graph in read.graphs[method.name]]) for method in read.program.methods
        ),
        weights_checked=weights.checked if weights is not None else None,
        notes=tuple(notes),
        memory=tuple(memory),
    )


def _with_runtime(
    report: Report, source: PteSource, methods: list[str], run: bool, data_files: Sequence[DataFile]
) -> Report:
    """Stage 7 (``load``/``run``): the real runtime's verdict, with its log."""
    if "blob_format" in report.kinds():
        # The runtime trusts a blob's internals more than its flatbuffer framing: do not feed it a damaged one.
        logger.warning("%s: not loaded, an XNNPACK blob is damaged", report.source)
        return report
    from xnnguard.runtime_check.runtime_load import load_and_run

    data_path = data_files[0].path if data_files else None  # the runtime takes one (verify_pte checks)
    try:
        outcome = load_and_run(source, methods, run=run, data_path=data_path)
    except DataFileNotSupported as error:
        return replace(report, problems=(*report.problems, Problem("load", f"not loaded: {error}")))
    return replace(
        report,
        problems=report.problems + tuple(outcome.problems),
        loaded=outcome.loaded,
        ran=outcome.ran,
        runtime_log=outcome.log,
    )


def verify_pte(
    source: PteSource,
    *,
    load: bool = False,
    run: bool = False,
    kernels: bool = True,
    weights: bool = False,
    data: PathOrData | None = None,
    max_memory: int | None = None,
) -> Report:
    """Check every XNNPACK delegate of ``source`` (a path, bytes or memoryview).

    First what the runtime checks before it reads anything (docs/verify.md): the file's headers, the
    flatbuffers verifier on the Program and on each XNNPACK graph, each method's tables; every constant
    named by a key resolves in the named data; every buffer can be allocated. Then, per method and
    delegate: tensor ranks, dataflow (values read but never written, outputs never written), external ids,
    and what XNNPACK checks when it defines, creates and first reshapes each node (``define_checks``);
    with ``kernels``, operators outside the delegates that the installed runtime has no kernel for, or a
    kernel that cannot take their arguments (a 3-D convolution on the portable kernel). ``weights`` also
    hashes every named XNNPACK constant and compares it with its name (reads every weight byte). ``load``
    also loads each method with the real runtime, ``run`` also executes it once on generated inputs; their
    log lines go into ``Report.runtime_log``. The report's ``coverage`` says, per method, what runs in
    XNNPACK and which operators run outside it.

    ``data`` is the ``.ptd`` file (a path, or one ``read_data_file`` read) the program is loaded with: its
    named data is searched before the program's own, as the runtime does. ``Report.memory`` says what each
    method needs at least; ``max_memory`` (bytes) makes a method that needs more an ``allocation`` problem.

    Raises ``PteReadError`` (naming the input and the damage) when ``source`` is not a readable program, or
    when ``data`` is not a readable data file.
    """
    started = time.perf_counter()
    name = source_name(source)
    notes: list[str] = []
    weight_check = None
    data_files = [] if data is None else [data if isinstance(data, DataFile) else read_data_file(data)]
    with _gc_paused(), open_pte(source) as buffer:
        read = _read(buffer, name)
        problems = _delegate_problems(read)
        problems += _named_data_problems(read, data_files)
        found, memory = _allocations(read, max_memory)
        problems += found
        if weights:
            weight_check = _weight_check(buffer, read)
    if kernels:
        found, notes = _operator_problems(read)
        problems += found
    if weight_check is not None:
        problems += weight_check.problems
        notes += weight_check.notes()
    report = _report(name, read, problems, notes, weight_check, memory)
    if load or run:
        report = _with_runtime(report, source, [method.name for method in read.program.methods], run, data_files)
    logger.info("%s (%.0f ms)", report.summary(), 1000 * (time.perf_counter() - started))
    return report


def assert_pte_ok(
    source: PteSource,
    *,
    load: bool = False,
    run: bool = False,
    kernels: bool = True,
    weights: bool = False,
    data: PathOrData | None = None,
    max_memory: int | None = None,
) -> Report:
    """``verify_pte`` for tests: raises ``AssertionError`` listing every problem, returns the report otherwise."""
    report = verify_pte(
        source, load=load, run=run, kernels=kernels, weights=weights, data=data, max_memory=max_memory
    )
    if not report.ok:
        raise AssertionError(str(report))
    return report
