"""``xnnguard verify PATH...``: check .pte files (or every .pte below a directory) for CI.

Exit code 0 when every file passes, 1 when a file has problems, 2 when an input cannot be read (2 wins).
Every input gets a ``Report``, an unreadable one included (one ``unreadable`` problem), so text and JSON
have one shape. Files are checked in worker processes when there are many. When the runtime is asked to
load them, each file is loaded in a child process of its own, which is killed after ``--timeout`` seconds:
a crash or a hang of the native runtime then costs that file, not the whole command.

Nothing heavy is imported for a static check: the checker reads flatbuffers and a cached kernel registry,
so workers start in milliseconds. With ``--load``/``--run`` the runtime (and torch) is imported once, in
this process, before the workers are forked, so they inherit it instead of importing it each.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import shutil
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from multiprocessing.connection import Connection, wait as wait_for_any
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, cast

if TYPE_CHECKING:
    from xnnguard.runtime_check.report import Report

__all__ = ["EXIT_OK", "EXIT_PROBLEMS", "EXIT_UNREADABLE", "check_file", "register"]

logger = logging.getLogger("xnnguard.runtime_check")

EXIT_OK, EXIT_PROBLEMS, EXIT_UNREADABLE = 0, 1, 2
_PARALLEL_FROM = 16  # below this many files a static check runs in this process: workers would cost more
_DEFAULT_TIMEOUT = 300.0  # seconds a file may take to load and run; a big network loads in well under a minute

_EXAMPLES = """\
examples:
  xnnguard verify model.pte                 check every XNNPACK delegate statically
  xnnguard verify exported/ --load          every .pte below exported/, also loaded by the runtime
  xnnguard verify model.pte --run --json    also run each method once; machine-readable output
  xnnguard verify dist/ --weights           also prove every weight blob against its sha256 name
  xnnguard verify dist/ --quiet             print only files with problems (exit code says the rest)
  xnnguard verify dist/ --load --timeout 60 a file the runtime takes over 60 s to load is reported as hung

exit codes: 0 all files pass, 1 problems found, 2 an input cannot be read
"""


def _job_count(text: str) -> int:
    """``--jobs``: a number of worker processes, 0 meaning automatic."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} processes: give 0 (automatic), 1 (no workers) or more")
    return value


