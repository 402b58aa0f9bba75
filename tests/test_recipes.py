"""xnnguard's recipes for ``executorch.export``: where the stock XNNPACK recipes make a program that fails, theirs runs.

The model has what stock ExecuTorch cannot run on XNNPACK: a Conv3d and an 8-D patchify. Each recipe
goes through ``executorch.export.export`` as a user calls it; the .pte is loaded and run with the real
runtime and compared with eager float (FP32), the converted pt2e model (int8: two quantization steps)
or torchao's quantized eager model (within that model's own error against float).
"""

from __future__ import annotations

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as StockXnnpackPartitioner
from executorch.backends.xnnpack.recipes import XNNPackRecipeType
from executorch.export import ExportRecipe, StageType, export, recipe_registry

import xnnguard
from testbed.lowered import run_pte
from testbed.tolerance import float_tolerance, int8_tolerance
from tests.support import rows_in_slow_tier
from xnnguard.example_models import VideoPatchEmbed
from xnnguard.recipes import RewriteProgram, RewritingXNNPACKQuantizer, XnnguardRecipeType
from xnnguard.report import Rule

pytestmark = pytest.mark.release_sensitive

INPUTS = (torch.randn(1, 3, 4, 16, 16, generator=torch.Generator().manual_seed(0)),)
PAIRS = [(getattr(XNNPackRecipeType, kind.name), kind) for kind in XnnguardRecipeType]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return VideoPatchEmbed().eval()


def test_the_recipe_kinds_are_the_stock_ones() -> None:
    assert [kind.name for kind in XnnguardRecipeType] == [kind.name for kind in XNNPackRecipeType]


def test_the_provider_has_its_own_name_and_the_stock_xnnpack_recipes_stay() -> None:
    assert {"xnnpack", "xnnguard"} <= set(recipe_registry.list_backends())
    stock = ExportRecipe.get_recipe(XNNPackRecipeType.FP32)
    (partitioner,) = stock.lowering_recipe.partitioners
    assert type(partitioner) is StockXnnpackPartitioner
    (guarded,) = ExportRecipe.get_recipe(XnnguardRecipeType.FP32).lowering_recipe.partitioners
    assert isinstance(guarded, xnnguard.XnnpackPartitioner)


def test_each_recipe_uses_xnnguards_rewrite_quantizer_and_partitioner() -> None:
    for kind in XnnguardRecipeType:
        recipe = ExportRecipe.get_recipe(kind)
        assert isinstance(recipe.lowering_recipe.partitioners[0], xnnguard.XnnpackPartitioner)
        quantizers = recipe.quantization_recipe.quantizers if recipe.quantization_recipe else None
        if kind.name.startswith("PT2E"):
            (quantizer,) = quantizers
            assert isinstance(quantizer, RewritingXNNPACKQuantizer) and isinstance(quantizer, xnnguard.XNNPACKQuantizer)
        else:
            assert not quantizers
            assert [type(step) for step in recipe.aten_transform_passes] == [RewriteProgram]


def test_a_parameter_a_recipe_does_not_take_is_an_error() -> None:
    with pytest.raises(TypeError, match="takes no parameters, not group_size"):
        ExportRecipe.get_recipe(XnnguardRecipeType.FP32, group_size=32)
    with pytest.raises(TypeError, match="takes only group_size, not groupsize"):
        ExportRecipe.get_recipe(XnnguardRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR, groupsize=32)
    with pytest.raises(ValueError, match="group_size must be a positive int"):
        ExportRecipe.get_recipe(XnnguardRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR, group_size="32")


def _stock_fails(kind: XNNPackRecipeType) -> None:
    """The stock recipe's program fails while lowering, at load or when run: whichever way, it fails."""
    with pytest.raises(Exception):
        session = export(_model(), [INPUTS], export_recipe=ExportRecipe.get_recipe(kind))
        buffer = session.get_pte_buffer()
        run_pte(buffer, INPUTS)


# The per-tensor rows slow (11-18 s each): their per-channel twins go through the same recipe code.
SLOW_KINDS = ("PT2E_INT8_STATIC_PER_TENSOR", "TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR")


