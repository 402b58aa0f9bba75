"""The passes and the guarded partitioner, under the import path of xnnguard 0.1 (kept for user code).

Where things live now: ``xnnguard.tagging`` (the tag and the tag passes), ``xnnguard.rules`` (what
XNNPACK cannot take), ``xnnguard.partition`` (the partitioner), ``xnnguard.rewrite`` (the rewrites).
"""

from xnnguard.partition.partitioner import XnnpackPartitioner
from xnnguard.pass_result import ReportedPassResult
from xnnguard.rewrite.conv3d.batch_norm3d import RewriteBatchNorm3dPass
from xnnguard.rewrite.conv3d.conv3d import RewriteConv3dPass
from xnnguard.rewrite.conv3d.conv_transpose3d import RewriteConvTranspose3dPass
from xnnguard.rewrite.conv3d.fold_batch_norm3d import FoldBatchNorm3dPass
from xnnguard.rewrite.conv3d.pool3d import RewritePool3dPass
from xnnguard.rewrite.rank.reduce_rank import ReduceRankPass
from xnnguard.rewrite.rewrite_for_xnnpack import RewriteError, XnnpackRewriter, default_rewrites, rewrite_for_xnnpack
from xnnguard.rules.keep_out import keep_out_reason
from xnnguard.tagging import DO_NOT_DELEGATE, TagConv3dPass, TagHighRankPass

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
