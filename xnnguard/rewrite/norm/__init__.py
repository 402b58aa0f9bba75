"""Normalizations as ops XNNPACK runs: layer, RMS, group and instance norms, batch norms with batch statistics.

ExecuTorch 1.5.1's XNNPACK partitioner has no config for any of them (and XNNPACK has no such op);
each is rewritten into fully connected ops against a ``1/K`` vector (the means), elementwise ops and
``rsqrt`` (``base``). One module per family: ``layer_norm`` (layer norm, RMS norm), ``group_norm``,
``instance_norm`` (instance norm, batch norm with batch statistics). All leave their pieces float under
quantization, as the stock XNNPACK quantizer leaves the norms.
"""

from __future__ import annotations

from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.rewrite.norm.group_norm import RewriteGroupNormPass
from xnnguard.rewrite.norm.instance_norm import RewriteInstanceNormPass
from xnnguard.rewrite.norm.layer_norm import RewriteLayerNormPass, RewriteRmsNormPass

__all__ = ["RewriteGroupNormPass", "RewriteInstanceNormPass", "RewriteLayerNormPass", "RewriteRmsNormPass", "passes"]


def passes() -> list[PassBase]:
    """The normalization rewrites. They run after ``ReduceRankPass``, which brings a layer norm above 6
    dims to ``(rows, *normalized_shape)``, and need no order among themselves."""
    return [RewriteLayerNormPass(), RewriteRmsNormPass(), RewriteGroupNormPass(), RewriteInstanceNormPass()]
