"""float16 everywhere float32 works (issue 32): what lowers to one delegate in float32 does so in float16.

XNNPACK's float16 kernels are what float16 is exported for (ARM phones). In float16 the norm, reduction and
activation rewrites did not fire and ExecuTorch turned number operands into conversions, so three small
networks that are one delegate in float32 split: each is lowered here in float16 through xnnguard's flow
(``testbed.flow.lower_and_run(..., "fp16")``), run with the real runtime and compared with eager float16
(``testbed.tolerance.fp16_tolerance``). The zoo networks follow, in the ``network`` tier.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from testbed.flow import lower_and_run
from testbed.network_flow import compute_outside, lower_network

pytestmark = pytest.mark.release_sensitive  # the float16 refusals are ExecuTorch's configs'


class Conv3dGroupNormHead(nn.Module):
    """A video classifier's last stage and head: Conv3d, GroupNorm, ReLU, AvgPool3d, a per-token Linear, the
    mean over tokens (in float16 the group norm and the mean ran outside XNNPACK: 2 delegates)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(3, 16, 3, padding=1)
        self.norm = nn.GroupNorm(4, 16)
        self.pool = nn.AvgPool3d(2)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pool(torch.relu(self.norm(self.conv(x))))
        return self.head(y.flatten(2).transpose(1, 2)).mean(1)


class VitBlock(nn.Module):
    """timm's ``vision_transformer.Block`` (its unfused attention, ``q * scale``): LayerNorm, attention,
    LayerNorm, GELU MLP, two residuals (in float16 the norms, the GELU and the scale's conversion ran outside
    XNNPACK: 3 delegates)."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class UNet3dBlock(nn.Module):
    """nnU-Net's level: Conv3d + InstanceNorm3d + LeakyReLU, down by a strided Conv3d, up by a ConvTranspose3d,
    the skip concatenated (in float16 the instance norms' batch norms and ``repeat``s ran outside: 2+
    delegates)."""

    def __init__(self) -> None:
        super().__init__()

        def conv(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
            return nn.Sequential(nn.Conv3d(c_in, c_out, 3, stride=stride, padding=1),
                                 nn.InstanceNorm3d(c_out, affine=True), nn.LeakyReLU(0.01))

        self.encode, self.down = conv(2, 8), conv(8, 16, stride=2)
        self.up = nn.ConvTranspose3d(16, 8, 2, stride=2, bias=False)
        self.decode = conv(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.encode(x)
        return self.decode(torch.cat([self.up(self.down(skip)), skip], 1))


NETWORKS = {
    "conv3d_groupnorm_head": (Conv3dGroupNormHead, (1, 3, 4, 8, 8)),
    "vit_block": (VitBlock, (1, 17, 32)),
    "unet3d_block": (UNet3dBlock, (1, 2, 4, 8, 8)),
}


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_a_network_one_delegate_in_float32_is_one_delegate_in_float16_with_nothing_outside(name: str) -> None:
    build, shape = NETWORKS[name]
    run = lower_and_run(build(), torch.randn(*shape), "fp16")
    assert run.out.dtype == torch.float16
    assert run.lowered.num_delegates == 1 and not run.lowered.outside_ops(), run.lowered.outside_ops()
    run.assert_matches()


# Each kind of the zoo (tests/test_networks_lowered.py), lowered in float16 at its test size. Their float32
# programs are one delegate each with nothing computed outside; so are their float16 ones, with no dtype
# conversion left outside either. Lowering a network takes 10-60 s: a transformer (layer norms, GELU,
# attention) runs in the network tier, the others in the slow tier; the 3-D UNet's float16 pieces (group and
# instance norms, Conv3d, ConvTranspose3d) have smaller tests (the UNet block below, test_rewrite_norm's).
FLOAT32_DELEGATES = 1
REPRESENTATIVE = ("videomae",)
KINDS = ("mvit", "s3d", "r2plus1d", "swin3d", "unet3d", "unet3d_gn", "video_vae", "videomae", "hiera")


@pytest.mark.network
@pytest.mark.parametrize("name", [pytest.param(name, marks=() if name in REPRESENTATIVE else pytest.mark.slow)
                                  for name in KINDS])
def test_a_zoo_network_in_float16_has_its_float32_delegates_nothing_computed_outside_and_matches(
    name: str, tmp_path: Path
) -> None:
    result = lower_network(name, "test", "fp16", False, tmp_path)
    assert result.status == "ok", result.error
    assert result.delegates == FLOAT32_DELEGATES, (result.delegates, result.kept_out)
    assert compute_outside(result) == 0, result.outside_kinds
    assert not [kind for kind, _ in result.outside_kinds if "to_dim_order_copy" in kind], result.kept_out


@pytest.mark.network
@pytest.mark.slow
def test_qwen2_vls_own_float32_computations_are_all_that_runs_outside_in_float16(tmp_path: Path) -> None:
    """Qwen2-VL's vision tower computes its rotary embedding and its softmax in float32 (``.float()``, then
    back): in float32 those casts vanish and the tower is one delegate; in float16 they are conversions,
    which ExecuTorch 1.5.1 delegates none of (``ToDimOrderCopyConfig``), so each cuts the delegate. What
    runs outside is those conversions and the gather by position ids (no XNNPACK equivalent), nothing else."""
    result = lower_network("qwen_vision", "test", "fp16", False, tmp_path)
    assert result.status == "ok", result.error
    assert compute_outside(result) == 0, result.outside_kinds
    conversions = [record for record in result.kept_out if "to_dim_order_copy" in record]
    assert conversions and all("dtype conversion from torch.float" in record for record in conversions)
