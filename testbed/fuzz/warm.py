"""Imported by the fuzz runner's fork server: the flow loaded and its first-call costs paid, once.

A child forked from the server then starts warm: a cold process spends about 10 s of its first lowering
on imports and first-call setup (export, the edge dialect, the partitioner, pt2e), several times what a
small program costs. Nothing here starts a thread a fork would lose: one intra-op thread, and no program
is loaded into the runtime (its thread pool starts in each child).
"""

from __future__ import annotations

import warnings
from contextlib import suppress

import torch

torch.set_num_threads(1)


def warm_up() -> None:
    """Export, rewrite, lower and serialize a small conv in float, then quantize and lower it in int8."""
    import xnnguard
    from testbed.lowered import lower
    from testbed.quantize import quantize_pt2e, xnnguard_quantizer
    from xnnguard.boundary.runtime import pybindings

    pybindings()  # the runtime's native library, imported (not started)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 2, 3), torch.nn.ReLU(), torch.nn.LayerNorm(4)).eval()
    inputs = (torch.randn(1, 2, 6, 6),)
    ep = xnnguard.XnnpackRewriter()(torch.export.export(model, inputs))
    lower(ep, inputs, xnnguard.XnnpackPartitioner())
    converted = quantize_pt2e(ep, inputs, xnnguard_quantizer(dynamic=False))
    lower(torch.export.export(converted, inputs), inputs, xnnguard.XnnpackPartitioner())


def _quietly_warm_up() -> None:
    """``warm_up``, its imports' chatter (torchao's optional CUDA libraries) kept off the terminal."""
    from xnnguard.runtime_check.runtime_load import captured_stderr

    with captured_stderr(), warnings.catch_warnings(), suppress(Exception):  # a cold child is slower, not wrong
        warnings.simplefilter("ignore")
        warm_up()


_quietly_warm_up()
