"""Rewrite 3-D max and average pooling as two 2-D poolings that XNNPACK delegates.

Invariant established: no ``max_pool3d``, ``max_pool3d_with_indices`` (indices unused), ``avg_pool3d`` or
``adaptive_avg_pool3d`` (output size dividing the input size) with static shapes is left. ExecuTorch
1.5.1 has neither a portable kernel nor an XNNPACK one for them: the program fails at load
(``kernel 'aten::max_pool3d_with_indices.out' not found``).

A 3-D window is the product of a depth range and an (H, W) window, so the pooling separates: a 2-D
pooling over (H, W) with the frames in the channels, then a 2-D pooling with a (kd, 1) window over (D,
H*W). For max that is exact as it stands (a stride above the kernel, which XNNPACK's max pooling
refuses, pools at a stride that fits and keeps every n-th window). For average, each stage averages over
the elements it sees (``count_include_pad=False``, the form XNNPACK takes; the extra windows of
``ceil_mode`` come from an explicit zero pad), and a constant map then turns that into PyTorch's divisor
(padding counted or not, windows clipped by ``ceil_mode``, ``divisor_override``): the map is PyTorch's
own ``avg_pool3d`` of a tensor of ones divided by the two stages applied to the same ones.

Over a dynamic frame count the same stages run with the frames in the batch, then as rows; an adaptive
pooling to one value per channel (a video classifier's head) is a global average pooling of the clip
(``global_average_of_a_clip``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch.fx.operator_schemas import normalize_function

from xnnguard.graph.ops import values_only_users
from xnnguard.report import Rule
from xnnguard.rewrite.conv3d.strided_select import select_every
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.reduce.forms import dynamic_rows_mean
from xnnguard.rewrite.size_args import Triple, ceil_extra, pooled_length, triple

__all__ = ["Pool3d", "RewritePool3dPass", "pool3d", "pool3d_as_2d", "pool3d_correction"]

logger = logging.getLogger("xnnguard.rewrite")

_aten = torch.ops.aten
_MAX_POOLS = {_aten.max_pool3d.default, _aten.max_pool3d_with_indices.default}
_AVG_POOLS = {_aten.avg_pool3d.default}
_ADAPTIVE_AVG_POOLS = {_aten.adaptive_avg_pool3d.default, _aten._adaptive_avg_pool3d.default}


@dataclass(frozen=True)
class Pool3d:
    """One 3-D pooling, normalized: every argument spelled out per dim."""

    kind: Literal["max", "avg"]
    input_shape: tuple[int, ...]  # (N, C, D, H, W) or unbatched (C, D, H, W)
    kernel: Triple
    stride: Triple
    padding: Triple
    dilation: Triple = (1, 1, 1)
    ceil_mode: bool = False
    count_include_pad: bool = True
    divisor_override: int | None = None
    # the depth (frames) is known only at run time: input_shape[2] then stands in for it with the depth
    # kernel (one window), and every reshape infers it (-1); the batch is static then
    dynamic_depth: bool = False
    # frames of zeros padded in front of the dynamic depth and behind it, explicitly: an average that counts
    # its padding divides by the whole window everywhere, as over zeros (``padding[0]`` is then 0)
    zero_frames: int = 0
    dynamic_batch: bool = False  # input_shape[0] then stands in (as 1) for a batch known only at run time

    @property
    def batched_shape(self) -> tuple[int, int, int, int, int]:
        shape = self.input_shape if len(self.input_shape) == 5 else (1, *self.input_shape)
        return shape  # type: ignore[return-value]

    def _window(self, dim: int) -> tuple[int, int, int, int, int, bool]:
        return (self.batched_shape[2 + dim], self.kernel[dim], self.stride[dim], self.padding[dim],
                self.dilation[dim], self.ceil_mode)

    def output_size(self, dim: int) -> int:
        """PyTorch's pooling output size along spatial ``dim`` (0 = D), ceil_mode included."""
        return pooled_length(*self._window(dim))

    def ceil_extra(self, dim: int) -> int:
        """Zeros to append along ``dim`` so a floor-mode pooling yields the ceil-mode windows."""
        return ceil_extra(*self._window(dim))

    def why_not(self) -> str | None:
        """Why XNNPACK could not run the 2-D stages, or None."""
        if self.dynamic_depth:
            reason = self._why_not_dynamic()
            if reason is not None:
                return reason
        if self.kind == "max":
            for dim, name in ((0, "depth"), (1, "height"), (2, "width")):
                if self.stride[dim] > self.kernel[dim] and self.ceil_extra(dim) > 0:
                    return f"{name} stride {self.stride[dim]} > kernel {self.kernel[dim]} with a ceil_mode window"
        elif self.dilation != (1, 1, 1):
            return "dilated average pooling"
        return None

    def _why_not_dynamic(self) -> str | None:
        if self.ceil_mode and self.stride[0] > 1:
            return ("ceil_mode with a dynamic depth: whether the last window of frames exists depends on the "
                    "length, and XNNPACK takes no ceil mode under dynamic shapes")
        if any(s > k for s, k in zip(self.stride, self.kernel)):
            return "a stride above the kernel with a dynamic depth (the windows kept would need a static count)"
        return None

    @property
    def in_rows(self) -> bool:
        """Whether the max pooling runs on rows (``_max_on_rows``): one clip of static shape, pooled over
        the frames and over the height (else the frames-in-the-channels form needs one stage less)."""
        return (self.kind == "max" and not self.dynamic_depth and not self.dynamic_batch
                and self.batched_shape[0] == 1 and self.dilation == (1, 1, 1)
                and not self._stage_is_identity((0,)) and not self._stage_is_identity((1,)))

    def _stage_is_identity(self, dims: tuple[int, ...]) -> bool:
        return all(self.kernel[d] == 1 and self.stride[d] == 1 and self.padding[d] == 0 for d in dims)


