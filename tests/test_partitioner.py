"""xnnguard.XnnpackPartitioner: what it delegates, what it keeps out, and that the programs run right.

Every test lowers a real model with ExecuTorch 1.5.1, runs the .pte with the real runtime and compares
with eager PyTorch (quantized: with the converted pt2e model, within two quantization steps).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from executorch.backends.xnnpack.utils.quant_utils import is_tagged_as_implicit_q_dq

import xnnguard
from testbed.flow import lower_and_run
from testbed.lowered import Lowered, lower
from testbed.quantize import Precision, quantize_pt2e, xnnpack_quantizer
from xnnguard.example_models import (
    Conv2dReLU,
    Conv3dReLU,
    ConvTranspose3dModel,
    HighRankLinear,
    LinearModel,
    Patchify,
    PermuteAdd,
)
from xnnguard.report import Rule

pytestmark = pytest.mark.release_sensitive

QDQ = {"quantize_per_tensor", "dequantize_per_tensor", "dequantize_per_channel"}


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _lower_and_compare(model: torch.nn.Module, inputs: tuple, **lower_args: Any) -> Lowered:
    """No rewrite (the partitioner alone), xnnguard's partitioner unless given; the program matches eager."""
    run = lower_and_run(model, inputs, rewrite=False, **lower_args)
    run.assert_matches()
    return run.lowered


def _lower_quantized_and_compare(model: torch.nn.Module, inputs: tuple, quantizer: Any, precision: Precision,
                                 **lower_args: Any) -> Lowered:
    """The same in int8 with ``quantizer``: the program matches the converted model."""
    run = lower_and_run(model, inputs, precision, rewrite=False, quantizer=quantizer, **lower_args)
    run.assert_matches()
    return run.lowered


def _implicit_qdq_without_their_op(lowered: Lowered) -> list[str]:
    """Delegated q/dq marked implicit whose op (a neighbour that is not a q/dq) is not in the delegate."""
    orphans = []
    for node in lowered.delegated_nodes:
        if not is_tagged_as_implicit_q_dq(node):
            continue
        neighbours = [n for n in (*node.all_input_nodes, *node.users) if n.op == "call_function"]
        if not any(n.graph is node.graph and "quantize" not in str(n.target) for n in neighbours):
            orphans.append(node.name)
    return orphans


# --- tensors above 6 dims -------------------------------------------------------------------------------


def test_a_6d_permute_is_delegated() -> None:
    model = PermuteAdd(6)
    lowered = _lower_and_compare(model, model.example_inputs())
    assert lowered.delegated_ops()["permute_copy"] == 1
    assert "permute_copy" not in lowered.outside_ops()


def test_a_7d_permute_stays_outside_xnnpack_and_runs() -> None:
    model = PermuteAdd(7)
    lowered = _lower_and_compare(model, model.example_inputs())
    assert lowered.outside_ops()["permute_copy"] == 1
    assert lowered.outside_ops()["add"] == 1
    assert lowered.delegated_ops() == {}


@pytest.mark.parametrize("via_to_backend", [False, True], ids=["transform_and_lower", "to_backend"])
def test_patchify_runs_with_its_8d_permute_outside_and_its_3d_multiply_delegated(via_to_backend: bool) -> None:
    model = Patchify()
    lowered = _lower_and_compare(model, model.example_inputs(), via_to_backend=via_to_backend)
    assert lowered.outside_ops()["permute_copy"] == 1
    assert lowered.delegated_ops()["mul"] == 1


class _Elementwise8d(torch.nn.Module):
    def __init__(self, op: str) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.op == "add":
            return x + y
        if self.op == "mul":
            return x * y
        if self.op == "relu":
            return torch.relu(x)
        if self.op == "softmax":
            return torch.softmax(x, dim=-1)
        return torch.cat([x, y], dim=3)


@pytest.mark.parametrize("op", ["add", "mul", "relu", "softmax", "cat"])
def test_an_8d_elementwise_op_stays_outside_xnnpack_and_runs(op: str) -> None:
    x, y = torch.randn(2, 1, 2, 3, 1, 2, 2, 4), torch.randn(2, 1, 2, 3, 1, 2, 2, 4)
    lowered = _lower_and_compare(_Elementwise8d(op), (x, y))
    assert lowered.delegated_ops() == {}


