"""xnnguard.XnnpackPartitioner never takes a partition that a later step of the 1.5.1 lowering rejects.

One small model per trap: stock ExecuTorch 1.5.1 fails to lower it; xnnguard lowers it, the .pte loads
and runs with the real runtime, and the numbers are eager PyTorch's. Where an equivalent XNNPACK runs
exists (a max that keeps its dim, a PReLU folded to 4-D) the op ends up delegated; where it does not,
the rule keeps the op out and ``kept_out`` says why. (The report also has a record for each node
ExecuTorch's own configs leave outside, such as the conversion of a scalar constant; ``own_records``
leaves those out, ``test_partitioner_report.py`` tests them.)
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as StockXnnpackPartitioner
from torch.export import Dim

import xnnguard
from testbed.flow import lower_and_run
from testbed.lowered import Lowered, lower, run_pte
from testbed.quantize import PRECISIONS, Precision
from tests.compat_marks import needs_pre_decomposition_hook, without_pre_decomposition_hook
from tests.support import dynamic_int8_in_slow_tier, own_records
from xnnguard.report import Rule
from xnnguard.rules.keep_out import keep_out_reason

pytestmark = pytest.mark.release_sensitive


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _lower_and_compare(model: torch.nn.Module | torch.export.ExportedProgram, inputs: tuple, partitioner: Any,
                       **lower_args: Any) -> Lowered:
    """No rewrite (the partitioner alone): every output of the program matches eager."""
    run = lower_and_run(model, inputs, rewrite=False, partitioner=partitioner, **lower_args)
    run.assert_matches()
    return run.lowered


def _stock_lowering_fails(model, inputs: tuple, message: str, **lower_args) -> None:
    """Stock 1.5.1 raises while lowering, with ``message`` in the error or in one it was raised from."""
    with pytest.raises(Exception) as failure:
        lower(model, inputs, StockXnnpackPartitioner(), **lower_args)
    messages, error = [], failure.value
    while error is not None:
        messages.append(str(error))
        error = error.__cause__ or error.__context__
    assert any(message in text for text in messages), messages


# --- a max over a dim: XNNPACK keeps the dim, written 2 or 3 ---------------------------------------------


class MaxOverDim(torch.nn.Module):
    def __init__(self, dim: int, keepdim: bool = False) -> None:
        super().__init__()
        self.dim, self.keepdim = dim, keepdim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.max(x, dim=self.dim, keepdim=self.keepdim)[0] * 2


X4 = (torch.randn(2, 3, 4, 5),)


@pytest.mark.parametrize(
    ("dim", "keepdim", "stock_error"),
    [(2, False, "only supports keep_dim == True"), (-1, False, "only supports keep_dim == True"),
     (-1, True, "only supports dim == 2 or dim == 3")],
    ids=["dim2", "dim-1", "dim-1_keepdim"],
)
def test_a_max_over_height_or_width_is_rewritten_to_keep_its_dim_and_runs_on_xnnpack(
    dim: int, keepdim: bool, stock_error: str
) -> None:
    model = MaxOverDim(dim, keepdim)
    _stock_lowering_fails(model, X4, stock_error)
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = _lower_and_compare(model, X4, partitioner)
    assert lowered.delegated_ops()["max"] == 1
    assert lowered.num_delegates == 1
    assert own_records(partitioner.kept_out) == []


def _max_without_keepdim(graph: torch.fx.Graph) -> list[str]:
    return [n.name for n in graph.nodes if "max" in str(n.target) and keep_out_reason(n) is not None]


@without_pre_decomposition_hook
def test_without_the_hook_the_first_ops_to_not_decompose_call_rewrites_the_aten_program() -> None:
    program = torch.export.export(MaxOverDim(2).eval(), X4).run_decompositions({})  # what 1.4 hands it
    assert _max_without_keepdim(program.graph) != []
    xnnguard.XnnpackPartitioner().ops_to_not_decompose(program)
    assert _max_without_keepdim(program.graph) == []
    torch.testing.assert_close(program.module()(*X4), MaxOverDim(2)(*X4))


@needs_pre_decomposition_hook
def test_with_the_hook_ops_to_not_decompose_leaves_the_program_as_it_is() -> None:
    program = torch.export.export(MaxOverDim(2).eval(), X4).run_decompositions({})
    code = program.graph_module.code
    xnnguard.XnnpackPartitioner().ops_to_not_decompose(program)
    assert program.graph_module.code == code
    rewritten = xnnguard.XnnpackPartitioner().transform_for_pre_decomposition(program)
    assert _max_without_keepdim(rewritten.graph) == [] and program.graph_module.code == code


def test_a_max_without_keepdim_stays_outside_xnnpack_and_runs_when_lowered_with_to_backend() -> None:
    model = MaxOverDim(2)
    _stock_lowering_fails(model, X4, "only supports keep_dim == True", via_to_backend=True)
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = _lower_and_compare(model, X4, partitioner, via_to_backend=True)
    assert lowered.outside_ops()["max"] == 1
    assert lowered.delegated_ops()["mul"] == 1
    assert [(r.rule, r.reason) for r in own_records(partitioner.kept_out)] == [
        (Rule.MAX_REDUCTION, "max without keepdim: XNNPACK 1.5.1 lowers max over a dim only with keepdim=True")
    ]


def test_a_max_over_the_channels_stays_outside_xnnpack_and_runs() -> None:
    model = MaxOverDim(1, keepdim=True)
    _stock_lowering_fails(model, X4, "only supports dim == 2 or dim == 3")
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = _lower_and_compare(model, X4, partitioner)
    assert lowered.outside_ops()["max"] == 1
    assert [r.rule for r in own_records(partitioner.kept_out)] == [Rule.MAX_REDUCTION]


# --- PReLU: XNNPACK runs it on 4-D tensors only -------------------------------------------------------------


class PReLU(torch.nn.Module):
    def __init__(self, num_parameters: int) -> None:
        super().__init__()
        self.prelu = torch.nn.PReLU(num_parameters)
        with torch.no_grad():
            self.prelu.weight.copy_(torch.linspace(0.1, 0.5, num_parameters))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.prelu(x)


@pytest.mark.parametrize(
    ("num_parameters", "shape"), [(3, (2, 3, 2, 4, 5)), (1, (2, 3, 5))], ids=["5d_per_channel", "3d_one_weight"]
)
def test_a_prelu_on_another_rank_is_folded_to_4d_and_runs_on_xnnpack(num_parameters: int, shape: tuple) -> None:
    model, inputs = PReLU(num_parameters), (torch.randn(shape),)
    _stock_lowering_fails(model, inputs, "Attempting to convert non-NHWC compatible node to NHWC")
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = _lower_and_compare(model, inputs, partitioner)
    assert lowered.delegated_ops() == {"view_copy": 2, "prelu": 1}
    assert lowered.outside_ops() == {}
    assert own_records(partitioner.kept_out) == []


class PermutedPReLU(PReLU):
    """A PReLU of a permuted clip: its input is no view of a contiguous tensor of its shape."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.prelu((x * 2).permute(0, 2, 1, 3, 4))


