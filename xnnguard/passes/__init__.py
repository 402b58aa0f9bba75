"""FX passes and the guarded partitioner: run before (or as) XNNPACK partitioning."""

from xnnguard.passes.do_not_delegate import DO_NOT_DELEGATE, keep_out_reason
from xnnguard.passes.pass_result import ReportedPassResult
from xnnguard.passes.tag_conv3d import TagConv3dPass
from xnnguard.passes.tag_high_rank import TagHighRankPass
from xnnguard.passes.xnnpack_partitioner import XnnpackPartitioner

__all__ = [
    "DO_NOT_DELEGATE",
    "ReportedPassResult",
    "TagConv3dPass",
    "TagHighRankPass",
    "XnnpackPartitioner",
    "keep_out_reason",
]