@pytest.mark.parametrize("via_to_backend", [False, True], ids=["transform_and_lower", "to_backend"])
@pytest.mark.parametrize("force_flag", [False, True], ids=["static_weights", "force_non_static_weights"])
def test_a_float_linear_on_an_8d_input_keeps_its_matmul_on_xnnpack(via_to_backend: bool, force_flag: bool) -> None:
    model = HighRankLinear()
    partitioner = xnnguard.XnnpackPartitioner(force_non_static_weights_for_f32_linear=force_flag)
    lowered = _lower_and_compare(model, model.example_inputs(), partitioner=partitioner, via_to_backend=via_to_backend)
    delegated = lowered.delegated_ops()
    assert delegated["addmm"] + delegated["mm"] + delegated["linear"] == 1
    assert lowered.outside_ops()["view_copy"] == 2  # 8-D -> 2-D and back: outside, with the 8-D tensors


def test_a_relu_after_an_8d_linear_runs_outside_while_the_matmul_stays_delegated() -> None:
    model = LinearModel(relu=True)
    lowered = _lower_and_compare(model, HighRankLinear.example_inputs())
    assert lowered.outside_ops()["relu"] == 1
    assert lowered.delegated_ops()["addmm"] + lowered.delegated_ops()["linear"] == 1


def test_a_relu_after_a_linear_is_fused_when_it_fits_in_6_dims() -> None:
    model = LinearModel(relu=True)
    lowered = _lower_and_compare(model, (torch.randn(2, 3, 2, 16),))
    assert lowered.outside_ops() == {}
    assert lowered.delegated_ops()["relu"] == 1