def test_a_5d_prelu_of_a_permuted_tensor_is_folded_to_4d_and_runs_on_xnnpack() -> None:
    """Folded by reshapes: a view of the permuted input failed, and the PReLU left XNNPACK as gt and where."""
    model, inputs = PermutedPReLU(3).eval(), (torch.randn(1, 4, 3, 5, 6),)
    lowered = _lower_and_compare(model, inputs, xnnguard.XnnpackPartitioner())
    assert lowered.delegated_ops()["prelu"] == 1 and lowered.outside_ops() == {}


def test_a_5d_prelu_with_a_dynamic_batch_is_folded_to_4d_and_delegated() -> None:
    model, inputs = PReLU(3).eval(), (torch.randn(2, 3, 2, 4, 5),)

    def exported() -> torch.export.ExportedProgram:
        return torch.export.export(model, inputs, dynamic_shapes=({0: Dim("batch", min=1, max=8)},))

    _stock_lowering_fails(exported(), inputs, "Attempting to convert non-NHWC compatible node to NHWC")
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = _lower_and_compare(exported(), inputs, partitioner)
    assert lowered.delegated_ops()["prelu"] == 1 and lowered.outside_ops() == {}
    other = torch.randn(5, 3, 2, 4, 5)
    torch.testing.assert_close(run_pte(lowered.buffer, (other,))[0], model(other), atol=1e-6, rtol=0)


