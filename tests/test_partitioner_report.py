"""The partitioner's report answers "which ops fell back, and why?" for every node it leaves outside XNNPACK.

One record per operator call outside: the xnnguard rule that kept it out, or, for a node no rule of
xnnguard's touched, ExecuTorch's own reason: no XNNPACK config takes the op, or the text its config
logs through ``WhyNoPartition`` when it refuses the node. Real lowering, real runtime.
"""

from __future__ import annotations

import logging

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

import xnnguard
from testbed.lowered import lower, run_pte
from testbed.quantize import quantize_pt2e, xnnpack_quantizer
from tests.support import ClassToken, ClassTokenOfIds
from xnnguard.example_models import Conv3dReLU, Patchify
from xnnguard.report import Rule

pytestmark = pytest.mark.release_sensitive


class NormThenMean(torch.nn.Module):
    """A layer norm (no XNNPACK config at all) and a mean over a 3-D tensor (MeanDimConfig refuses it)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.linear = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(x).mean(dim=1))


X = (torch.randn(2, 5, 16),)


def _outside_op_nodes(ep: torch.export.ExportedProgram, partitioner: xnnguard.XnnpackPartitioner) -> list[str]:
    """The operator calls left in the lowered top-level graph, outside every delegate (getitem is no operator)."""
    graph = to_edge_transform_and_lower(ep, partitioner=[partitioner]).exported_program().graph_module.graph
    return sorted(
        node.name
        for node in graph.nodes
        if node.op == "call_function"
        and "executorch_call_delegate" not in str(node.target)
        and getattr(node.target, "__module__", None) != "_operator"
    )


def test_a_layer_norm_and_a_mean_each_get_exactly_one_record_with_executorchs_reason() -> None:
    model, partitioner = NormThenMean().eval(), xnnguard.XnnpackPartitioner()
    lowered = lower(model, X, partitioner)
    torch.testing.assert_close(run_pte(lowered.buffer, X)[0], model(*X), atol=1e-5, rtol=1e-5)
    records = {record.op: record for record in partitioner.report}
    assert len(partitioner.report) == len(records) == 2
    norm, mean = records["aten.native_layer_norm.default"], records["aten.mean.dim"]
    assert norm.rule is Rule.NO_XNNPACK_CONFIG
    assert norm.reason == "no XNNPACK config takes aten.native_layer_norm.default"
    assert mean.rule is Rule.XNNPACK_CONFIG
    assert mean.reason == "XNNPACK's MeanDimConfig: mean.dim only supports averaging 4D tensors, got tensor of rank 3"
    assert lowered.delegated_ops()["linear"] + lowered.delegated_ops()["addmm"] == 1


@pytest.mark.parametrize("case", ["layer_norm_and_mean", "patchify", "static_int8_conv3d"])
def test_every_node_left_outside_xnnpack_has_one_record(case: str) -> None:
    if case == "layer_norm_and_mean":
        ep = torch.export.export(NormThenMean().eval(), X)
    elif case == "patchify":
        ep = torch.export.export(Patchify().eval(), Patchify.example_inputs())
    else:
        inputs = Conv3dReLU.example_inputs()
        ep = torch.export.export(quantize_pt2e(Conv3dReLU(), inputs, xnnpack_quantizer(per_channel=False)), inputs)
    partitioner = xnnguard.XnnpackPartitioner()
    outside = _outside_op_nodes(ep, partitioner)
    assert outside  # each case leaves something outside
    assert sorted(record.node for record in partitioner.report) == outside


def test_the_summary_line_counts_executorchs_reasons_too(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="xnnguard"):
        lower(NormThenMean().eval(), X, xnnguard.XnnpackPartitioner())
    lines = [r.getMessage() for r in caplog.records if r.name == "xnnguard"]
    assert len(lines) == 1
    assert lines[0].startswith("xnnguard: 2 nodes kept out of XNNPACK: 1 no_xnnpack_config, 1 xnnpack_config; ")


def _why_records(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("WhyNoPartition")]


def test_the_users_logging_sees_what_it_saw_before(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)  # the default: ExecuTorch's DEBUG lines are not shown
    lower(NormThenMean().eval(), X, xnnguard.XnnpackPartitioner())
    assert _why_records(caplog) == []
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="executorch.backends.xnnpack.partition.config")
    lower(NormThenMean().eval(), X, xnnguard.XnnpackPartitioner())
    assert any("mean.dim only supports averaging 4D tensors" in line for line in _why_records(caplog))


class GatherByInput(torch.nn.Module):
    """Rows of a table picked by position ids the caller passes (Qwen2-VL's rotary table), then a linear."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(10, 16))
        self.linear = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.linear(x * self.table[ids])


def test_a_gather_by_run_time_indices_is_reported_as_having_no_xnnpack_equivalent() -> None:
    model, partitioner = GatherByInput().eval(), xnnguard.XnnpackPartitioner()
    inputs = (torch.randn(4, 16), torch.tensor([3, 1, 4, 1]))
    lowered = lower(model, inputs, partitioner)
    torch.testing.assert_close(run_pte(lowered.buffer, inputs)[0], model(*inputs), atol=1e-5, rtol=1e-5)
    (gather,) = [record for record in partitioner.report if record.op == "aten.index.Tensor"]
    assert gather.rule is Rule.NO_XNNPACK_EQUIVALENT
    assert "XNNPACK has no gather" in gather.reason and "ids" in gather.reason


class IntegerArithmetic(torch.nn.Module):
    """A float op, and an int64 sum next to it: the sum has nothing in XNNPACK to run on."""

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(x), counts + counts


def test_an_op_on_integer_tensors_is_reported_as_having_no_xnnpack_equivalent() -> None:
    model, partitioner = IntegerArithmetic().eval(), xnnguard.XnnpackPartitioner()
    inputs = (torch.randn(2, 3), torch.tensor([1, 2, 3]))
    lower(model, inputs, partitioner)
    (add,) = [record for record in partitioner.report if "add" in record.op]
    assert add.rule is Rule.NO_XNNPACK_EQUIVALENT
    assert add.reason == "computes an int64 tensor: XNNPACK takes no integer tensors"


def test_an_expand_to_a_dynamic_batch_is_reported_as_having_no_xnnpack_equivalent() -> None:
    model, partitioner = ClassTokenOfIds().eval(), xnnguard.XnnpackPartitioner()
    x = torch.randint(0, 10, (2, 5))
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4)},))
    lowered = lower(xnnguard.rewrite_for_xnnpack(ep), (x,), partitioner)
    for batch in (x, x[:1], torch.cat((x, x[:1]))):
        torch.testing.assert_close(run_pte(lowered.buffer, (batch,))[0], model(batch), atol=1e-5, rtol=1e-5)
    (expand,) = [record for record in partitioner.report if "expand" in record.op]
    assert expand.rule is Rule.NO_XNNPACK_EQUIVALENT
    assert "XNNPACK has no broadcast node" in expand.reason and "dim 0" in expand.reason


def test_an_expand_to_a_static_batch_is_no_longer_an_expand_after_the_rewrites() -> None:
    model, partitioner = ClassToken().eval(), xnnguard.XnnpackPartitioner()
    x = torch.randn(2, 5, 16)
    lowered = lower(xnnguard.rewrite_for_xnnpack(torch.export.export(model, (x,))), (x,), partitioner)
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
