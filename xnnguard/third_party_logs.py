"""Quiet the loggers of torch, torchao and ExecuTorch: they log at import about things unrelated to xnnguard.

Its own module because two callers need it and neither owns it: the command line (``xnnguard.cli``) and
the commands it runs (``verify --load`` imports torch in this process), and the demo.
"""

from __future__ import annotations

import logging

__all__ = ["THIRD_PARTY_LOGGERS", "quiet_third_party_loggers"]

THIRD_PARTY_LOGGERS = ("torch", "torchao", "executorch")


def quiet_third_party_loggers() -> None:
    """torch, torchao and ExecuTorch log at import about things unrelated to what a command does.

    torch sets its loggers' levels when it is imported, so a command that imports it calls this again after.
    """
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