def test_a_5d_prelu_with_a_dynamic_depth_runs_as_a_4d_prelu_at_every_depth() -> None:
    """The depth folds into H': the views say -1 for it, the one size XNNPACK's reshape infers."""
    model, inputs = PReLU(3).eval(), (torch.randn(1, 3, 2, 4, 5),)
    exported = torch.export.export(model, inputs, dynamic_shapes=({2: Dim("depth", min=1, max=8)},))
    lowered = _lower_and_compare(exported, inputs, xnnguard.XnnpackPartitioner())
    assert lowered.delegated_ops()["prelu"] == 1 and lowered.outside_ops() == {}
    other = torch.randn(1, 3, 7, 4, 5)
    torch.testing.assert_close(run_pte(lowered.buffer, (other,))[0], model(other), atol=1e-6, rtol=0)


def test_a_5d_prelu_with_a_dynamic_batch_and_depth_is_decomposed_and_runs() -> None:
    """Folding needs all but one size: such a PReLU stays as it is, and its decomposition runs."""
    model, inputs = PReLU(3).eval(), (torch.randn(2, 3, 2, 4, 5),)
    shapes = ({0: Dim("batch", min=1, max=4), 2: Dim("depth", min=1, max=8)},)
    exported = torch.export.export(model, inputs, dynamic_shapes=shapes)
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = _lower_and_compare(exported, inputs, partitioner)
    assert "prelu" not in lowered.delegated_ops()
    assert lowered.delegated_ops()["mul"] == 1  # the decomposed PReLU's product still runs on XNNPACK
    assert [r.rule for r in own_records(partitioner.kept_out)] == [Rule.PRELU_RANK]
    assert own_records(partitioner.kept_out)[0].reason == (
        "PReLU on a 5-D input: XNNPACK runs PReLU channels-last, on 4-D tensors only"
    )


# --- a partition must not output a memory-format round trip of its input -------------------------------------


class MemoryFormatRoundTrip(torch.nn.Module):
    def __init__(self, also: str = "") -> None:
        super().__init__()
        self.also = also

    def forward(self, x: torch.Tensor):
        y = x.to(memory_format=torch.channels_last).to(memory_format=torch.contiguous_format)
        if self.also == "returned_and_added":
            return y, y + 1
        if self.also == "added":
            return y + 1
        return y


@pytest.mark.parametrize("via_to_backend", [False, True], ids=["transform_and_lower", "to_backend"])
def test_a_memory_format_round_trip_of_an_input_is_not_a_partition_output(via_to_backend: bool) -> None:
    model = MemoryFormatRoundTrip()
    _stock_lowering_fails(model, X4, "is already in the inputs", via_to_backend=via_to_backend)
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = _lower_and_compare(model, X4, partitioner, via_to_backend=via_to_backend)
    assert lowered.delegated_ops()["_to_dim_order_copy"] == 1  # to channels-last
    assert lowered.outside_ops()["_to_dim_order_copy"] == 1  # and back
    (record,) = own_records(partitioner.kept_out)
    assert record.rule is Rule.PASSTHROUGH_OUTPUT
    assert record.reason.startswith("it only moves the partition input x")


def test_an_op_that_reads_a_round_trip_output_leaves_the_partition_with_it() -> None:
    model = MemoryFormatRoundTrip("returned_and_added")
    _stock_lowering_fails(model, X4, "is already in the inputs")
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = _lower_and_compare(model, X4, partitioner)
    assert lowered.outside_ops()["add"] == 1
    assert [r.rule for r in own_records(partitioner.kept_out)] == [Rule.PASSTHROUGH_OUTPUT, Rule.NEEDS_KEPT_OUT_NODE]


def test_a_round_trip_that_only_feeds_an_op_of_its_partition_stays_delegated() -> None:
    model = MemoryFormatRoundTrip("added")
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = _lower_and_compare(model, X4, partitioner)
    assert lowered.delegated_ops() == {"_to_dim_order_copy": 2, "add": 1}
    assert own_records(partitioner.kept_out) == []


# --- a partition must not output one value twice ---------------------------------------------------------------


class ResidualGroupNorm(torch.nn.Module):
    """``h`` feeds a delegated add after the (not delegated) group norm and, made contiguous, the group norm:
    the residual block of video VAEs and 3-D UNets. ``copies=2``: two contiguous copies of one value."""

    def __init__(self, copies: int = 1) -> None:
        super().__init__()
        self.copies = copies

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = (x * 2).permute(0, 2, 1, 3, 4)
        if self.copies == 2:
            return torch.nn.functional.group_norm(h.contiguous(), 2) + torch.nn.functional.group_norm(h.contiguous(), 1)
        return h + torch.nn.functional.group_norm(h.contiguous(), 2)


