"""Which convolutions XNNPACK runs dynamically quantized: 2-D ones that are not depthwise.

This module is the one place that fact lives. ExecuTorch 1.5.1's ``ConvolutionConfig`` refuses a
dynamically quantized convolution whose weight is not 4-D (a 1-D conv, a 3-D one) or that is depthwise
(one input channel per group, in its sense: a conv of a single input channel counts). The stock quantizer
annotates them all the same: the conv, its dynamic quantize and its per-channel dequantize then ran on
portable kernels between two delegates (fuzz seed 179, a rewritten ConvTranspose3d of one input channel,
stock too for a plain one). ``xnnguard.XNNPACKQuantizer`` leaves such a conv float under a dynamic config,
with a record (``Rule.DYNAMIC_CONV_KIND``), and XNNPACK runs it in float inside the delegate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xnnguard.graph.ops import is_op

if TYPE_CHECKING:
    import torch

__all__ = ["dynamic_quantization_refuses"]

_CONVS = frozenset({"conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d", "convolution"})


def _is_depthwise(weight_shape: tuple[int, ...], groups: int, transposed: bool) -> bool:
    """ExecuTorch's ``is_depthwise_conv``: one input channel per group, the outputs a multiple of it."""
    if len(weight_shape) < 2 or groups < 1:
        return False
    if transposed:
        group_inputs, group_outputs = weight_shape[0] // groups, weight_shape[1]
    else:
        group_inputs, group_outputs = weight_shape[1], weight_shape[0] // groups
    return group_inputs == 1 and group_outputs % group_inputs == 0


def dynamic_quantization_refuses(node: torch.fx.Node) -> str | None:
    """Why XNNPACK cannot run convolution ``node`` dynamically quantized, or None (it can, or it is no conv)."""
    import torch

    if not is_op(node, _CONVS) or len(node.args) < 2 or not isinstance(node.args[1], torch.fx.Node):
        return None
    weight = node.args[1].meta.get("val")
    if not isinstance(weight, torch.Tensor):
        return None
    from xnnguard.graph.args import schema_arguments

    arguments = schema_arguments(node) or {}
    transposed = bool(arguments.get("transposed", "transpose" in str(getattr(node.target, "__name__", ""))))
    groups = arguments.get("groups", 1)
    if weight.dim() != 4:
        return f"a {weight.dim() - 2}-D convolution: XNNPACK quantizes only 2-D ones dynamically"
    if isinstance(groups, int) and _is_depthwise(tuple(int(s) for s in weight.shape), groups, transposed):
        return "a depthwise convolution (one input channel per group): XNNPACK quantizes none dynamically"
    return None
