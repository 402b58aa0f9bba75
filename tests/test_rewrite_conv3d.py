"""Conv3d -> Conv2d: same numbers as eager, no 3-D conv left, fully delegated to XNNPACK, and it runs."""

from __future__ import annotations

import pytest
import torch
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config
from executorch.exir import to_edge_transform_and_lower
from hypothesis import given, settings, strategies as st
from torch.fx.passes.infra.pass_base import PassBase, PassResult
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

import xnnguard
from testbed.flow import lower_and_run, rewritten
from testbed.lowered import Lowered, lower, run_pte
from testbed.quantize import PRECISIONS, xnnpack_quantizer
from testbed.tolerance import int8_tolerance
from tests.support import assert_within_rank_limit, dynamic_int8_in_slow_tier, ops, rows_in_slow_tier
from xnnguard.graph.ops import is_op
from xnnguard.passes import DO_NOT_DELEGATE
from xnnguard.report import Rule
from xnnguard.rewrite.conv3d.conv3d import Conv3dGeometry, RewriteConv3dPass, conv2d_constants, conv3d_as_conv2d
from xnnguard.rewrite.rewrite_for_xnnpack import RewriteError, XnnpackRewriter, rewrite_for_xnnpack


@st.composite
def conv3d_cases(draw: st.DrawFn) -> tuple[torch.nn.Conv3d, torch.Tensor]:
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    kernel = tuple(draw(st.integers(1, 4)) for _ in range(3))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(3))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(3))
    padding = tuple(draw(st.integers(0, 2)) for _ in range(3))
    minimum = [max(1, dilation[i] * (kernel[i] - 1) + 1 - 2 * padding[i]) for i in range(3)]
    size = tuple(draw(st.integers(minimum[i], minimum[i] + 6)) for i in range(3))
    conv = torch.nn.Conv3d(
        groups * draw(st.integers(1, 3)),
        groups * draw(st.integers(1, 3)),
        kernel,  # type: ignore[arg-type]
        stride,  # type: ignore[arg-type]
        padding,  # type: ignore[arg-type]
        dilation,  # type: ignore[arg-type]
        groups,
        bias=draw(st.booleans()),
    )
    torch.manual_seed(draw(st.integers(0, 2**16)))
    return conv.eval(), torch.randn(draw(st.integers(1, 2)), conv.in_channels, *size)


@st.composite
def temporal_conv_cases(draw: st.DrawFn) -> tuple[torch.nn.Conv3d, torch.Tensor]:
    """(k, 1, 1) kernels, as in R(2+1)D's and S3D's separable convs, and 1x1x1 ones: any depth geometry."""
    groups = draw(st.sampled_from([1, 2]))
    kd, sd, dd, pd = (draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 2)),
                      draw(st.integers(0, 2)))
    depth = draw(st.integers(max(1, dd * (kd - 1) + 1 - 2 * pd), 8))
    conv = torch.nn.Conv3d(groups * draw(st.integers(1, 3)), groups * draw(st.integers(1, 3)), (kd, 1, 1),
                           (sd, 1, 1), (pd, 0, 0), (dd, draw(st.integers(1, 2)), 1), groups, bias=draw(st.booleans()))
    torch.manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(draw(st.integers(1, 2)), conv.in_channels, depth, draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    return conv.eval(), x


def _geometry(conv: torch.nn.Conv3d, x: torch.Tensor) -> Conv3dGeometry:
    padding = tuple((p, p) for p in conv.padding)  # type: ignore[union-attr]
    return Conv3dGeometry(
        tuple(x.shape), tuple(conv.weight.shape), conv.stride, padding, conv.dilation, conv.groups,  # type: ignore[arg-type]
        conv.bias is not None,
    )


@settings(derandomize=True, max_examples=40, deadline=None)
@given(conv3d_cases(), st.sampled_from(["fold", "sum"]))
def test_conv2d_form_equals_conv3d_for_any_parameters(
    case: tuple[torch.nn.Conv3d, torch.Tensor], depth_taps: str
) -> None:
    conv, x = case
    geometry = _geometry(conv, x)
    constants = conv2d_constants(conv.weight.detach(), None if conv.bias is None else conv.bias.detach(), geometry,
                                 depth_taps)  # type: ignore[arg-type]
    with torch.no_grad():
        torch.testing.assert_close(conv3d_as_conv2d(x, constants, geometry, depth_taps), conv(x),  # type: ignore[arg-type]
                                   atol=1e-4, rtol=1e-4)


@settings(derandomize=True, max_examples=25, deadline=None)
@given(temporal_conv_cases())
def test_a_temporal_conv_is_one_conv2d_over_frames_and_pixels_or_over_frames_and_columns_of_each_row(
    case: tuple[torch.nn.Conv3d, torch.Tensor],
) -> None:
    """Several clips: over (D, H*W) without any permute. One clip: over (D, W) with the rows as its batch,
    one 4-D permute away from the frames-in-the-batch layout of the spatial convs around it."""
    conv, x = case
    geometry = _geometry(conv, x)
    if geometry.form == "one patch":  # a 1x1x1 input: a linear is cheaper still
        return
    assert geometry.form == "temporal"
    ep = rewritten(conv, x)
    convs = [n for n in ep.graph.nodes if n.target is torch.ops.aten.conv2d.default]
    assert "conv3d" not in ops(ep) and len(convs) == 1
    (planes,) = convs[0].all_input_nodes[:1]
    if x.shape[0] == 1:
        assert list(planes.meta["val"].shape[:2]) == [x.shape[3], conv.in_channels]  # (H, C, D, W)
    else:
        assert {"permute", "permute_copy"}.isdisjoint(ops(ep))
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), conv(x), atol=1e-4, rtol=1e-4)


