"""A slice of a tensor with a dynamic batch, on XNNPACK.

ExecuTorch's ``SliceCopyConfig`` (1.4 and 1.5) refuses every slice whose input or output has a symbolic
dim, so with a dynamic batch each slice stays on the portable kernels, a delegate boundary each (MViT:
195 slices, 46 delegates). Yet such a slice serializes right: ExecuTorch writes a symbolic dim's upper
bound as the slice's size there, at offset 0, and XNNPACK's static slice clamps a size past the end of
its input to the input's dim when it reshapes for a run (``static-slice.c``, reshape: the XNNPACK of
ExecuTorch 1.4 and 1.5 alike). A slice along a static dim that keeps every symbolic dim whole is thus
exact at every batch the program allows; ExecuTorch sizes its tensors by the same upper bounds, so a
batch above them fails before the slice runs.
"""

from __future__ import annotations

import torch

from xnnguard.graph.shapes import tensor_value

__all__ = ["keeps_symbolic_dims_whole"]


def keeps_symbolic_dims_whole(node: torch.fx.Node) -> bool:
    """True for a stride-1 ``slice_copy`` along a static dim whose symbolic dims pass through unchanged.

    False when it slices a symbolic dim, has a symbolic or zero size, bound or step, or has no
    symbolic dim at all (the stock config decides those).
    """
    before, value = tensor_value(node.args[0] if node.args else None), tensor_value(node)
    if before is None or value is None or before.dim() != value.dim() or before.dim() == 0:
        return False
    dim = node.args[1] if len(node.args) > 1 else 0
    bounds = node.args[2:5]
    if not isinstance(dim, int) or not all(bound is None or type(bound) is int for bound in bounds):
        return False  # a symbolic bound
    if len(bounds) == 3 and bounds[2] not in (None, 1):
        return False  # XNNPACK slices with step 1 only
    dim %= before.dim()
    symbolic = False
    for d, (size_in, size_out) in enumerate(zip(before.shape, value.shape, strict=True)):
        if isinstance(size_in, torch.SymInt):
            if d == dim or not isinstance(size_out, torch.SymInt) or size_in.node.expr != size_out.node.expr:
                return False
            symbolic = True
        elif not isinstance(size_out, int) or size_in == 0 or size_out == 0 or (d != dim and size_in != size_out):
            return False
    return symbolic
