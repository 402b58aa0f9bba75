"""Reductions and small powers as ops XNNPACK runs: sums, means, variances, norms, maxima, minima, ``x ** n``.

ExecuTorch 1.5.1's XNNPACK partitioner takes a mean as 4-D global average pooling only, a max over H
or W of a 4-D tensor only, and ``pow`` with the int exponent 2 only; it has no config for sum, var,
amax or amin, and takes a softmax over the last dim only. The rewrites: ``softmax`` (softmax over any
dim, log-softmax), ``keepdim_mean`` (a 4-D mean over H and W in the one written form 1.5.1
takes), ``sums`` (sum, mean, var, std, vector norm as linears against constant vectors), ``extrema``
(max and min as trees of ``maximum``/``minimum`` of slices), ``adaptive_max`` (adaptive max pooling,
which 1.5.1's ``to_edge`` refuses), ``adaptive_avg`` (adaptive average pooling to a grid, as an average
pooling or linears), ``avg_pool2d`` (the average poolings 1.5.1's config refuses: ceil mode, a counted
padding, a divisor override), ``strided_max_pool`` (a max pooling whose stride exceeds its kernel),
``power``; ``plan`` holds the arithmetic of which view and permute gather a reduction's elements,
``forms`` the plain-PyTorch forms.
"""

from __future__ import annotations

from torch.fx.passes.infra.pass_base import PassBase

from xnnguard.rewrite.reduce.adaptive_avg import RewriteAdaptiveAvgPoolPass
from xnnguard.rewrite.reduce.adaptive_max import RewriteAdaptiveMaxPoolPass
from xnnguard.rewrite.reduce.avg_pool2d import RewriteAvgPool2dPass
from xnnguard.rewrite.reduce.ceil_max_pool import RewriteCeilMaxPool2dPass
from xnnguard.rewrite.reduce.extrema import RewriteExtremumPass
from xnnguard.rewrite.reduce.keepdim_mean import MeanKeepdimPass
from xnnguard.rewrite.reduce.power import RewritePowerPass
from xnnguard.rewrite.reduce.softmax import SoftmaxAnyDimPass
from xnnguard.rewrite.reduce.strided_max_pool import RewriteStridedMaxPool2dPass
from xnnguard.rewrite.reduce.sums import RewriteSumPass

__all__ = [
    "MeanKeepdimPass",
    "RewriteAdaptiveAvgPoolPass",
    "RewriteAdaptiveMaxPoolPass",
    "RewriteAvgPool2dPass",
    "RewriteCeilMaxPool2dPass",
    "RewriteExtremumPass",
    "RewritePowerPass",
    "RewriteStridedMaxPool2dPass",
    "RewriteSumPass",
    "SoftmaxAnyDimPass",
    "passes",
]


def passes() -> list[PassBase]:
    """The reduction rewrites, after ``ReduceRankPass`` (which merges the dims of one above 6 dims).

    The softmax comes first: its log-softmax form is an ``amax`` and a ``sum`` the later passes rewrite.
    The power comes before the means so that a ``x ** 2.0`` under a mean is a multiply before the mean is
    rewritten (no order is needed for correctness). ``MeanKeepdimPass`` and ``RewriteSumPass`` pick
    disjoint means. The adaptive poolings are not among them: ``default_rewrites`` runs them before the
    3-D poolings, which rewrite the ``max_pool3d`` an even adaptive max pooling becomes (its uneven
    windows are ``amax``es the extrema rewrite here) and report an uneven adaptive average pooling.
    """
    return [
        SoftmaxAnyDimPass(),
        RewritePowerPass(),
        MeanKeepdimPass(),
        RewriteSumPass(),
        RewriteExtremumPass(),
        RewriteAvgPool2dPass(),
        RewriteCeilMaxPool2dPass(),
        RewriteStridedMaxPool2dPass(),
    ]
