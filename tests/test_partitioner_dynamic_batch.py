"""A program exported with a dynamic batch keeps its views on XNNPACK, and runs at every batch it allows.

ExecuTorch 1.5.1's XNNPACK partitioner refuses a view whose sizes are symbolic, which is how export spells
every view of a dynamically batched program (a ``flatten`` too); XNNPACK itself infers one dim (-1).
"""

from __future__ import annotations

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as StockXnnpackPartitioner
from torch.export import Dim

import xnnguard
from tests.rewrite_support import PRECISIONS, Precision
from tests.support import lower, quant_step, run_pte, xnnpack_quantizer
from xnnguard.rewrite.forms.inferred_view import InferredViewPass

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
        tolerance = 1e-5 if precision == "float" else 2 * quant_step(reference, expected)  # type: ignore[arg-type]
        torch.testing.assert_close(run_pte(lowered.buffer, (other,))[0], expected, atol=tolerance, rtol=0)


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
