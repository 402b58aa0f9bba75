"""Where ``xnnguard verify`` checks a file: in this process, in a pool of workers, or in a child of its own.

Whatever happens to a check becomes a ``Report``: a file the checker cannot read, a bug in the checker, a
worker that dies, a runtime that crashes or hangs on a file. A static check runs in a pool of forked
workers (they inherit the imported checker); a load or run runs in a forked child per file, killed after
its deadline, so a crash or a hang of the native runtime costs that file and not the whole command.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait as wait_for_any
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from xnnguard.runtime_check.ptd_reader import DataFile
    from xnnguard.runtime_check.report import Report

__all__ = ["CheckOptions", "check_file", "in_children", "in_workers"]

logger = logging.getLogger("xnnguard.runtime_check")

Advance = Callable[[str], None]  # called with each file's path once it is checked


@dataclass(frozen=True)
class CheckOptions:
    """What to do with each file, beyond the static check (the ``verify_pte`` options the command passes)."""

    load: bool = False
    run: bool = False
    weights: bool = False
    data: DataFile | None = None  # the .ptd the programs are loaded with
    max_memory: int | None = None  # bytes a method may need

    @property
    def runtime(self) -> bool:
        return self.load or self.run


def check_file(
    path: str,
    load: bool,
    run: bool,
    weights: bool = False,
    *,
    data: DataFile | None = None,
    max_memory: int | None = None,
) -> Report:
    """Verify one file; every failure becomes a ``Report`` (this runs in workers: nothing may escape)."""
    from xnnguard.runtime_check.pte_reader import PteReadError
    from xnnguard.runtime_check.report import Problem, Report
    from xnnguard.runtime_check.verify import verify_pte

    try:
        return verify_pte(path, load=load, run=run, weights=weights, data=data, max_memory=max_memory)
    except PteReadError as error:
        return Report.unreadable(path, error.detail)
    except Exception as error:  # a bug in the checker: say so for this file, keep checking the others
        logger.debug("checking %s failed", path, exc_info=True)
        message = f"internal error while checking ({type(error).__name__}: {error})"
        return Report(source=path, problems=(Problem("internal", message),))


def check(path: str, options: CheckOptions) -> Report:
    """``check_file`` with the command's options."""
    return check_file(
        path, options.load, options.run, options.weights, data=options.data, max_memory=options.max_memory
    )


def _died(path: str, options: CheckOptions, hung_after: float | None = None) -> Report:
    """The report on a file whose worker died (or was killed after ``hung_after`` seconds): its static
    checks, run here, and the crash. With the runtime that is the runtime crashing on the file; without, a
    bug in the checker."""
    from xnnguard.runtime_check.report import Problem

    report = check(path, replace(options, load=False, run=False)) if options.runtime else None
    doing = "running" if options.run else "loading"
    if hung_after is not None:
        problem = Problem(
            "load", f"the runtime did not finish {doing} it in {hung_after:g} s (it hangs, or raise --timeout)"
        )
    elif options.runtime:
        problem = Problem("load", f"the runtime crashed {doing} it (the worker process died)")
    else:
        problem = Problem("internal", "the checker process died (a bug in xnnguard)")
    if report is None or not report.readable:
        from xnnguard.runtime_check.report import Report

        return Report(source=path, problems=(problem,))
    return replace(report, problems=(*report.problems, problem))


def _pool_context() -> multiprocessing.context.ForkContext | multiprocessing.context.SpawnContext:
    # fork: workers inherit the imported checker (and, with --load, the runtime) instead of importing again
    if "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _share_the_cores(jobs: int) -> None:
    """A worker's runtime threadpool gets its share of the cores: ``jobs`` workers each running XNNPACK on
    every core would only take turns (the pool is created on first use, so the fork inherits none)."""
    from xnnguard.boundary.runtime import reset_threadpool
    from xnnguard.runtime_check.runtime_load import captured_stderr, import_runtime

    with captured_stderr():  # the runtime logs the reset
        import_runtime()
        reset_threadpool(max(1, (os.cpu_count() or 1) // jobs))


def _check_batch(paths: list[str], options: CheckOptions) -> list[Report]:
    return [check(path, options) for path in paths]


def _child(sender: Connection, path: str, options: CheckOptions, jobs: int) -> None:
    if jobs > 1:
        _share_the_cores(jobs)
    sender.send(check(path, options))
    sender.close()


def in_children(
    files: list[str], options: CheckOptions, jobs: int, timeout: float, advance: Advance
) -> dict[str, Report]:
    """Load (and run) each file in a forked child of its own, ``jobs`` at a time. A child that dies is the
    runtime crashing on its file; one still busy after ``timeout`` seconds (0: never) is killed, and its
    file reported as hung. Either way the other files are checked as usual."""
    context = _pool_context()
    pending = list(reversed(files))
    running: dict[Connection, tuple[multiprocessing.process.BaseProcess, str, float]] = {}
    done: dict[str, Report] = {}

    def finish(receiver: Connection, report: Report) -> None:
        process, path, _ = running.pop(receiver)
        receiver.close()
        process.join()
        done[path] = report
        advance(path)

    while pending or running:
        while pending and len(running) < jobs:
            path = pending.pop()
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(target=_child, args=(sender, path, options, jobs), daemon=True)
            process.start()
            sender.close()  # the child holds the only writer: its death ends the pipe
            running[receiver] = (process, path, time.monotonic() + timeout if timeout else float("inf"))
        first_deadline = min(deadline for _, _, deadline in running.values())
        wait = None if first_deadline == float("inf") else max(0.0, first_deadline - time.monotonic())
        for ready in wait_for_any(list(running), timeout=wait):
            receiver = cast(Connection, ready)
            try:
                report = receiver.recv()
            except EOFError:
                report = _died(running[receiver][1], options)
            finish(receiver, report)
        now = time.monotonic()
        for receiver, (child, path, deadline) in list(running.items()):
            if deadline <= now:
                logger.debug("%s: still busy after %g s, stopping it", path, timeout)
                child.kill()
                finish(receiver, _died(path, options, hung_after=timeout))
    return done


def in_workers(files: list[str], options: CheckOptions, jobs: int, advance: Advance) -> dict[str, Report]:
    """Check ``files`` statically in ``jobs`` workers. When a worker dies (a bug in the checker), every
    file it left unfinished is checked again in a worker of its own, so only the file that kills it is
    reported."""
    done: dict[str, Report] = {}
    broken: list[str] = []
    # a static check takes milliseconds: a task per file would cost more in messages than in checking
    size = max(1, len(files) // (4 * jobs))
    batches = [files[start : start + size] for start in range(0, len(files), size)]
    with ProcessPoolExecutor(max_workers=jobs, mp_context=_pool_context()) as pool:
        futures: dict[Future[list[Report]], list[str]] = {
            pool.submit(_check_batch, batch, options): batch for batch in batches
        }
        for future in as_completed(futures):
            batch = futures[future]
            try:
                done.update(zip(batch, future.result()))
            except BrokenProcessPool:
                broken += batch
                continue
            for path in batch:
                advance(path)
    for path in broken:
        with ProcessPoolExecutor(max_workers=1, mp_context=_pool_context()) as alone:
            try:
                done[path] = alone.submit(check, path, options).result()
            except BrokenProcessPool:
                done[path] = _died(path, options)
        advance(path)
    return done
