"""Which 4-D tensors ExecuTorch's XNNPACK lowering may hold channels-last (NHWC) inside a delegate.

``ChannelsLastTaggedReshapePass`` (run in ``XnnpackBackend.preprocess``, 1.5.1 and before) lays out the
input of a convolution, pooling, bilinear upsampling, mean, amax/max or PReLU as NHWC, and every op it
does not know to be layout-sensitive ("agnostic") takes the layout of its inputs. The serializer remaps
the dim arguments of the ops it knows about (cat, slice, permute, pad, mean, max) but not softmax's: a
4-D softmax over its last dim whose input is NHWC normalizes over the channels instead (measured: a
conv -> softmax(dim=3) program is off by 0.19 on 1.5.1, stock and xnnguard alike).

The question asked here is the conservative one, "may it be NHWC": a rewrite that makes a tensor NCHW
where it already was costs a view, a wrong answer costs the program.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xnnguard.graph.ops import is_op

if TYPE_CHECKING:
    import torch

__all__ = ["may_be_channels_last"]

# What the pass lays out NHWC: the ops its ``memory_sensitive_ops_nhwc`` names, in the ATen names they
# have before ``to_edge`` (a batch norm becomes a depthwise conv or is fused into one; an adaptive pool
# becomes an average pool) and the edge names after.
_MAKES_NHWC = frozenset({
    "convolution", "conv2d", "conv_transpose2d", "max_pool2d", "max_pool2d_with_indices", "avg_pool2d",
    "adaptive_avg_pool2d", "_adaptive_avg_pool2d", "adaptive_max_pool2d", "upsample_bilinear2d",
    "upsample_nearest2d", "mean", "amax", "max", "prelu", "batch_norm", "_native_batch_norm_legit_no_training",
    "native_batch_norm", "_native_batch_norm_legit", "instance_norm",
})
# What the pass lays out NCHW (its ``memory_sensitive_ops_nchw``, view_copy) and what produces a tensor
# of another rank that a view turns 4-D (the matrix products of attention): their outputs are NCHW.
_MAKES_NCHW = frozenset({
    "view", "view_copy", "reshape", "_unsafe_view", "squeeze", "squeeze_copy", "unsqueeze", "unsqueeze_copy",
    "linear", "bmm", "mm", "matmul", "flatten", "unflatten",
})


def may_be_channels_last(node: torch.fx.Node) -> bool:
    """Whether the 4-D tensor ``node`` computes may be NHWC in the delegate that takes it.

    A graph input or constant is NCHW unless its example is channels-last; an op the pass lays out NHWC
    makes it so; any other op may pass an NHWC input on (the pass keeps an agnostic op NHWC when its
    inputs are, or converts them to NHWC together).
    """
    seen: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        value = current.meta.get("val")
        if getattr(value, "ndim", None) != 4:
            continue  # the pass tags 4-D tensors only
        if current.op in ("placeholder", "get_attr"):
            if _channels_last_example(value):
                return True
            continue
        if is_op(current, _MAKES_NCHW):
            continue
        if is_op(current, _MAKES_NHWC):
            return True
        stack.extend(current.all_input_nodes)
    return False


def _channels_last_example(value: object) -> bool:
    import torch

    return (isinstance(value, torch.Tensor) and not value.is_contiguous()
            and value.is_contiguous(memory_format=torch.channels_last))
