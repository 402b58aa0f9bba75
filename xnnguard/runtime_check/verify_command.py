"""``xnnguard verify PATH...``: check .pte files (or every .pte below a directory) for CI.

Exit code 0 when every file passes, 1 when a file has problems, 2 when an input cannot be read (2 wins).
Files are checked in worker processes when there are many or when the runtime is asked to load them
(a crash of the native runtime then costs one worker, not the whole command). Imports of the checker
(which pull in torch) wait until a check actually runs, so ``--help`` stays instant.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import shutil
import sys
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from xnnguard.runtime_check.report import Report

__all__ = ["EXIT_OK", "EXIT_PROBLEMS", "EXIT_UNREADABLE", "register"]

logger = logging.getLogger("xnnguard.runtime_check")

EXIT_OK, EXIT_PROBLEMS, EXIT_UNREADABLE = 0, 1, 2
_PARALLEL_FROM = 16  # a static check takes milliseconds: below this many files workers cost more than they save

_EXAMPLES = """\
examples:
  xnnguard verify model.pte                 check every XNNPACK delegate statically
  xnnguard verify exported/ --load          every .pte below exported/, also loaded by the runtime
  xnnguard verify model.pte --run --json    also run each method once; machine-readable output
  xnnguard verify dist/ --quiet             print only files with problems (exit code says the rest)

exit codes: 0 all files pass, 1 problems found, 2 an input cannot be read
"""


@dataclass(frozen=True)
class Outcome:
    """One input's result: a report, or the reason it could not be read."""

    path: str
    report: Report | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        if self.report is not None:
            return {**self.report.to_dict(), "error": None}
        return {"source": self.path, "ok": False, "error": self.error}


def register(subcommands: argparse._SubParsersAction) -> None:
    """Add ``verify`` to the ``xnnguard`` command line."""
    parser = subcommands.add_parser(
        "verify",
        help="check .pte files: every XNNPACK delegate, statically, and optionally with the real runtime",
        description="Check ExecuTorch .pte files for XNNPACK delegates that will fail on device: tensors above "
        "6 dims, values or outputs nothing writes (orphaned implicit q/dq), broken external ids, operators "
        "without a kernel or whose kernel cannot take their inputs (a 3-D convolution outside XNNPACK). "
        "Reads only the program and the delegate graphs, never the weights.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help=".pte files or directories (searched recursively)")
    parser.add_argument("--load", action="store_true", help="also load every method with the ExecuTorch runtime")
    parser.add_argument("--run", action="store_true", help="also run every method once on generated inputs")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    parser.add_argument("--quiet", action="store_true", help="print only files with problems or errors")
    parser.add_argument("--jobs", type=int, default=0, metavar="N", help="worker processes (default: automatic)")
    parser.set_defaults(handler=run)


def _collect(paths: list[str]) -> tuple[list[str], list[Outcome]]:
    """The .pte files to check, and an error for each path that names none."""
    files: list[str] = []
    errors: list[Outcome] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(str(p) for p in path.rglob("*.pte") if p.is_file())
            files += found
            if not found:
                errors.append(Outcome(raw, error=f"{raw}: no .pte file in this directory"))
        elif path.exists():
            files.append(raw)
        else:
            errors.append(Outcome(raw, error=f"{raw}: no such file or directory"))
    return list(dict.fromkeys(files)), errors


def check_file(path: str, load: bool, run: bool) -> Outcome:
    """Verify one file; every failure becomes an ``Outcome`` (this runs in workers: nothing may escape)."""
    from xnnguard.runtime_check.pte_reader import PteReadError
    from xnnguard.runtime_check.verify import verify_pte

    try:
        return Outcome(path, report=verify_pte(path, load=load, run=run))
    except PteReadError as error:
        return Outcome(path, error=str(error))
    except Exception as error:  # a bug in the checker: say so for this file, keep checking the others
        logger.debug("checking %s failed", path, exc_info=True)
        return Outcome(path, error=f"{path}: internal error while checking ({type(error).__name__}: {error})")


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


def _jobs(requested: int, files: int, runtime: bool) -> int:
    if requested > 0:
        return min(requested, files)
    if runtime or files >= _PARALLEL_FROM:
        return max(1, min(os.cpu_count() or 1, files))
    return 0  # in this process


def _check_all(files: list[str], load: bool, run: bool, jobs: int, progress: _Progress) -> list[Outcome]:
    if jobs == 0:
        outcomes = []
        for path in files:
            outcomes.append(check_file(path, load, run))
            progress.advance(path)
        return outcomes
    by_path: dict[str, Outcome] = {}
    # fork: workers inherit the imported checker instead of importing torch again
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures: dict[Future, str] = {pool.submit(check_file, path, load, run): path for path in files}
        for future in as_completed(futures):
            path = futures[future]
            try:
                by_path[path] = future.result()
            except BrokenProcessPool:
                by_path[path] = Outcome(
                    path, error=f"{path}: the checker process died (the runtime crashed loading a file)"
                )
            progress.advance(path)
    return [by_path[path] for path in files]


def _exit_code(outcomes: list[Outcome]) -> int:
    if any(o.error is not None for o in outcomes):
        return EXIT_UNREADABLE
    if any(o.report is not None and not o.report.ok for o in outcomes):
        return EXIT_PROBLEMS
    return EXIT_OK


def _summary(outcomes: list[Outcome]) -> dict[str, int]:
    ok = sum(1 for o in outcomes if o.report is not None and o.report.ok)
    unreadable = sum(1 for o in outcomes if o.error is not None)
    return {
        "files": len(outcomes),
        "ok": ok,
        "with_problems": len(outcomes) - ok - unreadable,
        "unreadable": unreadable,
    }


def _print_text(outcomes: list[Outcome], quiet: bool, out: TextIO) -> None:
    for outcome in outcomes:
        if outcome.error is not None:
            print(f"ERROR {outcome.error}", file=out)
        elif outcome.report is not None and (not outcome.report.ok or not quiet):
            print(outcome.report, file=out)
    if not quiet:
        counts = _summary(outcomes)
        noun = "file" if counts["files"] == 1 else "files"
        print(
            f"\n{counts['files']} {noun}: {counts['ok']} ok, {counts['with_problems']} with problems, "
            f"{counts['unreadable']} unreadable",
            file=out,
        )


def _import_checker() -> None:
    """Import the checker once, here: forked workers inherit it instead of importing torch each.

    torch sets its loggers' levels when imported, so the third-party import chatter (torchao's
    optional kernels, pytree notices) is quieted right after it, before the rest is imported.
    """
    import torch  # noqa: F401

    from xnnguard.cli import quiet_third_party_loggers

    quiet_third_party_loggers()
    import xnnguard.runtime_check.verify  # noqa: F401


def run(args: argparse.Namespace) -> int:
    """The ``verify`` subcommand; returns the exit code."""
    files, errors = _collect(args.paths)
    if files:
        _import_checker()
    runtime = args.load or args.run
    progress = _Progress(len(files), sys.stderr, enabled=not args.quiet)
    try:
        checked = _check_all(files, args.load, args.run, _jobs(args.jobs, len(files), runtime), progress)
    finally:
        progress.close()
    outcomes = errors + checked
    code = _exit_code(outcomes)
    try:
        if args.json:
            document = {"files": [o.to_dict() for o in outcomes], "summary": _summary(outcomes), "exit_code": code}
            json.dump(document, sys.stdout, indent=1)
            sys.stdout.write("\n")
        else:
            _print_text(outcomes, args.quiet, sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (``| head``): the verdict still stands
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code
