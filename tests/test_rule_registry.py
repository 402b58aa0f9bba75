"""The registry of rules: every decision to keep a node from XNNPACK is a registered rule, and each fires.

Each rule fires here on the node of a small real graph it exists for (exported, quantized with pt2e and
taken to the edge dialect where the rule is about int8 or edge ops), asked the way the partitioner asks
it. Where the partitioner then keeps the node out is specified in the partitioner's own tests.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer as StockQuantizer,
    get_symmetric_quantization_config,
)
from executorch.exir import to_edge
from torch import nn

from testbed.quantize import quantize_pt2e
from tests.test_partitioner_int8 import ConvPermuteConv, OwnPermuteQuantization, TwoConvs
from xnnguard.example_models import PermuteAdd
from xnnguard.graph.ops import is_op
from xnnguard.report import Rule
from xnnguard.rules import registry
from xnnguard.rules.rule import Context, Effect, RuleCheck, Scope
from xnnguard.rules.tagged import tag

pytestmark = pytest.mark.release_sensitive

Example = Callable[[], tuple[torch.fx.Node, Context]]


def _exported(model: nn.Module, *inputs: torch.Tensor) -> torch.fx.Graph:
    return torch.export.export(model.eval(), inputs).graph


def _edge(model: nn.Module, x: torch.Tensor, quantizer: object | None = None) -> torch.fx.Graph:
    module = quantize_pt2e(model, (x,), quantizer) if quantizer is not None else model.eval()
    return to_edge(torch.export.export(module, (x,))).exported_program().graph


def _node(graph: torch.fx.Graph, name: str, occurrence: int = 0) -> torch.fx.Node:
    return [node for node in graph.nodes if is_op(node, name)][occurrence]


def _static() -> object:
    return StockQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))


def _dynamic() -> object:
    return StockQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))


class _Lambda(nn.Module):
    def __init__(self, forward: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.body = forward

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.body(*inputs)


def _high_rank() -> tuple[torch.fx.Node, Context]:
    model = PermuteAdd(rank=7)
    return _node(_exported(model, *model.example_inputs()), "permute"), Context()


def _conv3d() -> tuple[torch.fx.Node, Context]:
    return _node(_exported(nn.Conv3d(3, 4, 3), torch.randn(1, 3, 4, 8, 8)), "conv3d"), Context()


def _max_reduction() -> tuple[torch.fx.Node, Context]:
    graph = _exported(_Lambda(lambda x: torch.max(x, dim=1)[0]), torch.randn(1, 4, 8, 8))
    return _node(graph, "max"), Context()


def _prelu_rank() -> tuple[torch.fx.Node, Context]:
    return _node(_exported(nn.PReLU(3), torch.randn(1, 3, 2, 4, 5)), "prelu"), Context()


def _tanh_gelu() -> tuple[torch.fx.Node, Context]:
    graph = _edge(_Lambda(lambda x: F.gelu(x, approximate="tanh")), torch.randn(2, 8))
    return _node(graph, "gelu"), Context()


def _bfloat16() -> tuple[torch.fx.Node, Context]:
    conv = nn.Conv2d(3, 4, 3).bfloat16()
    return _node(_exported(conv, torch.randn(1, 3, 8, 8).bfloat16()), "conv2d"), Context()


def _user_tag() -> tuple[torch.fx.Node, Context]:
    node = _node(_exported(_Lambda(lambda x: x + 1), torch.randn(4)), "add")
    tag(node, "kept on the portable kernels on purpose")
    return node, Context()


def _passthrough_output() -> tuple[torch.fx.Node, Context]:
    round_trip = _Lambda(lambda x: x.to(memory_format=torch.channels_last).to(memory_format=torch.contiguous_format))
    graph = _edge(round_trip, torch.randn(1, 4, 8, 8))
    there, back = _node(graph, "_to_dim_order_copy"), _node(graph, "_to_dim_order_copy", 1)
    return back, Context(partition={there, back})


def _quantized_pad() -> tuple[torch.fx.Node, Context]:
    conv = nn.Conv2d(4, 8, 1)
    graph = _edge(_Lambda(lambda x: torch.relu(F.pad(conv(x), (0, 1, 0, 1)))), torch.randn(1, 4, 8, 8), _static())
    return _node(graph, "constant_pad_nd"), Context(implicit=())  # its dequantize is not in the match


def _dynamic_conv_source() -> tuple[torch.fx.Node, Context]:
    graph = _edge(TwoConvs("add"), torch.randn(1, 4, 8, 8), _dynamic())
    return _node(graph, "convolution", 1), Context()


def _dynamic_linear_layout() -> tuple[torch.fx.Node, Context]:
    model = nn.Sequential(nn.AvgPool2d(2), nn.Linear(4, 8))
    graph = _edge(model, torch.randn(1, 4, 8, 8), _dynamic())
    return _node(graph, "addmm"), Context()  # to_edge decomposed the linear: view, then addmm


def _quantization_match() -> tuple[torch.fx.Node, Context]:
    graph = _edge(ConvPermuteConv(), torch.randn(1, 4, 16, 16), OwnPermuteQuantization().set_global(
        get_symmetric_quantization_config(is_per_channel=True)))
    permute = _node(graph, "permute_copy")
    return permute, Context(implicit={*permute.all_input_nodes, *permute.users})


def _no_equivalent() -> tuple[torch.fx.Node, Context]:
    graph = _exported(_Lambda(lambda x, index: x[index]), torch.randn(8, 4), torch.tensor([3, 1]))
    return _node(graph, "index"), Context()


EXAMPLES: dict[Rule, Example] = {
    Rule.HIGH_RANK: _high_rank,
    Rule.CONV3D: _conv3d,
    Rule.MAX_REDUCTION: _max_reduction,
    Rule.PRELU_RANK: _prelu_rank,
    Rule.TANH_GELU: _tanh_gelu,
    Rule.BFLOAT16: _bfloat16,
    Rule.USER_TAG: _user_tag,
    Rule.PASSTHROUGH_OUTPUT: _passthrough_output,
    Rule.QUANTIZED_PAD: _quantized_pad,
    Rule.DYNAMIC_CONV_SOURCE: _dynamic_conv_source,
    Rule.DYNAMIC_LINEAR_LAYOUT: _dynamic_linear_layout,
    Rule.QUANTIZATION_MATCH: _quantization_match,
    Rule.NO_XNNPACK_EQUIVALENT: _no_equivalent,
}


def test_every_rule_member_is_a_registered_rule_or_a_record_named_elsewhere() -> None:
    registered = [rule.rule for rule in registry.RULES]
    assert len(registered) == len(set(registered)), "a rule is registered twice"
    assert set(registered).isdisjoint(registry.OTHER_RECORDS)
    assert set(registered) | set(registry.OTHER_RECORDS) == set(Rule)


@pytest.mark.parametrize("rule", registry.RULES, ids=lambda rule: rule.rule.value)
def test_each_registered_rule_lives_in_its_own_rules_module_and_says_what_it_decides(rule: RuleCheck) -> None:
    module = rule.check.__module__
    assert module.startswith("xnnguard.rules.") and module not in ("xnnguard.rules.registry", "xnnguard.rules.rule")
    assert [other for other in registry.RULES if other.check.__module__ == module] == [rule]
    assert rule.decides.strip()


def test_every_registered_rule_has_an_example_that_makes_it_fire() -> None:
    assert set(EXAMPLES) == {rule.rule for rule in registry.RULES}


@pytest.mark.parametrize("rule", registry.RULES, ids=lambda rule: rule.rule.value)
def test_each_registered_rule_fires_on_its_example(rule: RuleCheck) -> None:
    node, context = EXAMPLES[rule.rule]()
    record = rule.record(node, context)
    assert record is not None and record.rule is rule.rule and record.node == node.name and record.reason


@pytest.mark.parametrize("rule", registry.RULES, ids=lambda rule: rule.rule.value)
def test_no_registered_rule_fires_on_a_plain_add(rule: RuleCheck) -> None:
    node = _node(_exported(_Lambda(lambda x: x + 1), torch.randn(1, 4, 8, 8)), "add")
    assert rule.record(node, Context(partition={node})) is None


def test_the_first_registered_rule_that_fires_is_the_reason() -> None:
    node, _ = _conv3d()
    tag(node, "mine")
    record = registry.first_record(node, Scope.NODE)
    assert record is not None and record.rule is Rule.CONV3D  # conv3d comes before the tag


def test_a_tag_set_by_a_rule_is_reported_as_that_rule() -> None:
    node = _node(_exported(_Lambda(lambda x: x + 1), torch.randn(4)), "add")
    tag(node, "output has 8 dims > 6", Rule.HIGH_RANK)
    record = registry.first_record(node, Scope.NODE)
    assert record is not None and record.rule is Rule.HIGH_RANK


def test_only_the_quantization_match_rule_takes_a_match_as_float() -> None:
    assert [rule.rule for rule in registry.rules(Scope.MATCH, effect=Effect.TAKE_AS_FLOAT)] == [
        Rule.QUANTIZATION_MATCH
    ]