X5 = (torch.randn(1, 2, 4, 6, 6),)


def test_a_copy_of_another_partition_output_is_not_a_partition_output() -> None:
    model = ResidualGroupNorm()
    _stock_lowering_fails(model, X5, "is already in the inputs")
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = _lower_and_compare(model, X5, partitioner)
    assert lowered.delegated_ops() == {"mul": 1, "permute_copy": 1, "add": 1}
    (record,) = own_records(partitioner.kept_out)
    assert record.rule is Rule.PASSTHROUGH_OUTPUT
    assert record.reason.startswith("it only copies aten_permute_copy_default, another output of the partition")


def test_two_copies_of_one_value_are_not_both_partition_outputs() -> None:
    model = ResidualGroupNorm(copies=2)
    _stock_lowering_fails(model, X5, "is already in the inputs")
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = _lower_and_compare(model, X5, partitioner)
    assert lowered.outside_ops()["_clone_dim_order"] == 2
    assert [r.rule for r in own_records(partitioner.kept_out)] == [Rule.PASSTHROUGH_OUTPUT] * 2


class Conv3dResBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(4, 8, 3, padding=1)
        self.norm = torch.nn.GroupNorm(2, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        return h + torch.nn.functional.silu(self.norm(h))


@pytest.mark.parametrize("precision", dynamic_int8_in_slow_tier(PRECISIONS))
def test_a_rewritten_conv3d_with_a_group_norm_residual_lowers_and_runs(precision: Precision) -> None:
    lowered, out, reference, tolerance = lower_and_run(Conv3dResBlock().eval(), torch.randn(1, 4, 3, 8, 8), precision)
    assert lowered.outside_ops()["convolution"] == 0
    assert float((out - reference).abs().max()) <= tolerance


def test_a_max_pooling_written_without_its_stride_lowers_runs_and_matches() -> None:
    """ExecuTorch 1.4's MaxPool2dConfig raises IndexError on ``F.max_pool2d(x, 2)`` from inside the lowering;
    a stock check that raises refuses its node instead (1.5 takes it)."""

    class ConvPool(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.max_pool2d(self.conv(x), 2)

    model, x = ConvPool().eval(), torch.randn(1, 3, 8, 8)
    lowered = lower(model, (x,), xnnguard.XnnpackPartitioner())
    torch.testing.assert_close(run_pte(lowered.buffer, (x,))[0], model(x), atol=1e-5, rtol=1e-5)


# --- a pad that crops ----------------------------------------------------------------------------------


class PaddedSkip(torch.nn.Module):
    """A UNet decoder stage after the original paper: the skip padded to the upsampled tensor's size by
    ``diff // 2`` on each side, a crop where the skip is the larger, then concatenated and convolved."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, skip: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        dy, dx = up.shape[2] - skip.shape[2], up.shape[3] - skip.shape[3]
        skip = torch.nn.functional.pad(skip, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
        return self.conv(torch.cat([skip, up], 1))


CROPS = [((1, 4, 10, 9), (1, 4, 8, 8)), ((1, 4, 10, 7), (1, 4, 8, 8))]  # crops only; a crop and a pad


def test_stock_1_5_1_lowers_a_cropping_pad_that_then_fails_on_every_forward() -> None:
    inputs = tuple(torch.randn(shape) for shape in CROPS[0])
    lowered = lower(PaddedSkip().eval(), inputs, StockXnnpackPartitioner())
    assert lowered.outside_ops()["constant_pad_nd"] == 1
    with pytest.raises(RuntimeError):
        run_pte(lowered.buffer, inputs)


@pytest.mark.parametrize("shapes", CROPS, ids=["crop", "crop-and-pad"])
def test_a_cropping_pad_is_slices_and_a_pad_on_xnnpack_and_matches(shapes: tuple) -> None:
    torch.manual_seed(0)
    inputs = tuple(torch.randn(shape) for shape in shapes)
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = _lower_and_compare(PaddedSkip().eval(), inputs, partitioner)
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
    assert own_records(partitioner.kept_out) == []


def test_a_cropping_pad_runs_in_a_static_int8_program() -> None:
    torch.manual_seed(0)
    run = lower_and_run(PaddedSkip().eval(), tuple(torch.randn(shape) for shape in CROPS[1]), "static int8")
    run.assert_matches()
    assert run.lowered.outside_ops() == {} and run.lowered.num_delegates == 1