def global_average_of_a_clip(node: torch.fx.Node) -> tuple[int, int, int, int] | None:
    """``(N, C, H, W)`` of an adaptive average pooling to one value per channel of a clip whose frame count
    alone is dynamic (a video classifier's head), else None.

    Its window is the whole clip: the clip viewed as ``(N, C, D*H, W)``'s 4-D ``(N, C, -1, H*W)`` and a mean
    over dims 2 and 3, XNNPACK's global average pooling, which averages a plane of any size at run time.
    """
    if node.op != "call_function" or node.target not in _ADAPTIVE_AVG_POOLS:
        return None
    x = node.args[0]
    value = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dim() != 5:
        return None
    n, c, d, h, w = value.shape
    output = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
    if output is None or tuple(triple(output.kwargs["output_size"])) != (1, 1, 1) or isinstance(d, int):
        return None
    if not all(isinstance(size, int) for size in (n, c, h, w)):
        return None
    return int(n), int(c), int(h), int(w)


def pool3d(node: torch.fx.Node) -> Pool3d | str | None:
    """The pooling ``node`` does, or why it cannot be rewritten, or None when it is not a 3-D pooling."""
    if node.op != "call_function" or node.target not in _MAX_POOLS | _AVG_POOLS | _ADAPTIVE_AVG_POOLS:
        return None
    normalized = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
    if normalized is None:
        return "its arguments could not be normalized"
    kwargs = normalized.kwargs
    x = node.args[0]
    meta = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if not isinstance(meta, torch.Tensor):
        return "its input has no shape information"
    sizes = list(meta.shape)
    dynamic_depth = len(sizes) == 5 and not isinstance(sizes[2], int)
    dynamic_batch = len(sizes) == 5 and not isinstance(sizes[0], int)
    if dynamic_batch:  # a dynamic batch stays: every reshape says -1
        if dynamic_depth:
            return (f"dynamic batch and depth {tuple(meta.shape)}: the 2-D stages would need both inferred in "
                    "one reshape, and XNNPACK infers one dim")
        sizes[0] = 1
    if dynamic_depth:
        if node.target in _ADAPTIVE_AVG_POOLS:
            return ("an adaptive pooling over a dynamic depth to more than one value per channel (its windows "
                    "depend on the clip's length)")
        sizes[2] = triple(kwargs["kernel_size"])[0]  # one window's frames stand for the clip
    if not all(isinstance(s, int) for s in sizes):
        return (f"dynamic shape {tuple(meta.shape)}: the frame folding takes one dynamic dim, the batch or the "
                "depth, with static channels, height and width")
    shape = tuple(int(s) for s in sizes)
    if node.target in _ADAPTIVE_AVG_POOLS:
        out = triple(kwargs["output_size"])
        if any(o <= 0 or size % o for size, o in zip(shape[-3:], out)):
            return f"adaptive output size {out} does not divide the input size {shape[-3:]}"
        kernel = tuple(size // o for size, o in zip(shape[-3:], out))
        return Pool3d("avg", shape, kernel, kernel, (0, 0, 0))  # type: ignore[arg-type]
    kernel = triple(kwargs["kernel_size"])
    stride = triple(kwargs.get("stride", []), default=kernel)
    padding = triple(kwargs.get("padding", 0))
    if node.target in _MAX_POOLS:
        if node.target is _aten.max_pool3d_with_indices.default and values_only_users(node) is None:
            return "its indices are used (2-D pooling cannot give 3-D indices)"
        return Pool3d(
            "max", shape, kernel, stride, padding, triple(kwargs.get("dilation", 1)), bool(kwargs.get("ceil_mode")),
            dynamic_depth=dynamic_depth, dynamic_batch=dynamic_batch,
        )
    count_include_pad = bool(kwargs.get("count_include_pad", True))
    divisor_override = kwargs.get("divisor_override")
    zero_frames = 0
    if dynamic_depth and padding[0] and (count_include_pad or divisor_override):
        zero_frames, padding = padding[0], (0, padding[1], padding[2])
    return Pool3d(
        "avg",
        shape,
        kernel,
        stride,
        padding,
        ceil_mode=bool(kwargs.get("ceil_mode", False)),
        count_include_pad=count_include_pad,
        divisor_override=divisor_override,
        dynamic_depth=dynamic_depth,
        zero_frames=zero_frames,
    )


def _max_stage(x: torch.Tensor, pool: Pool3d, dims: tuple[int, int], out: tuple[int, int]) -> torch.Tensor:
    """Max over (kernel[dims]) windows of ``x``'s last two dims (dim -1: a window of 1).

    XNNPACK's max pooling needs stride <= kernel. A larger stride pools at the largest stride that
    divides it and fits the kernel, then keeps every (stride / that)-th window (``select_every``).
    """
    kernel = tuple(pool.kernel[d] if d >= 0 else 1 for d in dims)
    stride = tuple(pool.stride[d] if d >= 0 else 1 for d in dims)
    padding = tuple(pool.padding[d] if d >= 0 else 0 for d in dims)
    dilation = tuple(pool.dilation[d] if d >= 0 else 1 for d in dims)
    pool_stride = tuple(max(t for t in range(1, k + 1) if s % t == 0) for k, s in zip(kernel, stride))
    trivial = all(k == 1 for k in kernel) and not any(padding)
    ceil_mode = pool.ceil_mode
    if ceil_mode and pool.dynamic_depth and not trivial:
        # XNNPACK takes no ceil mode under dynamic shapes: the extra windows' -inf padding, explicitly
        extra = tuple(pool.ceil_extra(d) if d > 0 else 0 for d in dims)
        x, ceil_mode = F.pad(x, (0, extra[1], 0, extra[0]), value=float("-inf")), False
    y = x if trivial else F.max_pool2d(x, kernel, pool_stride, padding, dilation, ceil_mode=ceil_mode)
    a, b, h, w = y.shape
    step_h, step_w = stride[0] // pool_stride[0], stride[1] // pool_stride[1]
    if step_h > 1:
        y = select_every(y.reshape(a * b, h, w), 0, step_h, out[0]).reshape(a, b, out[0], w)
    if step_w > 1:
        y = select_every(y.reshape(a * b * out[0], w, 1), 0, step_w, out[1]).reshape(a, b, out[0], out[1])
    return y


def _avg_stage(x: torch.Tensor, pool: Pool3d, dims: tuple[int, int]) -> torch.Tensor:
    """Average over (kernel[dims]) windows of ``x``'s last two dims, counting only what the window sees."""
    kernel = tuple(pool.kernel[d] if d >= 0 else 1 for d in dims)
    stride = tuple(pool.stride[d] if d >= 0 else 1 for d in dims)
    padding = tuple(pool.padding[d] if d >= 0 else 0 for d in dims)
    extra = tuple(pool.ceil_extra(d) if d >= 0 else 0 for d in dims)
    if any(extra):
        x = F.pad(x, (0, extra[1], 0, extra[0]))
    return F.avg_pool2d(x, kernel, stride, padding, ceil_mode=False, count_include_pad=False)


def pool3d_as_2d(x: torch.Tensor, pool: Pool3d, correction: torch.Tensor | float | None = None) -> torch.Tensor:
    """``pool``'s 3-D pooling of ``x`` computed with 2-D poolings (traced by the rewrite).

    For average pooling ``correction`` is ``pool3d_correction(pool)``; None computes the uncorrected
    stages (what the correction is measured against).
    """
    if pool.dynamic_depth:
        return _dynamic_depth_as_2d(x, pool, correction)
    if pool.in_rows:
        return _max_on_rows(x, pool)
    _, c, d, h, w = pool.batched_shape  # the batch stays as the graph has it: -1 in every reshape
    do, ho, wo = (pool.output_size(dim) for dim in range(3))
    y = x.reshape(-1, c * d, h, w)
    if not pool._stage_is_identity((1, 2)):
        y = _max_stage(y, pool, (1, 2), (ho, wo)) if pool.kind == "max" else _avg_stage(y, pool, (1, 2))
    y = y.reshape(-1, c, d, ho * wo)
    if not pool._stage_is_identity((0,)):
        y = _max_stage(y, pool, (0, -1), (do, ho * wo)) if pool.kind == "max" else _avg_stage(y, pool, (0, -1))
    y = y.reshape(-1, c, do, ho, wo) if len(pool.input_shape) == 5 else y.reshape(c, do, ho, wo)
    if correction is None:
        return y
    return y * correction


def _max_on_rows(x: torch.Tensor, pool: Pool3d) -> torch.Tensor:
    """A max pooling of one clip on the rows layout of its temporal convs: over (D, W) with the rows H as the
    batch, on (H, C, D, W), then over H with the frames as the batch, on (D, C, H, W).

    The max separates in any order, so the values are the same. The point is the layout: S3D's pooling
    branch reads an inception block's input, which its 1x1x1 convs left on rows, and feeds a 1x1x1 conv
    that wants rows again. Here each stage is one 4-D permute from the last (``xnnguard.rewrite.layout``
    collapses the folds at both ends), where the frames-in-the-channels form reshaped between NCHW and
    NHWC around each stage: S3D's int8 delegate took 6 transposes per pooling branch.
    """
    _, c, d, h, w = pool.batched_shape
    do, ho, wo = (pool.output_size(dim) for dim in range(3))
    rows = x.reshape(1, c, d, h, w).permute(0, 3, 1, 2, 4).reshape(h, c, d, w)
    y = _max_stage(rows, pool, (0, 2), (do, wo))  # (H, C, Do, Wo)
    y = _max_stage(y.permute(2, 1, 0, 3), pool, (1, -1), (ho, wo))  # (Do, C, Ho, Wo)
    y = y.permute(1, 0, 2, 3)  # (C, Do, Ho, Wo)
    return y.reshape(1, c, do, ho, wo) if len(pool.input_shape) == 5 else y


def _dynamic_depth_as_2d(x: torch.Tensor, pool: Pool3d, correction: torch.Tensor | float | None) -> torch.Tensor:
    """``pool3d_as_2d`` for a dynamic depth: the frames go to the batch for the (H, W) stage, then to the
    rows of a (kd, 1) stage; every reshape infers the depth (the batch is static) and no slice cuts it."""
    n, c, _, h, w = pool.batched_shape
    ho, wo = pool.output_size(1), pool.output_size(2)
    if pool.zero_frames:
        x = F.pad(x, (0, 0, 0, 0, pool.zero_frames, pool.zero_frames))
    y = x.transpose(1, 2).reshape(-1, c, h, w)  # (N*D, C, H, W)
    if not pool._stage_is_identity((1, 2)):
        y = _max_stage(y, pool, (1, 2), (ho, wo)) if pool.kind == "max" else _avg_stage(y, pool, (1, 2))
    y = y.reshape(n, -1, c, ho * wo).transpose(1, 2)  # (N, C, D, Ho*Wo)
    if not pool._stage_is_identity((0,)):
        y = _max_stage(y, pool, (0, -1), (0, ho * wo)) if pool.kind == "max" else _avg_stage(y, pool, (0, -1))
    y = y.reshape(n, c, -1, ho, wo)
    return y if correction is None else y * correction


def pool3d_correction(pool: Pool3d) -> torch.Tensor | float | None:
    """What multiplies the average stages into PyTorch's ``avg_pool3d``: None (nothing), a number or a map."""
    if pool.kind != "avg":
        return None
    _, _, d, h, w = pool.batched_shape
    ones = torch.ones(1, 1, d, h, w, dtype=torch.float64)
    framed = F.pad(ones, (0, 0, 0, 0, pool.zero_frames, pool.zero_frames)) if pool.zero_frames else ones
    reference = F.avg_pool3d(
        framed, pool.kernel, pool.stride, pool.padding, pool.ceil_mode, pool.count_include_pad, pool.divisor_override
    )
    stages = pool3d_as_2d(ones, replace(pool, input_shape=(1, 1, d, h, w)))
    ratio = (reference / stages).reshape(reference.shape[2:])  # (Do, Ho, Wo): broadcasts, batched or not
    if pool.dynamic_depth:  # equal along the frames (why_not): one row broadcasts over any length
        ratio = ratio[:1]
    if torch.allclose(ratio, torch.ones_like(ratio), rtol=0, atol=1e-12):
        return None
    if torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio), rtol=0, atol=1e-12):
        return float(ratio.flatten()[0])
    return ratio.to(torch.float32)


