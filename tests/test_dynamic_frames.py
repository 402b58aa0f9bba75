"""A dynamic frame count (issue 33): one program for every clip length, one delegate, eager's numbers.

Each model is exported with ``Dim("frames", min=4, max=32)`` on its input's depth, rewritten, lowered with
xnnguard's partitioner, loaded with the real runtime and run at the range's bounds and at an odd length
that divides no stride, against eager PyTorch at the same length.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import xnnguard
from testbed.lowered import lower, run_pte
from testbed.networks.swin3d import SwinTransformerBlock
from testbed.tolerance import float_tolerance
from tests.support import ops, rows_in_slow_tier
from xnnguard.rewrite.conv3d.dynamic_depth import frames_along_height, height_layout

FRAMES = torch.export.Dim("frames", min=4, max=32)
LENGTHS = (4, 7, 32)


class CausalConv(nn.Module):
    """A causal video VAE's conv (Wan, LTX): two frames of padding in front, none behind."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (1, 1, 1, 1, 2, 0)))


class Stem(nn.Module):
    """R3D's stem: Conv3d, BatchNorm3d, ReLU, MaxPool3d (the issue's example)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.pool = nn.Conv3d(3, 8, 3, padding=1), nn.BatchNorm3d(8), nn.MaxPool3d(3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.bn(self.conv(x))))


class ConvGroupNorm(nn.Module):
    """A video VAE's or 3-D UNet's block: Conv3d, GroupNorm (statistics over the frames), SiLU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv3d(3, 8, 3, padding=1), nn.GroupNorm(4, 8)
        nn.init.uniform_(self.norm.weight, 0.5, 1.5)
        nn.init.uniform_(self.norm.bias, -0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.norm(self.conv(x)))


