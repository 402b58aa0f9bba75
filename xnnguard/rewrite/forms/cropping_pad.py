"""A pad by a negative width (a crop) runs as slices, then a pad by the widths that are not negative.

``F.pad`` crops where a width is negative. UNets written after the original paper pad the skip connection
to the upsampled tensor's size with ``F.pad(x, [diff // 2, diff - diff // 2, ...])``, which crops when the
skip is the larger. ExecuTorch 1.5.1's ``ConstantPadConfig`` refuses a negative width, so the pad stays
out of XNNPACK, and the portable ``constant_pad_nd`` checks ``pad >= 0`` when the program runs: the
program lowers without a word, then every forward fails ("Padding values must be non-negative").

``CroppingPadPass`` writes such a pad as one slice per cropped dim and, when a width is positive, a pad
by the positive widths (the same value): both XNNPACK ops, and the same values, moved. Left as it was:
a crop of a dim whose size is dynamic (its slice would need the size in the graph).
"""

from __future__ import annotations

import torch

from xnnguard.graph.pads import constant_pad
from xnnguard.graph.shapes import tensor_value
from xnnguard.rewrite.insert import call_like
from xnnguard.rewrite.node_rewrite import NodeRewritePass

__all__ = ["CroppingPadPass", "crops"]

_aten = torch.ops.aten


def crops(node: torch.fx.Node) -> bool:
    """True for a constant pad with a negative width."""
    pad = constant_pad(node)
    return pad is not None and any(width < 0 for width in pad[0])


class CroppingPadPass(NodeRewritePass):
    """Rewrites ``pad(x, widths)`` with negative widths into ``pad(slice(...(x)), max(widths, 0))``."""

    subject = "pad by a negative width"

    def picks(self, node: torch.fx.Node) -> bool:
        return crops(node)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        pad, source = constant_pad(node), tensor_value(node.args[0])
        assert pad is not None
        widths, value = pad
        if source is None:
            return "its input has no shape information"
        cuts = []  # (dim, start, end) per cropped dim
        for i in range(0, len(widths), 2):
            dim, before, after = source.dim() - 1 - i // 2, widths[i], widths[i + 1]
            if before < 0 or after < 0:
                size = source.shape[dim]
                if not isinstance(size, int):
                    return f"it crops dim {dim}, whose size is dynamic"
                cuts.append((dim, max(-before, 0), size - max(-after, 0)))
        graph, result = graph_module.graph, node.args[0]
        with graph.inserting_before(node):
            for dim, start, end in cuts:
                result = call_like(graph, node, _aten.slice.Tensor, (result, dim, start, end))
            padded = [max(width, 0) for width in widths]
            if any(padded):
                result = call_like(graph, node, _aten.constant_pad_nd.default, (result, padded, value))
        node.replace_all_uses_with(result)  # type: ignore[arg-type]
        graph.erase_node(node)
        return None