class RewritePool3dPass(NodeRewritePass):
    """Replaces each 3-D max/avg pooling by 2-D poolings; what it cannot replace it tags and reports.

    Works on any ATen graph (it needs no weights); the correction map of an average pooling becomes an
    attribute of the graph module.
    """

    rule = Rule.NOT_REWRITTEN
    subject = "3-D pooling"
    pieces_stay_float = True  # the XNNPACK quantizer leaves a 3-D pooling float: so are its 2-D stages
    left_op_fails = (
        "ExecuTorch 1.5.1 has no kernel for a 3-D pooling: the program fails to load; export it with static "
        "height and width and one dynamic dim at most, the batch or the frames, and do not use the indices "
        "of a max pooling"
    )

    def picks(self, node: torch.fx.Node) -> bool:
        return pool3d(node) is not None

    def stays_float(self, node: torch.fx.Node) -> bool:
        """A max pooling's stages are quantized (as the stock quantizer shares a 2-D max pooling's input
        quantization): the max of int8 values is one of them, so int8 stages round nowhere, where the float
        original requantizes its output. An average's stages stay float: their means would round."""
        pool = pool3d(node)
        return not (isinstance(pool, Pool3d) and pool.kind == "max")

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        clip = global_average_of_a_clip(node)
        if clip is not None:
            n, c, h, w = clip

            def global_mean(x_: torch.Tensor) -> torch.Tensor:
                return dynamic_rows_mean(x_.reshape(n, c, -1, h * w), h * w, ()).reshape(n, c, 1, 1, 1)

            x = node.args[0]
            assert isinstance(x, torch.fx.Node)
            node.replace_all_uses_with(splice_before(graph_module, node, global_mean, [x]))
            return None
        pool = pool3d(node)
        reason = pool if isinstance(pool, str) else pool.why_not() if pool is not None else "not a 3-D pooling"
        if reason is not None:
            return reason
        assert isinstance(pool, Pool3d)
        self._rewrite(graph_module, node, pool)
        return None

    @staticmethod
    def _rewrite(graph_module: torch.fx.GraphModule, node: torch.fx.Node, pool: Pool3d) -> None:
        correction = pool3d_correction(pool)
        x = node.args[0]
        assert isinstance(x, torch.fx.Node)
        if isinstance(correction, torch.Tensor):
            inputs: list[torch.fx.Node | torch.Tensor] = [x, correction.to(x.meta["val"].dtype)]

            def replacement(x_: torch.Tensor, *map_: torch.Tensor) -> torch.Tensor:
                return pool3d_as_2d(x_, pool, map_[0])

        else:
            inputs = [x]

            def replacement(x_: torch.Tensor, *map_: torch.Tensor) -> torch.Tensor:
                return pool3d_as_2d(x_, pool, correction)

        output = splice_before(graph_module, node, replacement, inputs)
        if node.target is _aten.max_pool3d_with_indices.default:
            for user in list(node.users):
                user.replace_all_uses_with(output)
                graph_module.graph.erase_node(user)
        else:
            node.replace_all_uses_with(output)
        logger.debug("%s: 3-D %s pooling rewritten", node.name, pool.kind)
