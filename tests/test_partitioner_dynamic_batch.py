"""A program exported with a dynamic batch keeps its views on XNNPACK, and runs at every batch it allows.

ExecuTorch 1.5.1's XNNPACK partitioner refuses a view whose sizes are symbolic, which is how export spells
every view of a dynamically batched program (a ``flatten`` too); XNNPACK itself infers one dim (-1).
It refuses every slice of such a program too; XNNPACK runs one that keeps the batch whole.
"""

from __future__ import annotations

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as StockXnnpackPartitioner
from torch.export import Dim

import xnnguard
from testbed.lowered import lower, run_pte
from testbed.quantize import PRECISIONS, Precision, xnnpack_quantizer
from testbed.tolerance import float_tolerance, int8_tolerance
from tests.support import dynamic_int8_in_slow_tier
from xnnguard.rewrite.forms.inferred_view import InferredViewPass

pytestmark = pytest.mark.release_sensitive

BATCH = ({0: Dim("batch", min=1, max=8)},)


class ConvFlattenLinear(torch.nn.Module):
    """A classifier head: conv, flatten, linear; the flatten is a view of the batch-dynamic activation."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def _exported(model: torch.nn.Module, x: torch.Tensor, precision: Precision) -> tuple[torch.export.ExportedProgram,
                                                                                       torch.nn.Module]:
    ep = torch.export.export(model, (x,), dynamic_shapes=BATCH)
    if precision == "float":
        return ep, model
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    prepared = prepare_pt2e(ep.module(), xnnpack_quantizer(dynamic=precision == "dynamic int8"))  # type: ignore[arg-type]
    prepared(x)
    converted = convert_pt2e(prepared)
    return torch.export.export(converted, (x,), dynamic_shapes=BATCH), converted


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_flatten_under_a_dynamic_batch_is_delegated_and_runs_at_every_batch(precision: Precision) -> None:
    torch.manual_seed(0)
    model, x = ConvFlattenLinear().eval(), torch.randn(2, 3, 8, 8)
    ep, reference = _exported(model, x, precision)
    lowered = lower(ep, (x,), xnnguard.XnnpackPartitioner())
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
    for batch in (1, 2, 5):
        other = torch.randn(batch, 3, 8, 8)
        expected = reference(other)
        tolerance = (float_tolerance(expected) if precision == "float"
                     else int8_tolerance(reference, expected, dynamic=False))  # type: ignore[arg-type]
        torch.testing.assert_close(run_pte(lowered.buffer, (other,))[0], expected, atol=tolerance, rtol=0)


class StackAfterConv(torch.nn.Module):
    """Two conv branches stacked in a new dim (``torch.stack`` unsqueezes each: a view of the batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack((self.a(x), self.b(x)), 2).relu()


def test_a_stack_under_a_dynamic_batch_is_delegated_and_runs_at_every_batch() -> None:
    torch.manual_seed(0)
    model, x = StackAfterConv().eval(), torch.randn(2, 3, 8, 8)
    lowered = lower(torch.export.export(model, (x,), dynamic_shapes=BATCH), (x,), xnnguard.XnnpackPartitioner())
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1, lowered.outside_ops()
    for batch in (1, 2, 5):
        other = torch.randn(batch, 3, 8, 8)
        expected = model(other)
        torch.testing.assert_close(run_pte(lowered.buffer, (other,))[0], expected, atol=float_tolerance(expected),
                                   rtol=0)


def test_the_stock_partitioner_leaves_that_view_to_the_portable_kernel() -> None:
    """Why the rewrite exists: stock 1.5.1 splits the program at the flatten."""
    model, x = ConvFlattenLinear().eval(), torch.randn(2, 3, 8, 8)
    lowered = lower(torch.export.export(model, (x,), dynamic_shapes=BATCH), (x,), StockXnnpackPartitioner())
    assert lowered.outside_ops()["view_copy"] == 1 and lowered.num_delegates == 2


def test_a_view_with_one_dynamic_dim_says_minus_one_for_it() -> None:
    model, x = ConvFlattenLinear().eval(), torch.randn(2, 3, 8, 8)
    program = torch.export.export(model, (x,), dynamic_shapes=BATCH).run_decompositions({})
    InferredViewPass()(program.graph_module)
    (view,) = [n for n in program.graph.nodes if "view" in str(n.target)]
    assert view.args[1] == [-1, 144]


def test_a_view_spelled_with_symbols_whose_result_is_static_takes_its_static_sizes() -> None:
    """A stride that leaves one position at every length of the range (R(2+1)D's head at 2 to 4 frames):
    the flatten is spelled ``[1, 8 * ((s - 1) // 4 + 1)]`` but is ``[1, 8]``; left symbolic, it stayed
    outside and ExecuTorch refused to serialize its static view of the delegate's dynamic output."""

    class StridedHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = torch.nn.Conv1d(3, 8, 3, stride=4, padding=1), torch.nn.Linear(8, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.relu(self.conv(x)).flatten(1))

    shapes = ({2: Dim("frames", min=2, max=4)},)
    program = torch.export.export(StridedHead().eval(), (torch.randn(1, 3, 4),), dynamic_shapes=shapes)
    program = program.run_decompositions({})
    InferredViewPass()(program.graph_module)
    (view,) = [n for n in program.graph.nodes if "view" in str(n.target)]
    assert view.args[1] == [1, 8]


def test_a_view_with_two_dynamic_dims_is_left_as_it_was() -> None:
    """XNNPACK infers one dim only: a view merging two dynamic dims keeps its symbolic sizes."""

    class TwoDynamic(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * 2).reshape(x.shape[0], x.shape[1], 12)

    x = torch.randn(2, 3, 3, 4)
    shapes = ({0: Dim("batch", max=8), 1: Dim("tokens", max=8)},)
    program = torch.export.export(TwoDynamic(), (x,), dynamic_shapes=shapes).run_decompositions({})
    before = [(n.name, n.args[1]) for n in program.graph.nodes if "view" in str(n.target)]
    InferredViewPass()(program.graph_module)
    assert [(n.name, n.args[1]) for n in program.graph.nodes if "view" in str(n.target)] == before


class ClassTokenSplit(torch.nn.Module):
    """A ViT head under a dynamic batch: the class token and the patch tokens are slices of [B, N, C]."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.qkv(x)
        q, k = y[:, :, :8], y[:, :, 8:16]  # a fused projection split along channels
        cls, patches = q[:, :1], k[:, 1:]  # and along tokens
        return self.proj(torch.relu(patches) + cls)


class ConvCrop(torch.nn.Module):
    """Convs with a crop between them: the slice runs in XNNPACK's channels-last layout."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x)[:, :, 1:5, 2:])


SLICED = {"class token split": (ClassTokenSplit, (2, 9, 8)), "conv crop": (ConvCrop, (2, 3, 10, 10))}


@pytest.mark.parametrize("precision", dynamic_int8_in_slow_tier(PRECISIONS))
@pytest.mark.parametrize("kind", SLICED)
def test_slices_along_static_dims_under_a_dynamic_batch_are_delegated_and_run_at_every_batch(
    kind: str, precision: Precision
) -> None:
    torch.manual_seed(0)
    network, shape = SLICED[kind]
    model, x = network().eval(), torch.randn(*shape)
    ep, reference = _exported(model, x, precision)
    lowered = lower(ep, (x,), xnnguard.XnnpackPartitioner())
    assert lowered.outside_ops() == {} and lowered.num_delegates == 1
    for batch in (1, 2, 7):
        other = torch.randn(batch, *shape[1:])
        expected = reference(other)
        tolerance = (float_tolerance(expected) if precision == "float"
                     else int8_tolerance(reference, expected, dynamic=False))  # type: ignore[arg-type]
        torch.testing.assert_close(run_pte(lowered.buffer, (other,))[0], expected, atol=tolerance, rtol=0)


def test_a_slice_of_the_dynamic_batch_itself_stays_outside_and_runs() -> None:
    """XNNPACK's 0 means the whole dim: a slice that cuts the symbolic dim has no such form."""

    class FirstSample(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.fc(x)[:1])

    model, x = FirstSample().eval(), torch.randn(3, 4)
    lowered = lower(torch.export.export(model, (x,), dynamic_shapes=BATCH), (x,), xnnguard.XnnpackPartitioner())
    assert lowered.outside_ops() == {"slice_copy": 1}
    other = torch.randn(5, 4)
    torch.testing.assert_close(run_pte(lowered.buffer, (other,))[0], model(other), atol=1e-5, rtol=0)
