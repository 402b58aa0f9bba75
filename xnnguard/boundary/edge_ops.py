"""Which dialect an FX node's operator belongs to: ExecuTorch's edge ops are a class of its private module."""

from __future__ import annotations

from typing import Any

__all__ = ["is_edge_op"]


def is_edge_op(target: Any) -> bool:
    """True for an edge-dialect operator (``exir_ops.edge.aten.*``), False for an ATen or Python one."""
    from executorch.exir.dialects.edge._ops import EdgeOpOverload

    return isinstance(target, EdgeOpOverload)
