"""The network zoo (``benchmarks.networks``) builds, runs and exports at its "test" size.

Lowering every network takes tens of seconds each, so it is left to ``python -m
benchmarks.network_report --size test``; here only what the report relies on: a builder gives an eval
model and its inputs, the same ones in every process (the timing protocol rebuilds the network in
fresh processes), and ``torch.export`` takes it (with its dynamic dims, where it declares some).
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.networks import NETWORKS


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_network_builds_deterministically_and_exports(name: str) -> None:
    model, inputs = NETWORKS[name]("test")
    assert not model.training
    again, inputs_again = NETWORKS[name]("test")
    with torch.no_grad():
        out = model(*inputs)
        torch.testing.assert_close(again(*inputs_again), out, atol=0, rtol=0)
    ep = torch.export.export(model, inputs, dynamic_shapes=getattr(model, "export_dynamic_shapes", None))
    torch.testing.assert_close(ep.module()(*inputs), out, atol=1e-5, rtol=1e-5)


def test_unknown_size_names_the_sizes() -> None:
    with pytest.raises(ValueError, match="bench, test"):
        NETWORKS["mvit"]("huge")
