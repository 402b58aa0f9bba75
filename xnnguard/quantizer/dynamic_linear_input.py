"""Give a dynamically quantized linear on a 4-D tensor XNNPACK may hold channels-last a 2-D input.

Before serializing a delegate, ExecuTorch 1.5.1's ``ChannelsLastTaggedReshapePass`` gives a linear an
NCHW input. Where the linear's 4-D input comes from a conv or pooling of the same delegate (NHWC there,
``xnnguard.graph.channels_last``), it converts it with a copy; a statically quantized input gets a copy
between a new quantize and dequantize, but a dynamically quantized one (a ``dequantize_per_tensor.tensor``,
whose scale a ``choose_qparams`` picks at run time) is taken for a float tensor: the linear then reads
a float copy while its weight is int8, and the lowering fails (``RuntimeError: Weight and Input should
both be quantized``), stock too: ``avg_pool2d -> linear`` over the width, in dynamic int8.

Here such a linear reads ``x.reshape(-1, K)`` and its output is reshaped back. 1.5.1 lays a view's input
out NCHW with a plain copy (the view reads the float tensor before quantization), and the linear then
quantizes a 2-D tensor the pass leaves alone. A dynamic config annotates no view, and ``choose_qparams``
picks one scale for the whole tensor whatever its shape: no rounding is added, the numbers are the same.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from xnnguard.graph.channels_last import may_be_channels_last
from xnnguard.graph.ops import is_op
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.views.base import view_sizes

__all__ = ["give_linears_2d_inputs"]

_aten = torch.ops.aten


def _misplaced_input(linear: Node) -> Node | None:
    """The 4-D input of ``linear`` that 1.5.1 may hold channels-last, or None."""
    x = linear.args[0] if is_op(linear, "linear") and linear.args else None
    if not isinstance(x, Node):
        return None
    value = x.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dim() != 4 or not isinstance(value.shape[-1], int):
        return None
    return x if may_be_channels_last(x) else None


def give_linears_2d_inputs(model: GraphModule) -> list[str]:
    """Make every linear whose 4-D input 1.5.1 would take for float in dynamic int8 read it as 2-D rows.

    Returns the linears' names.
    """
    changed: list[str] = []
    graph = model.graph
    for linear in list(graph.nodes):
        x = _misplaced_input(linear)
        if x is None:
            continue
        shape = list(linear.meta["val"].shape)
        with graph.inserting_before(linear):
            rows = call_like(graph, linear, _aten.reshape.default, (x, [-1, int(x.meta["val"].shape[-1])]))
        linear.replace_input_with(x, rows)
        linear.meta["val"] = linear.meta["val"].reshape(-1, shape[-1])
        with graph.inserting_after(linear):
            back = call_like(graph, linear, _aten.reshape.default, (linear, view_sizes(shape)))
        for user in [user for user in linear.users if user is not back]:
            user.replace_input_with(linear, back)
        changed.append(linear.name)
    if changed:
        graph.lint()
        model.recompile()
    return changed
