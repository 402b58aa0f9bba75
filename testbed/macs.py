"""How much arithmetic a network is: its multiply-adds, counted by ``torch.utils.flop_counter``.

``FlopCounterMode`` counts the matrix products and convolutions of an eager forward (2 FLOPs per
multiply-add); norms, softmax, activations and data movement are not counted, so a GFLOP/s figure
built on it is the rate of the work that a GEMM-bound runtime can do near the machine's peak, and the
rest of the network's time lowers it. The forward runs on the ``meta`` device: shapes only, no
arithmetic and no memory, so even the full-size zoo is counted in seconds.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode


def count_macs(name: str, size: str) -> float:
    """Multiply-adds of one forward of zoo network ``name`` at ``size``."""
    from testbed.networks import NETWORKS

    with torch.device("meta"):
        model, inputs = NETWORKS[name](size)
        return module_macs(model, inputs)


def module_macs(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> float:
    """Multiply-adds of ``model(*inputs)`` (whatever device they are on), half of what FlopCounterMode counts."""
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(*inputs)
    return counter.get_total_flops() / 2


def gflops(macs: float | None, ms: float | None) -> float | None:
    """The GFLOP/s (2 FLOPs per multiply-add) that running ``macs`` multiply-adds in ``ms`` reaches."""
    if not macs or not ms:
        return None
    return 2 * macs / (ms * 1e-3) / 1e9