class WanTimeUpsample(nn.Module):
    """Wan 2.1's ``Resample("upsample3d")``: a causal (3, 1, 1) conv to twice the channels, the halves
    ``torch.stack``-ed after the frames (``x[:, 0]``, ``x[:, 1]``: whole slices over the frames)."""

    def __init__(self) -> None:
        super().__init__()
        self.time_conv = nn.Conv3d(3, 6, (3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        x = self.time_conv(F.pad(x, (0, 0, 0, 0, 2, 0))).reshape(b, 2, c, t, h, w)
        x = torch.stack((x[:, 0, :, :, :, :], x[:, 1, :, :, :, :]), 3)
        return x.reshape(b, c, t * 2, h, w)


class ConvThenMean(nn.Module):
    """S3D's head: a 1x1x1 conv classifier, then the mean over frames, height and width."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(3, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mean(self.conv(x), dim=(2, 3, 4))


class ConvInstanceNorm(nn.Module):
    """nnU-Net's block: Conv3d, InstanceNorm3d (affine), LeakyReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv3d(3, 8, 3, padding=1), nn.InstanceNorm3d(8, affine=True)
        nn.init.uniform_(self.norm.weight, 0.5, 1.5)
        nn.init.uniform_(self.norm.bias, -0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(self.norm(self.conv(x)), 0.01)


MODELS = {
    "conv 3x3x3, padding 1": lambda: nn.Conv3d(3, 8, 3, padding=1),
    "conv 3x7x7, stride (1, 2, 2)": lambda: nn.Conv3d(3, 8, (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False),
    "conv 3x3x3, stride 2": lambda: nn.Conv3d(3, 8, 3, stride=2, padding=1),
    "conv 1x3x3 (R(2+1)D spatial)": lambda: nn.Conv3d(3, 8, (1, 3, 3), padding=(0, 1, 1)),
    "conv 1x3x3, stride (1, 2, 2), relu": lambda: nn.Sequential(
        nn.Conv3d(3, 8, (1, 3, 3), (1, 2, 2), (0, 1, 1)), nn.ReLU()
    ),
    "conv 1x2x2, stride 1 (an even kernel: frames as rows)": lambda: nn.Conv3d(3, 8, (1, 2, 2)),
    "conv 3x1x1 (R(2+1)D temporal)": lambda: nn.Conv3d(3, 8, (3, 1, 1), padding=(1, 0, 0)),
    "conv grouped, dilated in depth": lambda: nn.Conv3d(
        4, 8, (3, 1, 3), padding=(2, 0, 1), dilation=(2, 1, 1), groups=2
    ),
    "conv 2x2x2, stride 2": lambda: nn.Conv3d(3, 8, 2, stride=2),
    "causal conv": CausalConv,
    "max pool 3, stride 2, padding 1": lambda: nn.MaxPool3d(3, 2, 1),
    "max pool 1x3x3, ceil mode": lambda: nn.MaxPool3d((1, 3, 3), (1, 2, 2), ceil_mode=True),
    "avg pool 2": lambda: nn.AvgPool3d(2),
    "avg pool 3, padding 1, counting it": lambda: nn.AvgPool3d(3, 1, 1),
    "avg pool 1x3x3, ceil mode": lambda: nn.AvgPool3d((1, 3, 3), (1, 2, 2), (0, 1, 1), ceil_mode=True),
    "stem: conv, batch norm, relu, max pool": Stem,
    "transposed conv 2x (a 3-D UNet's upsampler)": lambda: nn.ConvTranspose3d(3, 6, 2, stride=2),
    "transposed conv 3, stride 2, padding 1, output padding 1": lambda: nn.ConvTranspose3d(
        3, 6, 3, stride=2, padding=1, output_padding=1
    ),
    "transposed conv (1, 2, 2), stride (1, 2, 2), relu": lambda: nn.Sequential(
        nn.ConvTranspose3d(3, 6, (1, 2, 2), stride=(1, 2, 2)), nn.ReLU()
    ),
    "transposed conv (3, 3, 4), dilated in height": lambda: nn.ConvTranspose3d(
        3, 6, (3, 3, 4), stride=(2, 1, 2), padding=1, dilation=(1, 2, 1)
    ),
    "nearest upsampling 2x (a 3-D UNet's decoder)": lambda: nn.Upsample(scale_factor=2.0, mode="nearest"),
    "nearest upsampling (1, 2, 3), exact": lambda: nn.Upsample(scale_factor=(1.0, 2.0, 3.0), mode="nearest-exact"),
    "adaptive average pooling to 1 (a classifier's head)": lambda: nn.AdaptiveAvgPool3d(1),
    "mean over frames, height and width (S3D's head)": ConvThenMean,
    "conv, prelu (MONAI's 3-D UNet)": lambda: nn.Sequential(nn.Conv3d(3, 8, 3, padding=1), nn.PReLU(8)),
    "conv, group norm, silu": ConvGroupNorm,
    "conv, instance norm, leaky relu": ConvInstanceNorm,
    "Wan's temporal upsampling: halves stacked after the frames": WanTimeUpsample,
}


# the default tier runs one of each family (a group norm for the norms, the overlapping transposed conv for
# the transposed convs, the mean for the heads); the rest of the forms run in the slow tier
QUICK = (
    "conv 3x3x3, stride 2",
    "conv 1x3x3, stride (1, 2, 2), relu",
    "causal conv",
    "avg pool 3, padding 1, counting it",
    "stem: conv, batch norm, relu, max pool",
    "conv, group norm, silu",
    "transposed conv 3, stride 2, padding 1, output padding 1",
    "nearest upsampling 2x (a 3-D UNet's decoder)",
    "mean over frames, height and width (S3D's head)",
    "Wan's temporal upsampling: halves stacked after the frames",
)


@pytest.mark.parametrize("name", rows_in_slow_tier(MODELS, lambda name: name not in QUICK))
def test_a_video_op_with_dynamic_frames_runs_in_one_delegate_at_every_length(name: str) -> None:
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    channels = 4 if "grouped" in name else 3
    example = torch.randn(1, channels, 8, 12, 10)
    exported = torch.export.export(model, (example,), dynamic_shapes=({2: FRAMES},))
    rewriter = xnnguard.XnnpackRewriter()
    lowered = lower(rewriter(exported), (example,), xnnguard.XnnpackPartitioner())
    assert not rewriter.report, [str(record) for record in rewriter.report]
    assert lowered.num_delegates == 1 and not lowered.outside_ops(), lowered.outside_ops()
    for frames in LENGTHS:
        x = torch.randn(1, channels, frames, 12, 10)
        with torch.no_grad():
            expected = model(x)
        (out,) = run_pte(lowered.buffer, (x,))
        torch.testing.assert_close(out, expected, atol=float_tolerance(expected), rtol=0, msg=f"{frames} frames")


def test_whole_slices_over_frames_exported_as_dim_dynamic_are_in_the_delegate() -> None:
    """``Dim.DYNAMIC`` traces the frames without an upper bound, so ``x[:, 0, :, :, :, :]`` keeps a
    ``slice(x, 2, 0, INT64_MAX)`` over them (a named ``Dim`` has it elided), which ExecuTorch's slice config
    refuses: Wan's decoder exported as the benchmark does was 3 delegates, these slices between them."""
    torch.manual_seed(0)
    model = WanTimeUpsample().eval()
    example = torch.randn(1, 3, 8, 12, 10)
    frames = torch.export.Dim.DYNAMIC(min=FRAMES.min, max=FRAMES.max)  # type: ignore[attr-defined]
    exported = torch.export.export(model, (example,), dynamic_shapes=({2: frames},))
    assert any(node.target == torch.ops.aten.slice.Tensor for node in exported.graph.nodes)  # what is tested
    lowered = lower(xnnguard.rewrite_for_xnnpack(exported), (example,), xnnguard.XnnpackPartitioner())
    assert lowered.num_delegates == 1 and not lowered.outside_ops(), lowered.outside_ops()
    for length in LENGTHS:
        x = torch.randn(1, 3, length, 12, 10)
        with torch.no_grad():
            expected = model(x)
        (out,) = run_pte(lowered.buffer, (x,))
        torch.testing.assert_close(out, expected, atol=float_tolerance(expected), rtol=0, msg=f"{length} frames")


def test_a_conv_with_dynamic_batch_and_frames_is_left_and_says_why() -> None:
    """Both in one XNNPACK reshape cannot be inferred: the conv stays as it was, with that reason."""
    model = nn.Conv3d(3, 8, 3, padding=1).eval()
    batch = torch.export.Dim("batch", min=1, max=4)
    exported = torch.export.export(model, (torch.randn(2, 3, 8, 6, 6),), dynamic_shapes=({0: batch, 2: FRAMES},))
    rewriter = xnnguard.XnnpackRewriter()
    rewriter(exported)
    assert any("dynamic batch and depth" in str(record) for record in rewriter.report), rewriter.report


class UNetBlock(nn.Module):
    """A 3-D UNet's decoder step: ConvTranspose3d 2x, Conv3d, InstanceNorm3d, LeakyReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose3d(3, 6, 2, stride=2)
        self.block = ConvInstanceNorm()
        self.block.conv = nn.Conv3d(6, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.up(x))


class SeparableBlock(nn.Module):
    """R(2+1)D's (2+1)-D conv: a (1, 3, 3) conv (frames along height), batch norm, ReLU, a (3, 1, 1) conv."""

    def __init__(self) -> None:
        super().__init__()
        self.spatial, self.bn = nn.Conv3d(3, 6, (1, 3, 3), padding=(0, 1, 1)), nn.BatchNorm3d(6)
        self.temporal = nn.Conv3d(6, 8, (3, 1, 1), padding=(1, 0, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.temporal(torch.relu(self.bn(self.spatial(x))))


INT8_MODELS = {"stem": Stem, "unet block": UNetBlock, "separable block": SeparableBlock}


# The default tier: the UNet block in static int8 and the separable block in dynamic int8 (the other two
# rows of those blocks and the stem are in the slow tier).
INT8_DEFAULT_TIER = {("unet block", False), ("separable block", True)}


@pytest.mark.parametrize(("name", "dynamic"), [
    pytest.param(name, dynamic, id=f"{name}-{'dynamic' if dynamic else 'static'} int8",
                 marks=() if (name, dynamic) in INT8_DEFAULT_TIER else pytest.mark.slow)
    for name in ("stem", "unet block", "separable block") for dynamic in (False, True)
])
def test_an_int8_video_program_with_dynamic_frames_is_one_delegate_as_close_to_float_as_pt2e(
    name: str, dynamic: bool
) -> None:
    """Quantized after the rewrite, re-exported with the frames as ``Dim.DYNAMIC`` over the same range (a
    named ``Dim`` makes export try to prove guards of the fake convolutions it cannot), lowered once."""
    from testbed.quantize import quantize_pt2e, xnnguard_quantizer
    from testbed.rounding_floor import one_step_errors
    from testbed.tolerance import dynamic_step, int8_tolerance

    torch.manual_seed(0)
    model = INT8_MODELS[name]().eval()
    example = torch.randn(1, 3, 8, 12, 10)
    exported = torch.export.export(model, (example,), dynamic_shapes=({2: FRAMES},))
    converted = quantize_pt2e(xnnguard.rewrite_for_xnnpack(exported), (example,), xnnguard_quantizer(dynamic=dynamic))
    frames = torch.export.Dim.DYNAMIC(min=FRAMES.min, max=FRAMES.max)  # type: ignore[attr-defined]
    program = torch.export.export(converted, (example,), dynamic_shapes=({2: frames},))
    lowered = lower(program, (example,), xnnguard.XnnpackPartitioner())
    assert lowered.num_delegates == 1 and not lowered.outside_ops(), lowered.outside_ops()
    for length in LENGTHS:
        x = torch.randn(1, 3, length, 12, 10)
        with torch.no_grad():
            reference, expected = converted(x), model(x)
        (out,) = run_pte(lowered.buffer, (x,))
        tolerance = int8_tolerance(converted, reference, dynamic=dynamic, float_reference=expected,
                                   activation_step=dynamic_step(converted, [(x,)]) if dynamic else 0.0,
                                   one_step=0.0 if dynamic else one_step_errors(converted, (x,))[0])
        torch.testing.assert_close(out, reference, atol=tolerance, rtol=0, msg=f"{length} frames")


class PooledToOneFrame(nn.Module):
    """R(2+1)D's head at the test size: a temporal stride that leaves one frame at every length of the
    range, a global pooling and a flatten: the flatten's sizes are symbols that are constant."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(3, 8, (3, 1, 1), stride=(4, 1, 1), padding=(1, 0, 0))
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.adaptive_avg_pool3d(torch.relu(self.conv(x)), 1).flatten(1))


def test_a_view_that_is_static_over_the_whole_range_of_frames_is_in_the_delegate() -> None:
    """ExecuTorch refused to serialize the flatten left outside ('_ViewSpec is incompatible with its base')."""
    model = PooledToOneFrame().eval()
    frames = torch.export.Dim("frames", min=2, max=4)
    example = torch.randn(1, 3, 4, 6, 6)
    exported = torch.export.export(model, (example,), dynamic_shapes=({2: frames},))
    lowered = lower(xnnguard.rewrite_for_xnnpack(exported), (example,), xnnguard.XnnpackPartitioner())
    assert lowered.num_delegates == 1 and not lowered.outside_ops(), lowered.outside_ops()
    for length in (2, 3, 4):
        x = torch.randn(1, 3, length, 6, 6)
        with torch.no_grad():
            expected = model(x)
        (out,) = run_pte(lowered.buffer, (x,))
        torch.testing.assert_close(out, expected, atol=float_tolerance(expected), rtol=0, msg=f"{length} frames")


def test_a_conv_that_sees_one_frame_at_the_example_length_is_left_and_says_why() -> None:
    """S3D at its test size: after two temporal strides its last blocks see one frame of the 8-frame example.
    Traced there, the frames-as-rows form baked that 1 in, and the program failed at 16 frames."""
    model = nn.Sequential(nn.MaxPool3d((2, 1, 1), (2, 1, 1)), nn.Conv3d(4, 4, (1, 3, 3), padding=(0, 1, 1))).eval()
    example = torch.randn(1, 4, 2, 1, 1)
    exported = torch.export.export(model, (example,), dynamic_shapes=({2: torch.export.Dim.DYNAMIC(min=2, max=8)},))
    rewriter = xnnguard.XnnpackRewriter()
    rewriter(exported)
    assert any("frame count is 1 at the example length" in str(record) for record in rewriter.report), rewriter.report


class SwinBlock(nn.Module):
    """Swin3D's patch embedding and one block at 28 x 28: 7 x 7 tokens, so the (8, 7, 7) window shrinks to
    the input and does not shift; over 4 to 16 frames it is (frames // 2) x 7 x 7 tokens, a dynamic window."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv3d(3, 8, (2, 4, 4), stride=(2, 4, 4))
        self.block = SwinTransformerBlock(8, 2, [8, 7, 7], [4, 3, 3])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.embed(x).permute(0, 2, 3, 4, 1))


def test_window_attention_over_a_dynamic_frame_count_loads_and_runs_at_every_length() -> None:
    """The relative position bias, gathered flat and viewed back to (n, n, heads), had a size ExecuTorch bounds
    at four times its largest value: the .pte failed to load (0x21, a planned view past its arena)."""
    torch.manual_seed(0)
    model = SwinBlock().eval()
    example = torch.randn(1, 3, 8, 28, 28)
    frames = torch.export.Dim.DYNAMIC(min=4, max=16)  # a named Dim: export says the window's guards need even frames
    exported = torch.export.export(model, (example,), dynamic_shapes=({2: frames},))
    lowered = lower(xnnguard.rewrite_for_xnnpack(exported), (example,), xnnguard.XnnpackPartitioner())
    for length in (4, 7, 16):
        x = torch.randn(1, 3, length, 28, 28)
        with torch.no_grad():
            expected = model(x)
        (out,) = run_pte(lowered.buffer, (x,))
        torch.testing.assert_close(out, expected, atol=float_tolerance(expected), rtol=0, msg=f"{length} frames")


class SquareOfFrames(nn.Module):
    """Rows that are the square of the frame count (``reshape(t ** 2, 1)``), each scaled by every frame."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x[0, 0]
        squares = (frames[:, None] * frames[None, :]).reshape(frames.shape[0] ** 2, 1)
        return torch.relu((squares * frames[None, :]).unsqueeze(0))


def test_a_size_the_rewrite_writes_as_a_square_of_the_frames_lowers() -> None:
    """Exported again, the rewritten program spelled the size ``t ** 2`` as an ``operator.pow`` node, which
    ExecuTorch's edge verifier refuses ('invalid target for call_function <built-in function pow>')."""
    model = SquareOfFrames().eval()
    example = torch.randn(1, 3, 5)
    exported = torch.export.export(model, (example,), dynamic_shapes=({2: torch.export.Dim("t", min=2, max=8)},))
    lowered = lower(xnnguard.rewrite_for_xnnpack(exported), (example,), xnnguard.XnnpackPartitioner())
    for length in (2, 5, 8):
        x = torch.randn(1, 3, length)
        (out,) = run_pte(lowered.buffer, (x,))
        torch.testing.assert_close(out, model(x), atol=0, rtol=0, msg=f"{length} frames")


@pytest.mark.parametrize("conv", [
    nn.Conv3d(3, 8, (1, 3, 3), padding=(0, 1, 1)),
    nn.Conv3d(3, 8, (1, 7, 7), (1, 2, 2), (0, 3, 3)),
    nn.Conv3d(3, 8, (1, 3, 3), (1, 2, 2)),
], ids=["1x3x3, padding 1", "1x7x7, stride 2, padding 3", "1x3x3, stride 2, no padding"])
def test_a_depth_one_kernel_over_dynamic_frames_is_one_conv2d_over_every_frames_rows(conv: nn.Conv3d) -> None:
    """R(2+1)D's spatial convs: no copy per tap (frames as rows made ``kw`` of them), and a static batch."""
    example = torch.randn(1, 3, 8, 12, 10)
    exported = torch.export.export(conv.eval(), (example,), dynamic_shapes=({2: FRAMES},))
    rewritten = xnnguard.rewrite_for_xnnpack(exported)
    convs = [node for node in rewritten.graph.nodes if node.target is torch.ops.aten.conv2d.default]
    assert len(convs) == 1 and "cat" not in ops(rewritten), ops(rewritten)
    assert isinstance(convs[0].args[0].meta["val"].shape[0], int)  # the frames are rows, not the batch
    for frames in (4, 7):
        x = torch.randn(1, 3, frames, 12, 10)
        with torch.no_grad():
            torch.testing.assert_close(rewritten.module()(x), conv(x), atol=1e-5, rtol=1e-5)


def test_a_temporal_kernel_over_dynamic_frames_is_views_around_one_conv2d() -> None:
    """R(2+1)D's temporal convs over several clips: (N, C, D, H*W) as it lies in memory, frames inferred."""
    conv = nn.Conv3d(3, 8, (3, 1, 1), padding=(1, 0, 0)).eval()
    exported = torch.export.export(conv, (torch.randn(2, 3, 8, 6, 5),), dynamic_shapes=({2: FRAMES},))
    rewritten = xnnguard.rewrite_for_xnnpack(exported)
    assert {"cat", "permute", "slice"}.isdisjoint(ops(rewritten)), ops(rewritten)
    x = torch.randn(2, 3, 7, 6, 5)
    with torch.no_grad():
        torch.testing.assert_close(rewritten.module()(x), conv(x), atol=1e-5, rtol=1e-5)


def test_frames_along_height_is_the_per_frame_convolution_for_every_geometry_it_takes() -> None:
    """Heights, kernels, strides, dilations and paddings (top and bottom apart) over four frames, in eager."""
    torch.manual_seed(0)
    taken = 0
    for h, k, s, d, top, bottom in itertools.product((5, 6, 7), (1, 2, 3, 4, 7), (1, 2, 3), (1, 2), (0, 1, 3), (0, 2)):
        layout = height_layout(h, k, s, d, top, bottom)
        if d * (k - 1) + 1 > h + top + bottom or layout is None:
            continue
        x, weight, bias = torch.randn(2, 3, 4, h, 6), torch.randn(5, 3, k, 3), torch.randn(5)
        expected = F.conv3d(F.pad(x, (1, 1, top, bottom)), weight[:, :, None], bias, (1, s, 1), 0, (1, d, 1))
        got = frames_along_height(x, weight, bias, layout, (s, 1), (1, 1), (d, 1), 1)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, msg=str((h, k, s, d, top, bottom)))
        taken += 1
    assert taken > 300