def test_a_temporal_conv_with_uneven_same_padding_pads_the_frames_explicitly() -> None:
    conv = torch.nn.Conv3d(2, 3, (2, 1, 1), padding="same").eval()  # 1 zero frame at the back only
    x = torch.randn(1, 2, 5, 3, 4)
    ep = rewritten(conv, x)
    assert "conv3d" not in ops(ep)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), conv(x), atol=1e-5, rtol=1e-5)


@settings(derandomize=True, max_examples=12, deadline=None)
@given(conv3d_cases())
def test_rewritten_program_has_no_3d_conv_and_equals_eager(case: tuple[torch.nn.Conv3d, torch.Tensor]) -> None:
    conv, x = case
    ep = rewritten(conv, x)
    assert "conv3d" not in ops(ep) and "convolution" not in ops(ep)
    assert_within_rank_limit(ep)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), conv(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "conv, shape",
    [
        (torch.nn.Conv3d(3, 8, (2, 4, 4), stride=(2, 4, 4), bias=False), (4, 3, 2, 4, 4)),  # one patch -> linear
        (torch.nn.Conv3d(4, 6, (1, 3, 3), padding=(0, 1, 1)), (1, 4, 5, 7, 6)),  # depth tiles (frames)
        (torch.nn.Conv3d(4, 6, (3, 1, 1), stride=(2, 1, 1), padding=(1, 0, 0), groups=2), (2, 4, 7, 5, 6)),
        (torch.nn.Conv3d(6, 4, 3, stride=(2, 1, 2), padding=(2, 1, 0), dilation=(2, 1, 1), groups=2), (2, 6, 7, 6, 9)),
    ],
    ids=["one-patch", "depth-tiles", "temporal", "general"],
)
def test_each_form_lowers_fully_to_xnnpack_and_runs(conv: torch.nn.Conv3d, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape)
    lowered, out, reference, tolerance = lower_and_run(conv, x, "float")
    assert lowered.outside_ops() == {}
    assert lowered.delegated_ops()["linear"] + lowered.delegated_ops()["convolution"] >= 1
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


def test_same_padding_string_is_mapped_to_zero_padding() -> None:
    conv = torch.nn.Conv3d(2, 3, (2, 3, 4), padding="same", dilation=(1, 2, 1)).eval()
    x = torch.randn(1, 2, 5, 6, 7)
    ep = rewritten(conv, x)
    assert "conv3d" not in ops(ep)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), conv(x), atol=1e-5, rtol=1e-5)


