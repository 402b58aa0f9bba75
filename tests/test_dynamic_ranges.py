"""A program runs at every size its exported range allows (``xnnguard.keep_dynamic_ranges``).

Lowered the plain way, a float32 conv over a dynamic batch (or over frames folded into the batch) is
planned for batches under 16 only: FakeTensor's conv guards on ATen's NNPACK batch size when ExecuTorch
traces it again (``xnnguard.rules.conv_batch_range``). Stock ExecuTorch 1.5.1 does the same.
"""

from __future__ import annotations

import logging

import pytest
import torch
from executorch.exir import to_edge, to_edge_transform_and_lower
from torch import nn

import xnnguard
from testbed.lowered import run_pte
from testbed.tolerance import float_tolerance
from xnnguard.rules.conv_batch_range import batch_range_narrowed_by

pytestmark = pytest.mark.release_sensitive

BATCH = torch.export.Dim("batch", min=1, max=64)


def _conv_net(kernel: int = 1, **conv: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, kernel, **conv), nn.ReLU()).eval()


def _export(model: nn.Module, batch: int = 2, dtype: torch.dtype = torch.float32) -> torch.export.ExportedProgram:
    example = torch.randn(batch, 3, 12, 12, dtype=dtype)
    return torch.export.export(model.to(dtype), (example,), dynamic_shapes=({0: BATCH},))


def _serialized_batch_capacity(program: torch.export.ExportedProgram) -> int:
    """The largest batch the serialized program's input is planned for (ExecuTorch's upper bound)."""
    batch = program.graph_module.graph.find_nodes(op="placeholder")[-1].meta["val"].shape[0]
    return int(batch.node.shape_env.bound_sympy(batch.node.expr).upper)


def _lower(ep: torch.export.ExportedProgram) -> tuple[bytes, torch.export.ExportedProgram]:
    manager = to_edge_transform_and_lower(ep, partitioner=[xnnguard.XnnpackPartitioner()]).to_executorch()
    return manager.buffer, manager.exported_program()


def test_a_conv_over_a_dynamic_batch_runs_at_every_batch_of_the_range_when_lowered_inside_keep_dynamic_ranges():
    model = _conv_net(3, padding=1)
    with xnnguard.keep_dynamic_ranges():
        buffer, _ = _lower(_export(model))
    for batch in (1, 15, 16, 64):
        x = torch.randn(batch, 3, 12, 12)
        expected = model(x)
        out = run_pte(buffer, (x,))[0]
        torch.testing.assert_close(out, expected, atol=float_tolerance(expected), rtol=0, msg=f"batch {batch}")


def test_frames_folded_into_a_conv_batch_run_at_every_length_of_the_range_inside_keep_dynamic_ranges():
    class PerFrameConv(nn.Module):  # a video VAE's spatial upsampler: frames into the batch, a Conv2d each
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, clip: torch.Tensor) -> torch.Tensor:
            n, c, t, h, w = clip.shape
            frames = clip.transpose(1, 2).reshape(n * t, c, h, w)
            return self.conv(frames).reshape(n, t, 8, h, w).transpose(1, 2)

    model = PerFrameConv().eval()
    frames = torch.export.Dim("frames", min=2, max=32)
    ep = torch.export.export(model, (torch.randn(1, 3, 4, 12, 12),), dynamic_shapes=({2: frames},))
    with xnnguard.keep_dynamic_ranges():
        buffer, _ = _lower(ep)
    for length in (2, 15, 16, 32):
        clip = torch.randn(1, 3, length, 12, 12)
        expected = model(clip)
        out = run_pte(buffer, (clip,))[0]
        torch.testing.assert_close(out, expected, atol=float_tolerance(expected), rtol=0, msg=f"{length} frames")


def test_the_partitioner_warns_when_lowering_outside_keep_dynamic_ranges_narrows_a_batch(caplog):
    with caplog.at_level(logging.WARNING, logger="xnnguard"):
        _lower(_export(_conv_net(3, padding=1)))
    assert "xnnguard.keep_dynamic_ranges()" in caplog.text
    assert "capped below 16" in caplog.text


def test_the_partitioner_does_not_warn_inside_keep_dynamic_ranges(caplog):
    with caplog.at_level(logging.WARNING, logger="xnnguard"), xnnguard.keep_dynamic_ranges():
        _lower(_export(_conv_net(3, padding=1)))
    assert "keep_dynamic_ranges" not in caplog.text


@pytest.mark.parametrize(
    ("case", "model", "batch", "dtype", "narrowed"),
    [
        ("a 3x3 conv, stride 1", _conv_net(3, padding=1), 2, torch.float32, True),
        ("a 1x1 conv", _conv_net(), 2, torch.float32, True),
        ("a strided conv", _conv_net(3, padding=1, stride=2), 2, torch.float32, False),
        ("a dilated conv", _conv_net(3, padding=2, dilation=2), 2, torch.float32, False),
        ("a float16 conv", _conv_net(3, padding=1), 2, torch.float16, False),
        ("an example batch of 20", _conv_net(3, padding=1), 20, torch.float32, False),
    ],
)
def test_the_rule_predicts_which_convs_lowering_caps_below_a_batch_of_16(case, model, batch, dtype, narrowed):
    ep = _export(model, batch, dtype)
    edge = to_edge(ep).exported_program()  # the dialect the partitioner asks the rule in
    conv = next(n for n in edge.graph.nodes if "convolution" in str(n.target))
    predicted = batch_range_narrowed_by(conv) is not None
    _, lowered = _lower(ep)  # outside keep_dynamic_ranges: what lowering does to the range
    assert predicted is narrowed, case
    assert (_serialized_batch_capacity(lowered) < 16) is narrowed, case
