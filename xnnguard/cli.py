"""The ``xnnguard`` command: one subcommand per task (``verify``; more register the same way).

A subcommand module provides ``register(subcommands)``, which adds its parser and sets
``handler=<function(args) -> exit code>``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

from xnnguard import __version__
from xnnguard.runtime_check import verify_command

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xnnguard",
        description="Safe XNNPACK lowering on ExecuTorch 1.5.x: check what you ship.",
        epilog="run 'xnnguard COMMAND --help' for a command's options and examples",
    )
    parser.add_argument("--version", action="version", version=f"xnnguard {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what xnnguard does (to stderr)")
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    verify_command.register(subcommands)
    return parser


def _quiet_third_party_noise(verbose: bool) -> None:
    """torch, torchao and ExecuTorch warn at import about things unrelated to what a command does."""
    warnings.filterwarnings("ignore")
    for name in ("torch", "torchao", "executorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.basicConfig(format="%(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("xnnguard").setLevel(logging.INFO if verbose else logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_third_party_noise(args.verbose)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
