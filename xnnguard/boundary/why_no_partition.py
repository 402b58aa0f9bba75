"""The reason ExecuTorch's own XNNPACK configs give for refusing a node, caught as data.

A stock config that refuses a node says why through ``executorch.exir.backend.utils.WhyNoPartition``
(``why(node, reason="...")``), which logs at DEBUG on the logger of the config's module and nothing
else. ``stock_reasons`` catches those records while the matching loop runs: a filter on each of those
loggers takes ``(node, reason)`` from the record, then lets the record go on only if the logger would
have let it through anyway, so the user's logging shows exactly what it showed before.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch

__all__ = ["stock_reasons"]


def _config_loggers(configs: Iterable[object]) -> list[logging.Logger]:
    """The loggers of the ExecuTorch modules the configs' classes come from (where their ``why`` logs)."""
    names = {
        cls.__module__
        for config in configs
        for cls in type(config).__mro__
        if cls.__module__.startswith("executorch.")
    }
    return [logging.getLogger(name) for name in sorted(names)]


class _Catch(logging.Filter):
    def __init__(self, reasons: dict[torch.fx.Node, str], level: int) -> None:
        super().__init__()
        self.reasons = reasons
        self.level = level  # the logger's effective level before: what got through then gets through now

    def filter(self, record: logging.LogRecord) -> bool:
        message: Any = record.msg
        node, reason = getattr(message, "node", None), getattr(message, "reason", None)
        if isinstance(node, torch.fx.Node) and isinstance(reason, str) and reason:
            self.reasons.setdefault(node, reason)  # the first reason is the one that refused it
        return record.levelno >= self.level


@contextlib.contextmanager
def stock_reasons(configs: Iterable[object]) -> Iterator[dict[torch.fx.Node, str]]:
    """Within the block, collect ``{node: reason}`` for every ``why(node, reason)`` the configs' modules log."""
    reasons: dict[torch.fx.Node, str] = {}
    installed: list[tuple[logging.Logger, _Catch, int]] = []
    try:
        for logger in _config_loggers(configs):
            catch = _Catch(reasons, logger.getEffectiveLevel())
            installed.append((logger, catch, logger.level))
            logger.addFilter(catch)
            logger.setLevel(logging.DEBUG)  # WhyNoPartition logs at DEBUG: let the record reach the filter
        yield reasons
    finally:
        for logger, catch, level in installed:
            logger.setLevel(level)
            logger.removeFilter(catch)
