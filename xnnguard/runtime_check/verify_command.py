"""``xnnguard verify PATH...``: check .pte files (or every .pte below a directory) for CI.

This module is the command line: its options, the inputs they name, and the run that ties the rest
together. Where each file is checked is ``verify_schedule`` (and ``verify_isolation``, which keeps a
crashing or hanging runtime to its file); what is printed and the exit code are ``verify_output``.

Nothing heavy is imported for a static check: the checker reads flatbuffers and a cached kernel registry,
so workers start in milliseconds. With ``--load``/``--run`` the runtime (and torch) is imported once, in
this process, before the workers are forked, so they inherit it instead of importing it each.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from xnnguard.runtime_check.verify_isolation import CheckOptions, check_file
from xnnguard.runtime_check.verify_output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_UNREADABLE,
    Progress,
    exit_code,
    write_reports,
)
from xnnguard.runtime_check.verify_schedule import check_all, describe, job_count, prepare

if TYPE_CHECKING:
    from xnnguard.runtime_check.ptd_reader import DataFile
    from xnnguard.runtime_check.report import Report

# check_file and the exit codes are re-exported: they lived here
__all__ = ["EXIT_OK", "EXIT_PROBLEMS", "EXIT_UNREADABLE", "check_file", "register"]

logger = logging.getLogger("xnnguard.runtime_check")

_DEFAULT_TIMEOUT = 300.0  # seconds a file may take to load and run; a big network loads in well under a minute

_EXAMPLES = """\
examples:
  xnnguard verify model.pte                 check every XNNPACK delegate statically
  xnnguard verify exported/ --load          every .pte below exported/, also loaded by the runtime
  xnnguard verify model.pte --run --json    also run each method once; machine-readable output
  xnnguard verify dist/ --weights           also prove every weight blob against its sha256 name
  xnnguard verify dist/ --quiet             print only files with problems (exit code says the rest)
  xnnguard verify dist/ --load --timeout 60 a file the runtime takes over 60 s to load is reported as hung
  xnnguard verify model.pte --data model.ptd its constants may be named in the data file it ships with
  xnnguard verify dist/ --max-memory 2GiB   a method that needs more memory than 2 GiB is a problem

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


_BYTE_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kib": 2**10, "kb": 10**3,
    "m": 2**20, "mib": 2**20, "mb": 10**6,
    "g": 2**30, "gib": 2**30, "gb": 10**9,
    "t": 2**40, "tib": 2**40, "tb": 10**12,
}  # fmt: skip


def _byte_count(text: str) -> int:
    """``--max-memory``: ``2GiB``, ``512MiB``, ``1.5G`` (K, M, G, T are binary; KB, MB, GB, TB decimal), bytes."""
    number = text.strip().rstrip("bBiIkKmMgGtT ")
    unit = text.strip()[len(number) :].strip().lower()
    try:
        value = float(number) * _BYTE_UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"{text!r} is not an amount of memory (e.g. 2GiB, 512MiB)") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text}: give a positive amount of memory")
    return int(value)


def _data_file(text: str) -> DataFile:
    """``--data``: a .ptd file, read (keys and segments only) once here."""
    from xnnguard.runtime_check.ptd_reader import read_data_file
    from xnnguard.runtime_check.pte_reader import PteReadError

    try:
        return read_data_file(text)
    except PteReadError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


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
    parser.add_argument(
        "--data",
        type=_data_file,
        metavar="PTD",
        help="the .ptd file the programs are loaded with: XNNPACK constants may be named there (searched first)",
    )
    parser.add_argument(
        "--max-memory",
        type=_byte_count,
        metavar="SIZE",
        help="a method that needs more memory than SIZE (e.g. 2GiB) is a problem; each report says what it needs",
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


def run(args: argparse.Namespace) -> int:
    """The ``verify`` subcommand; returns the exit code."""
    files, errors = _collect(args.paths)
    options = CheckOptions(
        load=args.load, run=args.run, weights=args.weights, data=args.data, max_memory=args.max_memory
    )
    jobs = job_count(args.jobs, len(files), options.runtime)
    if files:
        prepare(options.runtime)
        logger.info("checking %d file%s in %s", len(files), "s" * (len(files) != 1), describe(jobs))
    progress = Progress(len(files), sys.stderr, enabled=not args.quiet)
    try:
        checked = check_all(files, options, jobs, progress.advance, args.timeout)
    finally:
        progress.close()
    reports = errors + checked
    write_reports(reports, sys.stdout, as_json=args.json, quiet=args.quiet)
    return exit_code(reports)
