"""An op that only moves values keeps its input's quantization: a zero pad of int8 values is int8 values.

The stock XNNPACK quantizer lets a view, permute or slice share its input's quantization
(``propagate_annotation``) but leaves ``F.pad`` alone. A pad between two quantized ops then gets the
next op's input quantization after it, and one read by a float op gets none: ExecuTorch's
``InsertPadQDQPass`` then makes it an int8 pad with a float input, which XNNPACK refuses at load
(``xnnguard.rules.quantized_pad``). Zero padding adds the value 0, which every affine quantization
represents exactly, so sharing the input's quantization adds no rounding, and XNNPACK runs the pad int8.

1.4's stock quantizer also leaves ``aten.slice.Tensor`` alone (it lists only ``slice_copy``, which a
graph being quantized does not have): each slice got an observer of its own there, and XNNPACK a
quantize apart from the slice. A slice only moves values, so it shares here too.
"""

from __future__ import annotations

import torch
from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, SharedQuantizationSpec
from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

from xnnguard.graph.pads import zero_pad_widths

__all__ = ["share_input_quantization"]

_aten = torch.ops.aten


def _moves_values(node: torch.fx.Node) -> bool:
    return zero_pad_widths(node) is not None or node.target is _aten.slice.Tensor


def share_input_quantization(model: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """Annotate every zero pad and slice whose input is quantized to share that quantization; return them."""
    shared = []
    for node in model.graph.nodes:
        if node.op != "call_function" or not _moves_values(node) or Q_ANNOTATION_KEY in node.meta:
            continue
        source = node.args[0]
        annotation = source.meta.get(Q_ANNOTATION_KEY) if isinstance(source, torch.fx.Node) else None
        if annotation is None or annotation.output_qspec is None:
            continue
        spec = SharedQuantizationSpec(source)
        node.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(
            input_qspec_map={source: spec}, output_qspec=spec, _annotated=True
        )
        shared.append(node)
    return shared