@pytest.mark.parametrize(("stock_kind", "kind"), rows_in_slow_tier(
    PAIRS, lambda stock, kind: kind.name in SLOW_KINDS, ids=lambda stock, kind: str(kind.name)
))
def test_the_stock_recipe_fails_and_xnnguards_loads_runs_and_matches(
    stock_kind: XNNPackRecipeType, kind: XnnguardRecipeType
) -> None:
    _stock_fails(stock_kind)
    model, recipe = _model(), ExportRecipe.get_recipe(kind)
    session = export(model, [INPUTS], export_recipe=recipe)
    buffer = session.get_pte_buffer()  # held while the runtime module made from it runs
    (out,) = run_pte(buffer, INPUTS)
    artifacts = session.get_stage_artifacts()
    expected = model(*INPUTS)
    if kind is XnnguardRecipeType.FP32:
        tolerance = float_tolerance(expected)
    elif kind.name.startswith("PT2E"):
        converted = artifacts[StageType.QUANTIZE].data["forward"]
        reference = converted(*INPUTS)
        dynamic = kind is XnnguardRecipeType.PT2E_INT8_DYNAMIC_PER_CHANNEL
        tolerance = int8_tolerance(converted, reference, dynamic=dynamic, float_reference=expected)
        expected = reference
    else:
        quantized = artifacts[StageType.SOURCE_TRANSFORM].data["forward"]  # torchao's, run eagerly
        reference = quantized(*INPUTS)
        tolerance = 2 * float((reference - expected).abs().max()) + 1e-6
        expected = reference
    assert float((out - expected).abs().max()) <= tolerance
    # all of it on XNNPACK: the Conv3d and the 8-D patchify were rewritten (before pt2e: no 3-D conv left
    # for the quantizer to keep in float), nothing was left outside
    (partitioner,) = recipe.lowering_recipe.partitioners
    assert partitioner.report == []
    if kind.name.startswith("PT2E"):
        (quantizer,) = recipe.quantization_recipe.quantizers
        assert quantizer.rewrite_report == [] and quantizer.report == []
    else:
        assert recipe.aten_transform_passes[0].report == {"forward": []}
    graph = session.get_edge_program_manager().exported_program().graph_module.graph
    outside = [n for n in graph.nodes if n.op == "call_function" and "executorch_call_delegate" not in str(n.target)]
    assert all("getitem" in str(node.target) for node in outside)


class NarrowLinearHead(torch.nn.Module):
    """Two linears XNNPACK takes int4 weights for (64 and 32 inputs) and a 16-input classifier it does not."""

    def __init__(self) -> None:
        super().__init__()
        self.encode, self.hidden = torch.nn.Linear(64, 32), torch.nn.Linear(32, 16)
        self.classify = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(torch.relu(self.hidden(torch.relu(self.encode(x)))))


TORCHAO = [kind for kind in XnnguardRecipeType if kind.name.startswith("TORCHAO")]


@pytest.mark.parametrize("kind", TORCHAO, ids=[kind.name for kind in TORCHAO])
def test_a_linear_int4_weights_cannot_take_gets_int8_weights_and_a_record_and_the_rest_is_int4(
    kind: XnnguardRecipeType,
) -> None:
    torch.manual_seed(0)
    model, inputs = NarrowLinearHead().eval(), (torch.randn(2, 64),)
    recipe = ExportRecipe.get_recipe(kind)
    session = export(model, [inputs], export_recipe=recipe)
    buffer = session.get_pte_buffer()
    (out,) = run_pte(buffer, inputs)
    quantized = session.get_stage_artifacts()[StageType.SOURCE_TRANSFORM].data["forward"]
    reference, expected = quantized(*inputs), model(*inputs)
    assert float((out - reference).abs().max()) <= 2 * float((reference - expected).abs().max()) + 1e-6
    int4 = getattr(torch, "int4")  # noqa: B009  (torch's type stubs do not declare int4)
    weights = {name: layer.weight.target_dtype for name, layer in quantized.named_children()}
    assert weights == {"encode": int4, "hidden": int4, "classify": torch.int8}
    (config,) = recipe.quantization_recipe.ao_quantization_configs
    (record,) = config.ao_base_config.report
    assert record.node == "classify" and record.rule is Rule.INT4_WEIGHT_BLOCKS and "int8 weights" in record.reason
    (partitioner,) = recipe.lowering_recipe.partitioners
    assert partitioner.report == []


def test_a_group_size_xnnpack_cannot_take_int4_weights_in_is_an_error() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        ExportRecipe.get_recipe(XnnguardRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR, group_size=16)
