"""Lowering that keeps every dynamic dim's exported range: ``keep_dynamic_ranges``.

Why it is needed is the rule in ``xnnguard.rules.conv_batch_range``: while ExecuTorch lowers and
serializes a program, FakeTensor's convolution guards on a dynamic batch (ATen's NNPACK choice) and the
program's input buffers are planned for part of the range export proved. ``XnnpackPartitioner`` warns
when a program has such a convolution and the lowering runs outside ``keep_dynamic_ranges``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from xnnguard.rules.conv_batch_range import batch_range_narrowed_by

if TYPE_CHECKING:
    import torch

__all__ = ["keep_dynamic_ranges", "ranges_kept", "warn_about_narrowed_ranges"]

logger = logging.getLogger("xnnguard")


@contextmanager
def keep_dynamic_ranges() -> Iterator[None]:
    """Lower and serialize inside this block, and the program runs over every size export allowed.

    Inside it the size questions torch asks while ExecuTorch traces the exported program again (such as
    ATen's "is the batch at least 16?" for NNPACK and oneDNN) are answered from the example's sizes, as
    they are anyway, without a guard that would narrow the dim's range. Export proved the program's
    computation over the whole range; these questions only choose the fake tensors' memory formats.

    >>> with xnnguard.keep_dynamic_ranges():                                      # doctest: +SKIP
    ...     program = to_edge_transform_and_lower(ep, partitioner=[xnnguard.XnnpackPartitioner()]).to_executorch()
    """
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with ShapeEnv().suppress_guards():  # the flag is per thread: it covers every program's ShapeEnv
        yield


def ranges_kept() -> bool:
    """True inside ``keep_dynamic_ranges`` (or wherever torch suppresses guards)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return bool(ShapeEnv._suppress_guards_tls())


def warn_about_narrowed_ranges(graph: torch.fx.Graph) -> list[str]:
    """Log a warning for each convolution whose dynamic batch lowering will narrow; return the messages.

    Nothing to warn about inside ``keep_dynamic_ranges``.
    """
    if ranges_kept():
        return []
    found = []
    for node in graph.nodes:
        why = batch_range_narrowed_by(node)
        if why is not None:
            found.append(f"{node.name}: {why}")
    if found:
        logger.warning(
            "xnnguard: %d convolution(s) will narrow a dynamic batch's range while lowering (first: %s); lower and "
            "call to_executorch() inside `with xnnguard.keep_dynamic_ranges():` to keep it",
            len(found), found[0],
        )
    return found
