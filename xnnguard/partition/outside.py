"""Every node the partitioner leaves outside XNNPACK gets one record that says why.

"Which ops fell back, and why?" has one answer per node, in this order:

1. a rule of xnnguard's (``keep_out_reason``: above 6 dims, a 3-D convolution, a tag, ...) — asked here
   too for nodes no config is registered for, such as a ``max_pool3d`` the rewrite left tagged;
2. nothing XNNPACK runs computes it (``xnnguard.rules.no_equivalent``: an integer tensor, a gather by
   indices known only at run time);
3. ExecuTorch's XNNPACK config for the op refused it: its own reason, the ``why(...)`` text it logs at
   DEBUG (``xnnguard.boundary.why_no_partition``), or, where it gives none, which config refused it; a
   bfloat16 node refused as an "invalid dtype" is said to be so (``xnnguard.rules.bfloat16.not_enabled``:
   bfloat16 is delegated only with ``enable_bf16=True``);
4. no XNNPACK config takes the operator at all (``aten.native_layer_norm.default``);
5. its config took it into a match but no partition kept that match (the stock grouping split it off).

Only operator calls count: ``getitem`` and the other Python operators that read a tuple or compute a
size are not ops XNNPACK could run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from executorch.exir.backend.canonical_partitioners.config_partitioner import format_target_name

from xnnguard.graph.ops import target_name
from xnnguard.report import KeptOut, Rule
from xnnguard.rules.bfloat16 import not_enabled
from xnnguard.rules.keep_out import keep_out_reason
from xnnguard.rules.registry import first_record
from xnnguard.rules.rule import Scope

if TYPE_CHECKING:
    import torch

__all__ = ["is_operator_call", "outside_record"]


def is_operator_call(node: torch.fx.Node) -> bool:
    """A ``call_function`` of an operator (ATen, edge, quantized_decomposed, ...), not of Python's ``operator``."""
    if node.op != "call_function":
        return False
    module = getattr(node.target, "__module__", None)
    return module not in ("_operator", "operator", "builtins")


def outside_record(
    node: torch.fx.Node,
    configs: Mapping[str, object],
    refused: Mapping[torch.fx.Node, str],
    reasons: Mapping[torch.fx.Node, str],
) -> KeptOut:
    """The record of ``node``, left outside XNNPACK with no record of the partitioner's own.

    ``configs`` are the partitioner's configs by target name, ``refused`` the nodes a config's check
    refused (by the config's class name) and ``reasons`` what the configs logged for them.
    """
    record = keep_out_reason(node)
    if record is not None:
        return record
    explained = first_record(node, Scope.EXPLANATION)
    if explained is not None:
        return explained
    op = target_name(node)
    name = getattr(node.target, "__name__", None)
    if node in refused:
        reason = reasons.get(node) or f"{refused[node]}.check_constraints refuses it (it gives no reason)"
        config = configs.get(format_target_name(name)) if isinstance(name, str) else None
        bfloat16 = not_enabled(node, getattr(config, "enable_bf16", None)) if reason == "invalid dtype" else None
        if bfloat16 is not None:
            return KeptOut(node.name, op, Rule.BFLOAT16, bfloat16)
        return KeptOut(node.name, op, Rule.XNNPACK_CONFIG, f"XNNPACK's {refused[node]}: {reason}")
    if not isinstance(name, str) or format_target_name(name) not in configs:
        return KeptOut(node.name, op, Rule.NO_XNNPACK_CONFIG, f"no XNNPACK config takes {op}")
    return KeptOut(node.name, op, Rule.XNNPACK_CONFIG, "its XNNPACK config matched it, but no partition kept the match")
