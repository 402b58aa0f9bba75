"""What ``xnnguard verify`` prints and returns: a progress bar, the reports as text or JSON, the exit code.

Exit code 0 when every file passes, 1 when a file has problems, 2 when an input cannot be read (2 wins).
Every input has a ``Report`` (an unreadable one has one ``unreadable`` problem), so text and JSON have
one shape whatever happened.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from xnnguard.runtime_check.report import Report

__all__ = ["EXIT_OK", "EXIT_PROBLEMS", "EXIT_UNREADABLE", "Progress", "exit_code", "summary", "write_reports"]

EXIT_OK, EXIT_PROBLEMS, EXIT_UNREADABLE = 0, 1, 2


class Progress:
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


def exit_code(reports: list[Report]) -> int:
    if any(not report.readable for report in reports):
        return EXIT_UNREADABLE
    if any(not report.ok for report in reports):
        return EXIT_PROBLEMS
    return EXIT_OK


def summary(reports: list[Report]) -> dict[str, int]:
    ok = sum(1 for report in reports if report.ok)
    unreadable = sum(1 for report in reports if not report.readable)
    return {"files": len(reports), "ok": ok, "with_problems": len(reports) - ok - unreadable, "unreadable": unreadable}


def _print_text(reports: list[Report], quiet: bool, out: TextIO) -> None:
    for report in reports:
        if not report.ok or not quiet:
            print(report, file=out)
    if not quiet:
        counts = summary(reports)
        noun = "file" if counts["files"] == 1 else "files"
        print(
            f"\n{counts['files']} {noun}: {counts['ok']} ok, {counts['with_problems']} with problems, "
            f"{counts['unreadable']} unreadable",
            file=out,
        )


def write_reports(reports: list[Report], out: TextIO, *, as_json: bool, quiet: bool) -> None:
    """Every report to ``out``, as text (``quiet``: only files with problems) or as one JSON document."""
    try:
        if as_json:
            document = {
                "files": [r.to_dict() for r in reports],
                "summary": summary(reports),
                "exit_code": exit_code(reports),
            }
            json.dump(document, out, indent=1)
            out.write("\n")
        else:
            _print_text(reports, quiet, out)
        out.flush()
    except BrokenPipeError:  # the reader went away (``| head``): the verdict still stands
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
