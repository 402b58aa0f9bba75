"""How ``xnnguard verify`` spreads its files: this process, workers, or a child per file, decided from the work.

A static check of a small file takes milliseconds, less than starting a worker, so few files are checked
here. Many files start here too and move to one worker per core once that has taken a second (big
delegates take long enough to pay for workers). With ``--load``/``--run`` every file gets a child of its
own (``verify_isolation``): the runtime may crash or hang, and a child costs little against a load.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from xnnguard.runtime_check.verify_isolation import Advance, CheckOptions, check, in_children, in_workers

if TYPE_CHECKING:
    from xnnguard.runtime_check.report import Report

__all__ = ["ADAPTIVE", "check_all", "describe", "job_count", "prepare"]

logger = logging.getLogger("xnnguard.runtime_check")

_PARALLEL_FROM = 16  # below this many files a static check runs in this process: workers would cost more
ADAPTIVE = -1  # a static check in automatic mode: start here, move to workers if the work turns out long
_ADAPTIVE_AFTER = 1.0  # seconds of checking in this process after which the rest goes to workers


def job_count(requested: int, files: int, runtime: bool) -> int:
    """Worker processes to use for ``--jobs requested``; 0 means this process, ``ADAPTIVE`` this process first."""
    if runtime:  # the runtime may crash or hang: a child of its own per file costs little against a load
        return max(1, min(requested or os.cpu_count() or 1, files))
    if requested == 1:
        return 0
    if requested > 1:
        return min(requested, files)
    if files >= _PARALLEL_FROM and (os.cpu_count() or 1) > 1:
        return ADAPTIVE
    return 0


def describe(jobs: int) -> str:
    """Where ``job_count``'s answer checks the files, for the log."""
    return {0: "this process", ADAPTIVE: "this process (workers take over if it takes long)"}.get(
        jobs, f"{jobs} worker processes"
    )


def prepare(runtime: bool) -> None:
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

        from xnnguard.third_party_logs import quiet_third_party_loggers

        quiet_third_party_loggers()
        from xnnguard.runtime_check.runtime_load import import_runtime

        import_runtime()
    registered_operators()
    warm_up()


def check_all(
    files: list[str], options: CheckOptions, jobs: int, advance: Advance, timeout: float = 0.0
) -> list[Report]:
    """Every file's report, in order. ``ADAPTIVE``: files are checked here until that has taken a second;
    the rest (if there are enough to share) goes to one worker per core."""
    if jobs > 0:
        if options.runtime:
            by_path = in_children(files, options, jobs, timeout, advance)
        else:
            by_path = in_workers(files, options, jobs, advance)
        return [by_path[path] for path in files]
    reports: list[Report] = []
    started = time.perf_counter()
    for index, path in enumerate(files):
        remaining = files[index:]
        if jobs == ADAPTIVE and time.perf_counter() - started > _ADAPTIVE_AFTER and len(remaining) >= 4:
            workers = min(os.cpu_count() or 1, len(remaining))
            logger.info("moving the last %d files to %d worker processes", len(remaining), workers)
            by_path = in_workers(remaining, options, workers, advance)
            return reports + [by_path[path] for path in remaining]
        reports.append(check(path, options))
        advance(path)
    return reports
