"""Each network kind of the zoo, at its test size, goes onto XNNPACK whole through xnnguard's flow.

The flow is ``rewrite_for_xnnpack`` then ``xnnguard.XnnpackPartitioner`` (``testbed.network_flow``,
the one the benchmark runs at bench size). Each network ends up on at most three XNNPACK delegates with
no compute op left on portable kernels. It loads and runs with the real runtime, and matches eager.
Quantized with ``xnnguard.XNNPACKQuantizer`` (static int8 calibrated on the example input, or dynamic) it keeps those
targets and matches its converted pt2e model, as closely as rounding lets it (``testbed.rounding_floor``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.network_flow import MAX_DELEGATES, compute_outside, lower_network

pytestmark = pytest.mark.network

# One network per kind issue 12 names; the zoo's variants of a kind (SDPA, dynamic) are not repeated.
KINDS = ("mvit", "s3d", "r2plus1d", "swin3d", "unet3d", "unet3d_gn", "video_vae", "videomae", "hiera", "qwen_vision",
         "wan_vae")
# Static int8 (15-60 s of ExecuTorch lowering each, so in the slow tier, `make test-all`): the 3-D CNNs
# whose convs stay float between int8 ops, the video VAE (RMS norms, causal pads, upsampling) and two
# transformers. The other kinds' int8 rows are `make bench`'s, each with an int8 test of its own op: MViT's
# pooling attention (test_rewrite_attention), the 3-D UNets' norms and upsampling (test_rewrite_norm,
# test_rewrite_upsample), Swin3D (test_partitioner_int8 lowers a small one with both quantizers), Hiera's
# 7-D mask units and stage change (test_reduce_rank's int8 window block, test_partitioner_merge).
INT8_KINDS = ("s3d", "r2plus1d", "video_vae", "videomae", "qwen_vision")
# Dynamic int8: the video VAE, whose convs read RMS norms (a gain of shape (C, 1, 1)) behind frame folds,
# the inputs 1.5.1 lays out wrong for a dynamically quantized conv (xnnguard.rules.dynamic_conv_source).
DYNAMIC_INT8_KINDS = ("video_vae",)
# The float kinds that take 14-35 s each (CI's 20 minutes): in the slow tier. The default tier keeps a 3-D
# CNN of each build (R(2+1)D, S3D) and two transformer towers; the 3-D UNet with group norms and the video VAE
# have their blocks in test_float16 and test_partitioner_traps;
# MViT's pooling (test_rewrite_pool3d, test_rewrite_views), Swin3D's windows (test_reduce_rank), Hiera's mask
# units (test_partitioner_merge, test_rewrite_reduce) and the Wan decoder's idioms (test_rewrite_idioms) have
# small tests of their own. The dynamic-int8 VAE is slow too: its rule fires in test_rule_registry, and a
# dynamically quantized conv reading a reshape runs in test_rewrite_upsample's 2-D dynamic row.
SLOW_FLOAT_KINDS = ("mvit", "swin3d", "unet3d", "unet3d_gn", "video_vae", "hiera", "wan_vae")
PROGRAMS = ([pytest.param(name, "float", id=f"{name}-float", marks=pytest.mark.slow if name in SLOW_FLOAT_KINDS else ())
             for name in KINDS]
            + [pytest.param(name, "static", id=f"{name}-static", marks=pytest.mark.slow) for name in INT8_KINDS]
            + [pytest.param(name, "dynamic", id=f"{name}-dynamic", marks=pytest.mark.slow)
               for name in DYNAMIC_INT8_KINDS])


@pytest.mark.parametrize("name, precision", PROGRAMS)
def test_a_network_runs_on_at_most_three_delegates_with_no_compute_outside_and_matches(
    name: str, precision: str, tmp_path: Path
) -> None:
    result = lower_network(name, "test", precision, False, tmp_path)
    assert result.status == "ok", result.error
    assert result.delegates is not None and 1 <= result.delegates <= MAX_DELEGATES, result.delegates
    assert compute_outside(result) == 0, result.outside_kinds


# Dynamic frames (issue 33, `testbed.network_flow.dynamic_frames`: 2 to twice the example's), run at the example's
# frames and at twice as many: the 3-D UNet (ConvTranspose3d, InstanceNorm3d) and the video VAE (causal convs,
# RMS norms, frame folds) in static and dynamic int8, and the Wan decoder (whole slices, stacks over the frames)
# in float, and S3D in float, traced at a clip that leaves its last stage two frames. Each takes 20-90 s of
# ExecuTorch lowering: the slow tier.
FRAMES_PROGRAMS = [pytest.param(name, precision, id=f"{name}-{precision}", marks=pytest.mark.slow)
                   for name, precision in (("unet3d", "static"), ("unet3d", "dynamic"), ("video_vae", "static"),
                                           ("video_vae", "dynamic"), ("wan_vae", "float"), ("s3d", "float"))]


@pytest.mark.parametrize("name, precision", FRAMES_PROGRAMS)
def test_a_video_network_with_dynamic_frames_is_one_delegate_and_matches_at_two_lengths(
    name: str, precision: str, tmp_path: Path
) -> None:
    result = lower_network(name, "test", precision, False, tmp_path, batch="frames")
    assert result.status == "ok", result.error
    assert result.delegates == 1 and compute_outside(result) == 0, (result.delegates, result.outside_kinds)
    assert result.long_frames is not None and result.long_err is not None, "not run at the longer clip"
