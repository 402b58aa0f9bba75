"""The stock conv + batch norm patterns match only a graph that has a batch norm: without one, skip them.

ExecuTorch's ``XNNPACKQuantizer`` (1.4.0 to 1.5.1) annotates conv + batch norm [+ ReLU] by tracing
12 pattern graphs with ``torch.export`` on every ``annotate`` call, whatever the model: some 3 s, nearly
all of ``prepare_pt2e`` on a small model. A pattern holding a batch norm node matches no graph without
one, so skipping those patterns there changes no annotation.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch.fx import GraphModule

from xnnguard.boundary.stock_quantizer import patterns_of, with_patterns
from xnnguard.graph.ops import op_of

__all__ = ["only_patterns_that_can_match"]


def _has_batch_norm(model: GraphModule) -> bool:
    """A node of any batch norm operator (``batch_norm``, ``_native_batch_norm_legit[_no_training]``, ...)."""
    return any((found := op_of(node)) is not None and "batch_norm" in found[0] for node in model.graph.nodes)


def _is_batch_norm_pattern(pattern: Any) -> bool:
    """A stock ``QuantPattern`` with a batch norm in it: ``conv_bn``, ``conv_transpose_bn_relu``, ..."""
    return "bn" in pattern.name.split("_")


@contextmanager
def only_patterns_that_can_match(quantizer: Any, model: GraphModule) -> Iterator[None]:
    """While it lasts, ``quantizer`` loops over its patterns minus the batch norm ones if ``model`` has none."""
    if _has_batch_norm(model):
        yield
        return
    with with_patterns(quantizer, [p for p in patterns_of(quantizer) if not _is_batch_norm_pattern(p)]):
        yield
