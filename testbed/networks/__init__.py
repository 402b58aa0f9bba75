"""A zoo of video, 3-D and VLM-vision networks with random weights, for measuring whole-network lowering.

Each builder is ``build(size="bench") -> (model, example_inputs)``, model in eval mode, weights and inputs
fixed by a seed (so a fresh process builds the same network). ``"bench"`` keeps the original layer structure
at reduced width/depth/resolution (one eager forward on 2 threads in roughly 5-100 ms); ``"test"`` has the
same op structure, tiny, for the test suite; ``"full"`` is the published network: its widths, depths and input
size (seconds to minutes a forward; for ``bench_peers --size full``). Each module's docstring says which
architecture it follows and what it simplifies. A model that must be exported with dynamic dims carries their
spec in ``model.export_dynamic_shapes``; one without a batch dim says in ``model.dynamic_batch_shapes`` what a
"dynamic batch" is for it. ``python -m benchmarks.network_report`` lowers them.
"""

from __future__ import annotations

from collections.abc import Callable

from testbed.networks import hiera, mvit, qwen_vision, r2plus1d, s3d, swin3d, unet3d, video_vae, videomae, wan_vae
from testbed.networks._common import SIZES, Built

__all__ = ["NETWORKS", "SIZES", "Builder", "Built"]

Builder = Callable[[str], Built]

NETWORKS: dict[str, Builder] = {
    "mvit": mvit.build,
    "s3d": s3d.build,
    "r2plus1d": r2plus1d.build,
    "swin3d": swin3d.build,
    "unet3d": unet3d.build,
    "unet3d_gn": unet3d.build_gn,
    "video_vae": video_vae.build,
    "wan_vae": wan_vae.build,
    "videomae": videomae.build,
    "videomae_sdpa": videomae.build_sdpa,
    "hiera": hiera.build,
    "qwen_vision": qwen_vision.build,
    "qwen_vision_dyn": qwen_vision.build_dynamic,
}