@pytest.mark.parametrize("via_to_backend", [False, True], ids=["transform_and_lower", "to_backend"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static_int8", "dynamic_int8"])
def test_a_quantized_linear_on_an_8d_input_runs_outside_xnnpack_correctly(dynamic: bool, via_to_backend: bool) -> None:
    model, inputs = HighRankLinear(), HighRankLinear.example_inputs()
    quantizer = xnnpack_quantizer(per_channel=True, dynamic=dynamic)
    precision: Precision = "dynamic int8" if dynamic else "static int8"
    lowered = _lower_quantized_and_compare(model, inputs, quantizer, precision, via_to_backend=via_to_backend)
    assert lowered.outside_ops()["addmm"] == 1
    assert "addmm" not in lowered.delegated_ops()


# --- quantize/dequantize marked implicit only with their op ------------------------------------------------


def test_a_quantized_conv2d_with_a_float_output_matches_the_converted_model() -> None:
    model, inputs = Conv2dReLU(relu=False), Conv2dReLU.example_inputs()
    quantizer = xnnpack_quantizer(per_channel=False, float_output=True)
    lowered = _lower_quantized_and_compare(model, inputs, quantizer, "static int8")
    assert lowered.outside_ops()["convolution"] == 1
    assert _implicit_qdq_without_their_op(lowered) == []


def test_a_quantized_linear_with_a_float_output_loads_and_matches() -> None:
    model, inputs = LinearModel(), (torch.randn(4, 16),)
    quantizer = xnnpack_quantizer(per_channel=False, float_output=True)
    lowered = _lower_quantized_and_compare(model, inputs, quantizer, "static int8")
    assert _implicit_qdq_without_their_op(lowered) == []


@pytest.mark.parametrize("model_cls", [Conv3dReLU, ConvTranspose3dModel], ids=["conv3d_relu", "conv_transpose3d"])
def test_a_static_int8_3d_convolution_keeps_its_qdq_as_real_ops_and_the_conv_outside(model_cls: type) -> None:
    # 1.5.1's portable convolution cannot run 3-D, so this checks the program's structure (the rewrite
    # passes make these models run).
    model, inputs = model_cls(), model_cls.example_inputs()
    converted = quantize_pt2e(model, inputs, xnnpack_quantizer(per_channel=False))
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = lower(torch.export.export(converted, inputs), inputs, partitioner)
    assert lowered.outside_ops()["convolution"] == 1
    assert "convolution" not in lowered.delegated_ops()
    assert _implicit_qdq_without_their_op(lowered) == []
    assert [r.rule for r in partitioner.kept_out] == [Rule.CONV3D]


def test_a_fully_quantized_conv2d_is_still_one_delegate_with_its_qdq_folded() -> None:
    model, inputs = Conv2dReLU(), Conv2dReLU.example_inputs()
    lowered = _lower_quantized_and_compare(model, inputs, xnnpack_quantizer(per_channel=True), "static int8")
    assert lowered.num_delegates == 1
    assert lowered.delegated_ops()["convolution"] == 1
    assert set(lowered.outside_ops()) <= {"quantize_per_tensor", "dequantize_per_tensor"}


# --- force_non_static_weights_for_f32_linear is about float linears ---------------------------------------


@pytest.mark.parametrize("dynamic", [False, True], ids=["static_int8", "dynamic_int8"])
def test_the_force_flag_does_not_change_how_a_quantized_linear_is_partitioned(dynamic: bool) -> None:
    model, inputs = LinearModel(), (torch.randn(4, 16),)
    precision: Precision = "dynamic int8" if dynamic else "static int8"
    plain = _lower_quantized_and_compare(
        model, inputs, xnnpack_quantizer(per_channel=True, dynamic=dynamic), precision, via_to_backend=True
    )
    forced = _lower_quantized_and_compare(
        model,
        inputs,
        xnnpack_quantizer(per_channel=True, dynamic=dynamic),
        precision,
        partitioner=xnnguard.XnnpackPartitioner(force_non_static_weights_for_f32_linear=True),
        via_to_backend=True,
    )
    assert forced.delegated_ops() == plain.delegated_ops()
    assert forced.delegated_ops()["dequantize_per_channel"] == 1  # the weight stays quantized


# --- the report ---------------------------------------------------------------------------------------------


def test_the_report_names_each_kept_out_node_with_its_op_and_reason() -> None:
    model = PermuteAdd(7)
    partitioner = xnnguard.XnnpackPartitioner()
    lower(model, model.example_inputs(), partitioner)
    records = {r.node: r for r in partitioner.kept_out}
    assert set(records) == {"aten_permute_copy_default", "aten_add_tensor"}
    permute = records["aten_permute_copy_default"]
    assert permute.op == "aten.permute_copy.default"
    assert permute.rule is Rule.HIGH_RANK
    assert permute.reason == "output has 7 dims > 6"


def test_a_one_line_summary_is_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    model = PermuteAdd(7)
    with caplog.at_level(logging.INFO, logger="xnnguard"):
        lower(model, model.example_inputs(), xnnguard.XnnpackPartitioner())
    lines = [r.getMessage() for r in caplog.records if r.name == "xnnguard"]
    assert lines == ["xnnguard: 2 nodes kept out of XNNPACK: 2 high_rank; 0 nodes delegated in 0 partitions"]


def _tag_relus(gm: torch.fx.GraphModule):
    from torch.fx.passes.infra.pass_base import PassResult

    for node in gm.graph.nodes:
        if "relu" in str(node.target):
            node.meta[xnnguard.DO_NOT_DELEGATE] = "profiling"
    return PassResult(gm, True)


def test_a_node_the_user_tags_is_never_delegated() -> None:
    model = Conv2dReLU()
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = _lower_and_compare(model, Conv2dReLU.example_inputs(), partitioner=partitioner,
                                 transform_passes=[_tag_relus])
    assert lowered.outside_ops()["relu"] == 1
    assert lowered.delegated_ops()["convolution"] == 1
    assert [(r.rule, r.reason) for r in partitioner.kept_out] == [(Rule.USER_TAG, "tagged by user: profiling")]


def test_the_tag_passes_work_as_transform_passes() -> None:
    model = Patchify()
    _lower_and_compare(
        model, model.example_inputs(), transform_passes=[xnnguard.TagHighRankPass(), xnnguard.TagConv3dPass()]
    )


def test_it_takes_the_stock_constructor_arguments() -> None:
    from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType

    model = Patchify()
    partitioner = xnnguard.XnnpackPartitioner(
        config_precisions=ConfigPrecisionType.FP32, per_op_mode=True, verbose=False
    )
    lowered = _lower_and_compare(model, model.example_inputs(), partitioner=partitioner)
    assert lowered.outside_ops()["permute_copy"] == 1
