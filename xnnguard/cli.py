"""The ``xnnguard`` command: one subcommand per task (``verify``; more register the same way).

A subcommand module provides ``register(subcommands)``, which adds its parser and sets
``handler=<function(args) -> exit code>``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from xnnguard import __version__
from xnnguard.runtime_check import verify_command
from xnnguard.third_party_logs import THIRD_PARTY_LOGGERS, quiet_third_party_loggers

__all__ = ["build_parser", "main", "quiet_third_party_loggers"]  # the last one re-exported: it lived here


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xnnguard",
        description="Safe XNNPACK lowering on ExecuTorch 1.5.x: check what you ship.",
        epilog="run 'xnnguard COMMAND --help' for a command's options and examples",
    )
    parser.add_argument("--version", action="version", version=f"xnnguard {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what xnnguard does (to stderr)")
    # a subcommand accepts -v after its name too (its default is SUPPRESS, so this one stays)
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    verify_command.register(subcommands)
    return parser


@contextmanager
def _command_logging(verbose: bool) -> Iterator[None]:
    """Logging and warnings as a command line wants them, put back afterwards (``main`` may run in-process)."""
    loggers = [logging.getLogger(name) for name in (*THIRD_PARTY_LOGGERS, "xnnguard")]
    levels = [logger.level for logger in loggers]
    ours = loggers[-1]
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    handler.setLevel(logging.INFO if verbose else logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quiet_third_party_loggers()
        if verbose:
            ours.setLevel(logging.INFO)
        ours.addHandler(handler)
        try:
            yield
        finally:
            ours.removeHandler(handler)
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with _command_logging(args.verbose):
        return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
