"""The guarded XNNPACK partitioner: ExecuTorch's, never delegating what XNNPACK cannot load and run."""

from xnnguard.partition.partitioner import XnnpackPartitioner

__all__ = ["XnnpackPartitioner"]