def _seconds(text: str) -> float:
    """``--timeout``: seconds, 0 meaning no limit."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} seconds: give 0 (no limit) or a positive number")
    return value


def register(subcommands: argparse._SubParsersAction) -> None:
    """Add ``verify`` to the ``xnnguard`` command line."""
    parser = subcommands.add_parser(
        "verify",
        help="check .pte files: every XNNPACK delegate, statically, and optionally with the real runtime",
        description="Check ExecuTorch .pte files for XNNPACK delegates that will fail on device: what XNNPACK "
        "checks when it defines, creates and first runs each node (datatypes, quantization parameters, "
        "parameters, shapes), tensors above 6 dims, values or outputs nothing writes (orphaned implicit "
        "q/dq), broken external ids, operators without a kernel or whose kernel cannot take their inputs. "
        "Also says, per method, what runs in XNNPACK and what runs outside it. Reads only the program and "
        "the delegate graphs, never the weights (unless --weights).",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help=".pte files or directories (searched recursively)")
    parser.add_argument("--load", action="store_true", help="also load every method with the ExecuTorch runtime")
    parser.add_argument("--run", action="store_true", help="also run every method once on generated inputs")
    parser.add_argument(
        "--weights", action="store_true", help="also hash every XNNPACK constant and compare it with its name"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    parser.add_argument("--quiet", action="store_true", help="print only files with problems or errors")
    parser.add_argument(
        "--jobs",
        type=_job_count,
        default=0,
        metavar="N",
        help="worker processes: 1 checks in this process (with --load/--run: one child process at a "
        "time), 0 (default) decides from the work",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=_DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"with --load/--run, report a file as hung after this long (default {_DEFAULT_TIMEOUT:g}; 0: no limit)",
    )
    # also accepted after the subcommand; SUPPRESS keeps a -v given before it
    parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log what is checked")
    parser.set_defaults(handler=run)


def _collect(paths: list[str]) -> tuple[list[str], list[Report]]:
    """The .pte files to check, and an ``unreadable`` report for each path that names none."""
    from xnnguard.runtime_check.report import Report

    files: list[str] = []
    errors: list[Report] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(str(p) for p in path.rglob("*.pte") if p.is_file())
            files += found
            if not found:
                errors.append(Report.unreadable(raw, "no .pte file in this directory"))
        elif path.exists():
            files.append(raw)
        else:
            errors.append(Report.unreadable(raw, "no such file or directory"))
    return list(dict.fromkeys(files)), errors


def check_file(path: str, load: bool, run: bool, weights: bool = False) -> Report:
    """Verify one file; every failure becomes a ``Report`` (this runs in workers: nothing may escape)."""
    from xnnguard.runtime_check.pte_reader import PteReadError
    from xnnguard.runtime_check.report import Problem, Report
    from xnnguard.runtime_check.verify import verify_pte

    try:
        return verify_pte(path, load=load, run=run, weights=weights)
    except PteReadError as error:
        return Report.unreadable(path, error.detail)
    except Exception as error:  # a bug in the checker: say so for this file, keep checking the others
        logger.debug("checking %s failed", path, exc_info=True)
        message = f"internal error while checking ({type(error).__name__}: {error})"
        return Report(source=path, problems=(Problem("internal", message),))


class _Progress:
    """A one-line progress bar on a terminal's stderr; silent elsewhere."""

    def __init__(self, total: int, stream: TextIO, enabled: bool) -> None:
        self.total, self.done, self.stream = total, 0, stream
        self.enabled = enabled and total > 1 and stream.isatty()

    def advance(self, path: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        width = shutil.get_terminal_size((80, 20)).columns
        bar_width = 24
        filled = bar_width * self.done // self.total
        line = f"[{'#' * filled}{'.' * (bar_width - filled)}] {self.done}/{self.total} {path}"
        self.stream.write("\r\x1b[K" + line[: width - 1])
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


_ADAPTIVE = -1  # a static check in automatic mode: start here, move to workers if the work turns out long
_ADAPTIVE_AFTER = 1.0  # seconds of checking in this process after which the rest goes to workers


def _jobs(requested: int, files: int, runtime: bool) -> int:
    """Worker processes to use; 0 means this process, ``_ADAPTIVE`` this process first."""
    if runtime:  # the runtime may crash or hang: a child of its own per file costs little against a load
        return max(1, min(requested or os.cpu_count() or 1, files))
    if requested == 1:
        return 0
    if requested > 1:
        return min(requested, files)
    if files >= _PARALLEL_FROM and (os.cpu_count() or 1) > 1:
        return _ADAPTIVE
    return 0


def _died(path: str, options: tuple[bool, bool, bool], hung_after: float | None = None) -> Report:
    """The report on a file whose worker died (or was killed after ``hung_after`` seconds): its static
    checks, run here, and the crash. With the runtime that is the runtime crashing on the file; without, a
    bug in the checker."""
    from xnnguard.runtime_check.report import Problem

    load, run, weights = options
    report = check_file(path, False, False, weights) if load or run else None
    doing = "running" if run else "loading"
    if hung_after is not None:
        problem = Problem(
            "load", f"the runtime did not finish {doing} it in {hung_after:g} s (it hangs, or raise --timeout)"
        )
    elif load or run:
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


def _check_batch(paths: list[str], options: tuple[bool, bool, bool]) -> list[Report]:
    return [check_file(path, *options) for path in paths]


def _child(sender: Connection, path: str, options: tuple[bool, bool, bool], jobs: int) -> None:
    if jobs > 1:
        _share_the_cores(jobs)
    sender.send(check_file(path, *options))
    sender.close()


def _in_children(
    files: list[str], options: tuple[bool, bool, bool], jobs: int, timeout: float, progress: _Progress
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
        progress.advance(path)

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


def _in_workers(
    files: list[str], options: tuple[bool, bool, bool], jobs: int, progress: _Progress
) -> dict[str, Report]:
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
                progress.advance(path)
    for path in broken:
        with ProcessPoolExecutor(max_workers=1, mp_context=_pool_context()) as alone:
            try:
                done[path] = alone.submit(check_file, path, *options).result()
            except BrokenProcessPool:
                done[path] = _died(path, options)
        progress.advance(path)
    return done


def _check_all(
    files: list[str], options: tuple[bool, bool, bool], jobs: int, progress: _Progress, timeout: float = 0.0
) -> list[Report]:
    """Every file's report, in order. ``_ADAPTIVE``: files are checked here until that has taken a second;
    the rest (if there are enough to share) goes to one worker per core. Small static checks take
    milliseconds, less than starting workers; big delegates take long enough to pay for them."""
    if jobs > 0:
        runtime = options[0] or options[1]
        by_path = (
            _in_children(files, options, jobs, timeout, progress)
            if runtime
            else _in_workers(files, options, jobs, progress)
        )
        return [by_path[path] for path in files]
    reports: list[Report] = []
    started = time.perf_counter()
    for index, path in enumerate(files):
        remaining = files[index:]
        if jobs == _ADAPTIVE and time.perf_counter() - started > _ADAPTIVE_AFTER and len(remaining) >= 4:
            workers = min(os.cpu_count() or 1, len(remaining))
            logger.info("moving the last %d files to %d worker processes", len(remaining), workers)
            by_path = _in_workers(remaining, options, workers, progress)
            return reports + [by_path[path] for path in remaining]
        reports.append(check_file(path, *options))
        progress.advance(path)
    return reports


def _exit_code(reports: list[Report]) -> int:
    if any(not report.readable for report in reports):
        return EXIT_UNREADABLE
    if any(not report.ok for report in reports):
        return EXIT_PROBLEMS
    return EXIT_OK


def _summary(reports: list[Report]) -> dict[str, int]:
    ok = sum(1 for report in reports if report.ok)
    unreadable = sum(1 for report in reports if not report.readable)
    return {"files": len(reports), "ok": ok, "with_problems": len(reports) - ok - unreadable, "unreadable": unreadable}


def _print_text(reports: list[Report], quiet: bool, out: TextIO) -> None:
    for report in reports:
        if not report.ok or not quiet:
            print(report, file=out)
    if not quiet:
        counts = _summary(reports)
        noun = "file" if counts["files"] == 1 else "files"
        print(
            f"\n{counts['files']} {noun}: {counts['ok']} ok, {counts['with_problems']} with problems, "
            f"{counts['unreadable']} unreadable",
            file=out,
        )


def _prepare(runtime: bool) -> None:
    """Import what the checks need once, here, so that forked workers inherit it.

    A static check needs the checker, its parsed schemas and the kernel registry (a cache file, no
    runtime import): read here, each worker would read them again. With
    ``--load``/``--run``, the runtime: torch sets its loggers' levels when imported, so the third-party
    import chatter (torchao's optional kernels, pytree notices) is quieted right after it.
    """
    from xnnguard.runtime_check.missing_kernels import registered_operators
    from xnnguard.runtime_check.verify import warm_up

    if runtime:
        import torch  # noqa: F401

        from xnnguard.cli import quiet_third_party_loggers

        quiet_third_party_loggers()
        from xnnguard.runtime_check.runtime_load import import_runtime

        import_runtime()
    registered_operators()
    warm_up()


def run(args: argparse.Namespace) -> int:
    """The ``verify`` subcommand; returns the exit code."""
    files, errors = _collect(args.paths)
    runtime = args.load or args.run
    jobs = _jobs(args.jobs, len(files), runtime)
    if files:
        _prepare(runtime)
        where = {0: "this process", _ADAPTIVE: "this process (workers take over if it takes long)"}.get(
            jobs, f"{jobs} worker processes"
        )
        logger.info("checking %d file%s in %s", len(files), "s" * (len(files) != 1), where)
    progress = _Progress(len(files), sys.stderr, enabled=not args.quiet)
    try:
        checked = _check_all(files, (args.load, args.run, args.weights), jobs, progress, args.timeout)
    finally:
        progress.close()
    reports = errors + checked
    code = _exit_code(reports)
    try:
        if args.json:
            document = {"files": [r.to_dict() for r in reports], "summary": _summary(reports), "exit_code": code}
            json.dump(document, sys.stdout, indent=1)
            sys.stdout.write("\n")
        else:
            _print_text(reports, args.quiet, sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (``| head``): the verdict still stands
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code
