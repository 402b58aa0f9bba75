"""Inference batch norms in the forms ExecuTorch 1.5.1's XNNPACK lowering handles right.

1.5.1 fuses an inference batch norm into the conv or linear before it (``FuseBatchNormPass``) or
decomposes it into a depthwise 1x1 convolution (``DecomposeBatchNorm``), inside the delegate. A batch
norm right behind another breaks them, stock and xnnguard alike (``merge``). ``base`` holds which nodes
are inference batch norms, and the per-channel affine map one computes.
"""

from __future__ import annotations

from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.rewrite.batch_norm.merge import MergeBatchNormsPass

__all__ = ["MergeBatchNormsPass", "passes"]


def passes() -> list[PassBase]:
    """The batch-norm rewrites, before the 3-D ones: a merged batch norm behind a 3-D conv is then folded
    into it (``FoldBatchNorm3dPass``)."""
    return [MergeBatchNormsPass()]
