"""FX passes and the guarded partitioner: run before (or as) XNNPACK partitioning."""

from xnnguard.passes.do_not_delegate import DO_NOT_DELEGATE, keep_out_reason
from xnnguard.passes.fold_batch_norm3d import FoldBatchNorm3dPass
from xnnguard.passes.pass_result import ReportedPassResult
from xnnguard.passes.reduce_rank import ReduceRankPass
from xnnguard.passes.rewrite_batch_norm3d import RewriteBatchNorm3dPass
from xnnguard.passes.rewrite_conv3d import RewriteConv3dPass
from xnnguard.passes.rewrite_conv_transpose3d import RewriteConvTranspose3dPass
from xnnguard.passes.rewrite_for_xnnpack import RewriteError, XnnpackRewriter, default_rewrites, rewrite_for_xnnpack
from xnnguard.passes.rewrite_pool3d import RewritePool3dPass
from xnnguard.passes.tag_conv3d import TagConv3dPass
from xnnguard.passes.tag_high_rank import TagHighRankPass
from xnnguard.passes.xnnpack_partitioner import XnnpackPartitioner

__all__ = [
    "DO_NOT_DELEGATE",
    "FoldBatchNorm3dPass",
    "ReduceRankPass",
    "ReportedPassResult",
    "RewriteBatchNorm3dPass",
    "RewriteConv3dPass",
    "RewriteConvTranspose3dPass",
    "RewriteError",
    "RewritePool3dPass",
    "TagConv3dPass",
    "TagHighRankPass",
    "XnnpackPartitioner",
    "XnnpackRewriter",
    "default_rewrites",
    "keep_out_reason",
    "rewrite_for_xnnpack",
]
