"""Inference batch norms in the forms ExecuTorch 1.5.1's XNNPACK lowering handles right.

1.5.1 fuses an inference batch norm into the conv or linear before it (``FuseBatchNormPass``) or
decomposes it into a depthwise 1x1 convolution (``DecomposeBatchNorm``), inside the delegate. Two forms
break those passes, stock and xnnguard alike: a batch norm right behind another (``merge``), and one
behind a grouped transposed convolution (``transposed_fold``). ``base`` holds what they share: which
nodes are inference batch norms, and the per-channel affine map one computes.
"""

from __future__ import annotations

from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.rewrite.batch_norm.merge import MergeBatchNormsPass
from xnnguard.rewrite.batch_norm.transposed_fold import FoldBatchNormIntoGroupedTransposedConvPass

__all__ = ["FoldBatchNormIntoGroupedTransposedConvPass", "MergeBatchNormsPass", "passes"]


def passes() -> list[PassBase]:
    """The batch-norm rewrites, before the 3-D ones: a merged batch norm behind a 3-D conv is then folded
    into it (``FoldBatchNorm3dPass``), one behind a grouped ConvTranspose3d is folded before that conv is
    rewritten as 2-D ops."""
    return [MergeBatchNormsPass(), FoldBatchNormIntoGroupedTransposedConvPass()]
