"""ExecuTorch's ``XNNPACKQuantizer`` with its two private seams named: the per-config hook and the pattern list.

The stock ``annotate`` (1.4.0 to 1.5.1) hands every ``set_global`` / ``set_operator_type`` /
``set_module_*`` config to ``_annotate_all_patterns(model, config, filter_fn, operator_target)``, which loops
over ``SUPPORTED_PATTERNS`` and annotates each pattern whose nodes ``filter_fn`` accepts. xnnguard's
quantizer changes what a config may reach (``config_filter``) and skips patterns that cannot match
(``patterns_of`` / ``with_patterns``); this module is the one place that knows those names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer as _Stock
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantizer import QuantizationConfig

__all__ = ["ConfigFilteringQuantizer", "NodeFilter", "patterns_of", "with_patterns"]

NodeFilter = Callable[[Node], bool]

_PATTERNS = "SUPPORTED_PATTERNS"  # the list the stock per-config hook loops over


class ConfigFilteringQuantizer(_Stock):
    """The stock quantizer, where a subclass decides which nodes each config may annotate."""

    def config_filter(
        self,
        filter_fn: NodeFilter | None,
        operator_target: torch._ops.OpOverloadPacket | None,
        quantization_config: QuantizationConfig | None = None,
    ) -> NodeFilter | None:
        """The filter ``quantization_config`` is applied with (the stock one: ``filter_fn``); None: the
        config reaches nothing."""
        return filter_fn

    def _annotate_all_patterns(
        self,
        model: GraphModule,
        quantization_config: QuantizationConfig | None,
        filter_fn: NodeFilter | None = None,
        operator_target: torch._ops.OpOverloadPacket | None = None,
    ) -> GraphModule:
        chosen = self.config_filter(filter_fn, operator_target, quantization_config)
        if chosen is None:
            return model
        return super()._annotate_all_patterns(model, quantization_config, chosen, operator_target)


def patterns_of(quantizer: Any) -> Sequence[Any]:
    """The stock ``QuantPattern``s the quantizer annotates (each has a ``name`` such as ``"conv_bn_relu"``)."""
    return list(getattr(quantizer, _PATTERNS))


@contextmanager
def with_patterns(quantizer: Any, patterns: Sequence[Any]) -> Iterator[None]:
    """While it lasts, ``quantizer`` loops over ``patterns`` instead of its own.

    An instance attribute shadows the class's list and is taken away after it (a list the caller set on the
    instance is put back).
    """
    own = quantizer.__dict__.get(_PATTERNS)
    setattr(quantizer, _PATTERNS, list(patterns))
    try:
        yield
    finally:
        if own is None:
            delattr(quantizer, _PATTERNS)
        else:
            setattr(quantizer, _PATTERNS, own)
