"""A transposed 2-D convolution whose output padding is not below its stride as one without, and a slice.

Invariant established: no ``conv_transpose2d`` over a static (H, W) has an ``output_padding`` at or above
its stride along a dim (where its padding is at least that output padding). PyTorch allows an output
padding below the stride *or the dilation*; XNNPACK's deconvolution takes an adjustment below the stride
only, and ExecuTorch 1.5.1's config does not check it: the program lowered and failed at run ("Propagating
input shapes failed", ``xnn_status_invalid_parameter``; fuzz seed 232: a ConvTranspose3d with dilation 2,
stride 1 and output padding 1, whose 2-D form keeps them; stock too).

The form: along such a dim, the convolution with no padding and no output padding (its full output,
``(n - 1) * stride + dilation * (kernel - 1) + 1`` long), then the slice ``[padding, padding + length)``
of the original output's length. Exact: padding crops ``padding`` positions on each side of the full
output and output padding gives back that many at the end, which hold the full output's values as long as
they are within it (``output_padding <= padding``). int8: the slice shares the convolution's
quantization; nothing rounds that did not. A larger output padding (positions past the full output, which
hold the bias alone) is left, tagged: it runs on the portable kernel, and the record says why.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xnnguard.graph.args import schema_arguments
from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.size_args import Pair, pair
from xnnguard.rewrite.views.base import replace_by

__all__ = ["TransposedOutputPaddingPass"]

_aten = torch.ops.aten


def _refused_dims(stride: Pair, output_padding: Pair) -> list[int]:
    return [d for d in (0, 1) if output_padding[d] >= stride[d] > 0 and output_padding[d] > 0]


class TransposedOutputPaddingPass(NodeRewritePass):
    """Replaces each transposed 2-D convolution XNNPACK refuses for its output padding by one it takes and a slice."""

    rule = Rule.NOT_REWRITTEN
    # what it leaves XNNPACK would refuse at run: tagged, it runs on the portable kernel instead
    tags_what_it_leaves = True
    subject = "transposed 2-D convolution with an output padding not below its stride"

    def picks(self, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node.target is not _aten.conv_transpose2d.input:
            return False
        arguments = schema_arguments(node) or {}
        stride = pair(arguments.get("stride", 1))
        return bool(_refused_dims(stride, pair(arguments.get("output_padding", 0))))

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        arguments = schema_arguments(node) or {}
        stride, padding = pair(arguments.get("stride", 1)), pair(arguments.get("padding", 0))
        output_padding, dilation = pair(arguments.get("output_padding", 0)), pair(arguments.get("dilation", 1))
        groups = arguments.get("groups", 1)
        assert isinstance(groups, int)
        out = tensor_value(node)
        if out is None or out.dim() != 4 or not all(isinstance(size, int) for size in out.shape[2:]):
            return "its input is not 4-D with a static height and width"
        dims = _refused_dims(stride, output_padding)
        if any(output_padding[d] > padding[d] for d in dims):
            return ("its output padding exceeds its padding (positions past the full output): left to the "
                    "portable kernel, as XNNPACK refuses an output padding not below the stride")
        new_padding = tuple(0 if d in dims else padding[d] for d in (0, 1))
        new_output_padding = tuple(0 if d in dims else output_padding[d] for d in (0, 1))
        lengths = [int(out.shape[2 + d]) for d in (0, 1)]

        def form(x: torch.Tensor, weight: torch.Tensor, *bias: torch.Tensor) -> torch.Tensor:
            y = F.conv_transpose2d(x, weight, bias[0] if bias else None, stride, new_padding, new_output_padding,
                                   groups, dilation)
            for d in dims:
                y = y.narrow(2 + d, padding[d], lengths[d])
            return y

        x, weight, bias = node.args[0], node.args[1], arguments.get("bias")
        inputs = [x, weight] + ([bias] if isinstance(bias, torch.fx.Node) else [])
        replace_by(graph_module, node, form, inputs)  # type: ignore[arg-type]
        graph_module.graph.erase_node(node)
        return None