def test_a_reflect_padded_conv_keeps_its_pad_as_an_op_and_the_conv_is_rewritten() -> None:
    """Export spells ``padding_mode="reflect"`` as a pad op then a conv without padding: only the pad stays out."""
    conv = torch.nn.Conv3d(2, 4, 3, padding=1, padding_mode="reflect").eval()
    x = torch.randn(1, 2, 4, 6, 6)
    lowered, out, reference, tolerance = lower_and_run(conv, x, "float")
    assert lowered.delegated_ops()["convolution"] == 1  # the padded input has no border: one run
    assert "convolution" not in lowered.outside_ops()
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


class R3dBlock(torch.nn.Module):
    """A ResNet-3D stage entry: Conv3d stride 2 + BatchNorm3d + ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(8, 16, 3, stride=2, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm3d(16)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class Qwen2VLPatchEmbed(torch.nn.Module):
    """Qwen2-VL's vision patch embedding: flattened patches -> Conv3d(3, C, (2, 14, 14), stride=kernel)."""

    def __init__(self, embed_dim: int = 64) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.proj = torch.nn.Conv3d(3, embed_dim, (2, 14, 14), stride=(2, 14, 14), bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = hidden_states.view(-1, 3, 2, 14, 14)
        return self.proj(hidden_states).view(-1, self.embed_dim)


@pytest.mark.parametrize("precision", dynamic_int8_in_slow_tier(PRECISIONS))
def test_r3d_block_runs_fully_delegated(precision: str) -> None:
    torch.manual_seed(0)
    lowered, out, reference, tolerance = lower_and_run(R3dBlock().eval(), torch.randn(1, 8, 8, 16, 16), precision)  # type: ignore[arg-type]
    assert lowered.outside_ops() == {}
    assert lowered.delegated_ops()["convolution"] == 1  # the depth padding as zero frames: one conv2d, all taps
    assert "native_batch_norm" not in str(lowered.delegated_ops())  # folded into the conv
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


@pytest.mark.parametrize("precision", dynamic_int8_in_slow_tier(PRECISIONS))
def test_qwen2_vl_patch_embedding_runs_as_one_delegated_linear(precision: str) -> None:
    torch.manual_seed(0)
    lowered, out, reference, tolerance = lower_and_run(
        Qwen2VLPatchEmbed().eval(), torch.randn(32, 3 * 2 * 14 * 14), precision  # type: ignore[arg-type]
    )
    assert lowered.outside_ops() == {}
    assert lowered.delegated_ops()["linear"] == 1 and lowered.delegated_ops()["convolution"] == 0
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


class R3dShortcut(torch.nn.Module):
    """A conv block followed by ResNet-3D's downsampling shortcut, a 1x1x1 conv of stride 2."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(4, 8, 3, padding=1)
        self.shortcut = torch.nn.Conv3d(8, 16, 1, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shortcut(torch.relu(self.conv(x)))


@pytest.mark.parametrize("precision", dynamic_int8_in_slow_tier(PRECISIONS))
def test_a_strided_pointwise_conv_after_a_quantized_op_stays_in_one_delegate(precision: str) -> None:
    """Its conv input is one frame of a strided select: under static int8 the pieces must keep their
    input's qparams, or XNNPACK leaves them out and the delegate splits."""
    torch.manual_seed(0)
    lowered, out, reference, tolerance = lower_and_run(R3dShortcut().eval(), torch.randn(1, 4, 4, 8, 8), precision)  # type: ignore[arg-type]
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


def test_a_frame_wise_conv_runs_dynamically_quantized() -> None:
    """Kernel depth 1 (R(2+1)D's spatial conv): the conv input must come from a cat for 1.5.1's NHWC pass."""
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(8, 16, (1, 3, 3), padding=(0, 1, 1)).eval()
    lowered, out, reference, tolerance = lower_and_run(conv, torch.randn(1, 8, 4, 12, 12), "dynamic int8")
    assert lowered.outside_ops() == {}
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


def test_without_the_rewrite_stock_1_5_1_cannot_run_the_r3d_block() -> None:
    """The e2e tests above fail without the rewrite: XNNPACK has no 3-D conv and portable conv no 3-D."""
    x = torch.randn(1, 8, 8, 16, 16)
    ep = torch.export.export(R3dBlock().eval(), (x,))
    with pytest.raises(Exception):
        program = to_edge_transform_and_lower(ep, partitioner=[xnnguard.XnnpackPartitioner()]).to_executorch()
        run_pte(program.buffer, (x,))


def test_a_conv_with_a_dynamic_height_is_left_tagged_and_reported() -> None:
    conv = torch.nn.Conv3d(3, 4, 3).eval()
    x = torch.randn(1, 3, 8, 8, 8)
    ep = torch.export.export(conv, (x,), dynamic_shapes=({3: torch.export.Dim("height", min=4, max=64)},))
    rewriter = XnnpackRewriter(strict=True)
    result = rewriter(ep)
    (record,) = rewriter.report
    assert record.rule is Rule.CONV3D and "dynamic shape" in record.reason
    (conv_node,) = [n for n in result.graph.nodes if n.name == record.node]
    assert conv_node.meta[DO_NOT_DELEGATE] == record.reason
    taller = torch.randn(1, 3, 8, 11, 8)
    with torch.no_grad():
        torch.testing.assert_close(result.module()(taller), conv(taller))


PATCHES = ({0: torch.export.Dim("patches", min=2, max=1024)},)


# static int8 slow (11 s): the dynamic-int8 row quantizes the same linear; static int8 patch embeddings run in
# test_rewrites_in_int8
@pytest.mark.parametrize("precision", rows_in_slow_tier(PRECISIONS, ["static int8"]))
def test_a_patch_embedding_with_a_dynamic_number_of_patches_runs_as_one_delegated_linear(precision: str) -> None:
    """Qwen2-VL exported the way it is used: the number of patches depends on the image."""
    torch.manual_seed(0)
    model, x = Qwen2VLPatchEmbed().eval(), torch.randn(32, 3 * 2 * 14 * 14)
    ep = rewrite_for_xnnpack(torch.export.export(model, (x,), dynamic_shapes=PATCHES), strict=True)
    reference: torch.nn.Module = model
    if precision != "float":
        quantizer = xnnpack_quantizer(per_channel=True, dynamic=precision == "dynamic int8")
        prepared = prepare_pt2e(ep.module(), quantizer)  # type: ignore[arg-type]
        prepared(x)
        reference = convert_pt2e(prepared)
        ep = torch.export.export(reference, (x,), dynamic_shapes=PATCHES)
    program = to_edge_transform_and_lower(ep, partitioner=[xnnguard.XnnpackPartitioner()]).to_executorch()
    assert "aten::convolution.out" not in str(program.exported_program().graph_module.code)
    for patches in (32, 7):
        x = torch.randn(patches, 3 * 2 * 14 * 14)
        expected = reference(x)
        tolerance = 1e-4 if precision == "float" else 2 * float((expected - model(x)).abs().max())
        torch.testing.assert_close(run_pte(program.buffer, (x,))[0], expected, atol=tolerance, rtol=0)


class VideoBlocks(torch.nn.Module):
    """Every 3-D form at once: a padded Conv3d, a max pooling, a depth-tiles Conv3d, an overlapping
    ConvTranspose3d and an average pooling with ceil_mode."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(3, 8, 3, padding=1)
        self.pool = torch.nn.MaxPool3d((1, 2, 2))
        self.tiles = torch.nn.Conv3d(8, 8, (2, 3, 3), stride=(2, 1, 1), padding=(0, 1, 1))
        self.up = torch.nn.ConvTranspose3d(8, 4, 3, stride=2, padding=1, output_padding=1)
        self.average = torch.nn.AvgPool3d(2, ceil_mode=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tiles(self.pool(torch.relu(self.conv(x))))
        return self.average(self.up(torch.relu(y)))


def test_a_video_model_exported_with_a_dynamic_batch_is_rewritten_and_runs_at_another_batch() -> None:
    model, x = VideoBlocks().eval(), torch.randn(2, 3, 4, 8, 8)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch", max=16)},))
    rewriter = XnnpackRewriter(strict=True)
    rewritten = rewriter(ep)
    assert rewriter.report == [] and {"conv3d", "max_pool3d", "conv_transpose3d", "avg_pool3d"}.isdisjoint(
        ops(rewritten)
    )
    program = to_edge_transform_and_lower(rewritten, partitioner=[xnnguard.XnnpackPartitioner()]).to_executorch()
    for batch in (1, 3):  # ExecuTorch plans this model's memory for at most 3 (the original program too)
        other = torch.randn(batch, 3, 4, 8, 8)
        torch.testing.assert_close(run_pte(program.buffer, (other,))[0], model(other), atol=1e-5, rtol=1e-5)


def test_a_conv_with_a_dynamic_width_is_left_reported_and_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    conv = torch.nn.Conv3d(3, 4, 3, padding=1).eval()
    width = torch.export.Dim("width", min=2, max=64)
    ep = torch.export.export(conv, (torch.randn(1, 3, 4, 6, 6),), dynamic_shapes=({4: width},))
    rewriter = XnnpackRewriter(strict=True)
    with caplog.at_level("WARNING", logger="xnnguard"):
        rewriter(ep)
    (record,) = rewriter.report
    assert record.rule is Rule.CONV3D and "static channels, height and width" in record.reason
    assert any("fails when it runs" in message for message in caplog.messages)


def test_pass_leaves_a_graph_without_3d_convs_unchanged() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    gm = torch.export.export(model, (torch.randn(1, 3, 8, 8),)).module()
    before = [n.target for n in gm.graph.nodes]
    result = RewriteConv3dPass()(gm)
    assert not result.modified and result.report == ()
    assert [n.target for n in result.graph_module.graph.nodes] == before


def test_rewriting_twice_changes_nothing_the_second_time() -> None:
    conv = torch.nn.Conv3d(2, 3, 3, padding=1).eval()
    x = torch.randn(1, 2, 4, 5, 5)
    once = rewritten(conv, x)
    rewriter = XnnpackRewriter(strict=True)
    twice = rewriter(once)
    assert twice.graph_module.code == once.graph_module.code and rewriter.report == []


def test_a_program_nothing_rewrites_comes_back_as_a_new_program() -> None:
    ep = torch.export.export(torch.nn.Linear(4, 2).eval(), (torch.randn(3, 4),))
    result = rewrite_for_xnnpack(ep, strict=True)
    assert result is not ep and result.graph_module is not ep.graph_module
    assert result.graph_module.code == ep.graph_module.code


def test_a_core_aten_program_without_example_inputs_is_rewritten_too() -> None:
    """After ``run_decompositions()`` a 3-D conv is ``aten.convolution``; a loaded program may keep no inputs."""
    block = R3dBlock().eval()
    x = torch.randn(1, 8, 6, 8, 8)
    ep = torch.export.export(block, (x,)).run_decompositions()
    ep.example_inputs = None  # type: ignore[assignment]
    result = rewrite_for_xnnpack(ep, strict=True)
    assert "convolution" not in ops(result) and "_native_batch_norm_legit_no_training" not in ops(result)
    with torch.no_grad():
        torch.testing.assert_close(result.module()(x), block(x), atol=1e-5, rtol=1e-5)


def test_a_failing_pass_is_named_in_a_clear_error() -> None:
    class Broken(PassBase):
        def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
            raise ValueError("cannot do this")

    ep = torch.export.export(torch.nn.Conv3d(1, 1, 1).eval(), (torch.randn(1, 1, 2, 2, 2),))
    with pytest.raises(RewriteError, match=r"Broken failed \(after RewriteConv3dPass\): cannot do this"):
        XnnpackRewriter([RewriteConv3dPass(), Broken()], strict=True)(ep)


@pytest.mark.parametrize("precision", dynamic_int8_in_slow_tier(PRECISIONS))
def test_a_weight_normalized_conv3d_is_rewritten_with_its_computed_weight(precision: str) -> None:
    """Video VAEs wrap their convs in weight norm: the weight is ``_weight_norm`` of two parameters."""
    torch.manual_seed(0)
    conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv3d(4, 8, 3, padding=1))
    lowered, out, reference, tolerance = lower_and_run(conv.eval(), torch.randn(1, 4, 3, 6, 6), precision)  # type: ignore[arg-type]
    assert lowered.outside_ops() == {}
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


class NoisyWeightConv3d(torch.nn.Module):
    """A weight computed anew on every call (here: from noise) is not a constant, however it is built."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 2, 3, 3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv3d(x, self.weight + torch.randn(4, 2, 3, 3, 3))


def test_a_conv3d_whose_weight_is_random_on_every_call_is_left_and_reported() -> None:
    ep = torch.export.export(NoisyWeightConv3d(), (torch.randn(1, 2, 4, 6, 6),))
    rewriter = XnnpackRewriter(strict=True)
    rewriter(ep)
    (record,) = rewriter.report
    assert record.reason == "3-D convolution not rewritten: its weight is not computed from parameters alone"


def test_rewrite_for_xnnpack_names_what_it_takes_when_given_a_module() -> None:
    with pytest.raises(TypeError, match=r"takes a torch\.export\.ExportedProgram, not Conv3d"):
        rewrite_for_xnnpack(torch.nn.Conv3d(1, 1, 1))


def test_a_conv3d_whose_weight_is_a_graph_input_is_left_and_reported() -> None:
    # On a lifted graph (ExportedProgram.graph_module) the weight is a placeholder, not a module attribute.
    ep = torch.export.export(torch.nn.Conv3d(2, 4, 3).eval(), (torch.randn(1, 2, 4, 6, 6),))
    result = RewriteConv3dPass()(ep.graph_module)
    assert not result.modified
    (record,) = result.report
    assert record.rule is Rule.CONV3D
    assert record.reason == "3-D convolution not rewritten: its weight is not computed from parameters alone"


def test_a_frame_wise_conv_with_a_dynamic_batch_reads_its_frames_with_no_copy_and_stays_in_one_delegate() -> None:
    """Float: the conv2d reads the folded frames as they are (no slice, no cat), whatever the batch."""
    conv = torch.nn.Conv3d(2, 4, (1, 3, 3), padding=(0, 1, 1)).eval()
    ep = torch.export.export(conv, (torch.randn(16, 2, 1, 3, 3),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    rewritten = rewrite_for_xnnpack(ep, strict=True)
    copies = [n for n in rewritten.graph.nodes if n.target in (torch.ops.aten.slice.Tensor, torch.ops.aten.cat.default)]
    assert copies == []
    lowered = lower(rewritten, (torch.randn(16, 2, 1, 3, 3),), xnnguard.XnnpackPartitioner())
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
    for batch in (1, 5):
        x = torch.randn(batch, 2, 1, 3, 3)
        torch.testing.assert_close(run_pte(lowered.buffer, (x,))[0], conv(x), atol=1e-5, rtol=1e-5)


def test_a_conv3d_with_a_dynamic_batch_stays_dynamically_quantized_in_dynamic_int8() -> None:
    """xnnguard's quantizer gives its input, frames folded into the batch, a ``cat``, where 1.5.1's layout
    walk stops: XNNPACK runs it quantized (behind the fold's view 1.5.1 would lay out the wrong tensor)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(2, 4, (1, 3, 3), padding=(0, 1, 1)).eval()
    x, batch = torch.randn(2, 2, 4, 6, 6), {0: torch.export.Dim("batch", min=1, max=4)}
    rewritten = rewrite_for_xnnpack(torch.export.export(conv, (x,), dynamic_shapes=(batch,)), strict=True)
    quantizer = xnnguard.XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True,
                                                                                         is_dynamic=True))
    prepared = prepare_pt2e(rewritten.module(), quantizer)  # type: ignore[arg-type]
    prepared(x)
    converted = convert_pt2e(prepared)
    lowered = lower(torch.export.export(converted, (x,), dynamic_shapes=(batch,)), (x,), xnnguard.XnnpackPartitioner())
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
    assert lowered.delegated_ops()["choose_qparams"] >= 1
    for size in (1, 3):
        other = torch.randn(size, 2, 4, 6, 6)
        expected = converted(other)
        torch.testing.assert_close(run_pte(lowered.buffer, (other,))[0], expected,
                                   atol=int8_tolerance(converted, expected, dynamic=False), rtol=0)


class CausalConv3d(torch.nn.Module):
    """Wan's and CogVideoX's causal conv: SiLU, then ``F.pad`` with all temporal padding in front and space on
    both sides, then a conv with no padding of its own. ``channels_pad`` pads the channels too."""

    def __init__(self, channels_pad: int = 0) -> None:
        super().__init__()
        self.widths = (1, 1, 1, 1, 2, 0) + ((0, channels_pad) if channels_pad else ())
        self.conv = torch.nn.Conv3d(4 + channels_pad, 6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.nn.functional.pad(torch.nn.functional.silu(x), self.widths))


def _delegated_pads(lowered: Lowered) -> list[torch.fx.Node]:
    return [node for node in lowered.delegated_nodes if is_op(node, "constant_pad_nd")]


@pytest.mark.parametrize("precision", dynamic_int8_in_slow_tier([*PRECISIONS, "fp16"]))
def test_a_causal_pad_becomes_the_conv_padding_and_the_zero_frames_of_its_taps(precision: str) -> None:
    torch.manual_seed(0)
    lowered, out, reference, tolerance = lower_and_run(
        CausalConv3d().eval(), torch.randn(1, 4, 5, 8, 8), precision  # type: ignore[arg-type]
    )
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
    pads = _delegated_pads(lowered)  # one: the two zero frames in front, on the 4-D frames; H, W the conv2d's own
    assert [tuple(pad.meta["val"].shape) for pad in pads] == [(7, 4, 8, 8)]
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


def test_a_causal_pad_pads_int8_values_in_a_static_int8_program() -> None:
    """The stock quantizer annotates no pad: taken as its own op, the pad of a float SiLU runs in float."""
    torch.manual_seed(0)
    lowered, out, reference, tolerance = lower_and_run(CausalConv3d().eval(), torch.randn(1, 4, 5, 8, 8), "static int8")
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
    pads = _delegated_pads(lowered)
    assert pads and all(is_op(pad.args[0], "dequantize_per_tensor") for pad in pads)
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


def test_a_pad_of_the_channels_stays_a_pad_in_front_of_the_rewritten_conv() -> None:
    torch.manual_seed(0)
    model, x = CausalConv3d(channels_pad=2).eval(), torch.randn(1, 4, 5, 8, 8)
    ep = rewritten(model, x)
    pads = [node for node in ep.graph.nodes if is_op(node, {"pad", "constant_pad_nd"})]
    assert [node.meta["val"].dim() for node in pads][:1] == [5]
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


class PaddedConv3d(torch.nn.Module):
    def __init__(self, conv: torch.nn.Conv3d, widths: tuple[int, ...]) -> None:
        super().__init__()
        self.conv, self.widths = conv, widths

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.nn.functional.pad(x, self.widths))


@settings(derandomize=True, max_examples=20, deadline=None)
@given(conv3d_cases(), st.lists(st.integers(-1, 2), min_size=1, max_size=4).map(lambda sides: sides * 2))
def test_any_zero_pad_in_front_of_a_conv3d_gives_the_same_result_rewritten(
    case: tuple[torch.nn.Conv3d, torch.Tensor], widths: list[int]
) -> None:
    """Widths of 2 to 8 entries: W, H, D and the channels, crops (negative) among them; the conv takes what
    pads D, H and W only, by non-negative widths, and leaves the rest a pad of its own."""
    conv, x = case
    x = torch.nn.functional.pad(x, (2, 2, 2, 2, 2, 2))  # room for the crops
    model = PaddedConv3d(conv, tuple(widths)).eval()
    try:
        with torch.no_grad():
            expected = model(x)
    except RuntimeError:  # a channel pad the conv's weight does not take
        return
    ep = rewritten(model, x)
    assert "conv3d" not in ops(ep) and "convolution" not in ops(ep)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), expected, atol=1e-4, rtol=1e-4)
