"""``xnnguard.XNNPACKQuantizer``: 3-D convolutions stay float, everything else is quantized as by ExecuTorch's.

Every test quantizes a real model with torchao's pt2e flow and reads the converted graph (or the lowered
program): which quantize/dequantize ops exist, and how each convolution's input, weight and output are
quantized.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest
import torch
from executorch.backends.xnnpack.quantizer import xnnpack_quantizer_utils
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer as StockXNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from torch import nn
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e
from torchao.quantization.pt2e.quantizer import ComposableQuantizer

from testbed.flow import lower_and_run
from testbed.lowered import lower, run_pte
from testbed.quantize import quantize_pt2e
from xnnguard import XnnpackPartitioner, rewrite_for_xnnpack
from xnnguard.quantizer import QuantizedConv3dError, XNNPACKQuantizer
from xnnguard.report import Rule

pytestmark = pytest.mark.release_sensitive

INPUT_3D = (1, 2, 5, 6, 6)
INPUT_2D = (1, 2, 6, 6)


class ConvReluConvTranspose(torch.nn.Module):
    """Conv + ReLU, then a transposed conv: the 3-D model, or its 2-D twin."""

    def __init__(self, dims: int, batch_norm: bool = False) -> None:
        super().__init__()
        conv = {2: torch.nn.Conv2d, 3: torch.nn.Conv3d}[dims]
        norm = {2: torch.nn.BatchNorm2d, 3: torch.nn.BatchNorm3d}[dims]
        transpose = {2: torch.nn.ConvTranspose2d, 3: torch.nn.ConvTranspose3d}[dims]
        self.conv = conv(2, 4, 3)
        self.norm = norm(4) if batch_norm else torch.nn.Identity()
        self.relu = torch.nn.ReLU()
        self.transpose = transpose(4, 2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.transpose(self.relu(self.norm(self.conv(x))))


class TransposedConvs(torch.nn.Module):
    """One transposed convolution of each rank, side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.t1 = torch.nn.ConvTranspose1d(2, 3, 2)
        self.t2 = torch.nn.ConvTranspose2d(2, 3, 2)
        self.t3 = torch.nn.ConvTranspose3d(2, 3, 2)

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.t1(a), self.t2(b), self.t3(c)


class Conv3dThenLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(2, 2, 3)
        self.linear = torch.nn.Linear(2 * 3 * 4 * 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.conv(x).flatten(1))


class CatOf3dAnd2dConvs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv3d = torch.nn.Conv3d(2, 2, (1, 3, 3))
        self.conv2d = torch.nn.Conv2d(2, 4, 3)

    def forward(self, video: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.conv3d(video).flatten(1, 2), self.conv2d(image)], 1)


def _config(**kwargs: Any) -> Any:
    return get_symmetric_quantization_config(**kwargs)


def _inputs(*shape: int) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return (torch.randn(*shape),)


def _is_op(node: object, name: str) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and f".{name}." in f".{node.target}."


def _quantization_ops(gm: torch.fx.GraphModule) -> Counter[str]:
    """Every quantize/dequantize/choose_qparams op, by name without overload."""
    names = (str(node.target).split(".") for node in gm.graph.nodes if node.op == "call_function")
    return Counter(parts[1] for parts in names if parts[0] == "quantized_decomposed")


def _weight_scheme(node: torch.fx.Node) -> str:
    weight = node.args[1]
    if _is_op(weight, "dequantize_per_channel"):
        return "per-channel"
    if _is_op(weight, "dequantize_per_tensor"):
        return "per-tensor"
    return "float"


def _quantization_state(gm: torch.fx.GraphModule, *ops: str) -> dict[str, tuple[str, str, str]]:
    """(input, weight, output) of each ``ops`` node: "int8" or "float", and the weight's scheme."""
    states = {}
    for node in gm.graph.nodes:
        parts = str(node.target).split(".") if node.op == "call_function" else []
        name = parts[1] if len(parts) == 3 else ""
        if name in ops:
            activation = "int8" if _is_op(node.args[0], "dequantize_per_tensor") else "float"
            quantized_users = [user for user in node.users if _is_op(user, "quantize_per_tensor")]
            output = "int8" if quantized_users else "float"
            states[name] = (activation, _weight_scheme(node), output)
    return states


def _output_step(converted: torch.fx.GraphModule) -> float:
    """The quantization step of the model's output (the scale of its last dequantize)."""
    output = next(node for node in converted.graph.nodes if node.op == "output")
    dequantize = output.args[0][0]
    assert _is_op(dequantize, "dequantize_per_tensor"), "the 2-D model's output should be quantized"
    return float(dequantize.args[1])


@pytest.mark.parametrize(
    ("per_channel", "quantized_2d"),
    [
        (True, {"quantize_per_tensor": 3, "dequantize_per_tensor": 3, "dequantize_per_channel": 2}),
        (False, {"quantize_per_tensor": 3, "dequantize_per_tensor": 5}),
    ],
    ids=["per-channel", "per-tensor"],
)
def test_3d_convolutions_stay_float_while_their_2d_twins_are_quantized(
    per_channel: bool, quantized_2d: dict[str, int]
) -> None:
    # 2-D: input, ReLU output and model output quantized; one weight dequantize per conv (its quantize is
    # folded into the int8 weight). 3-D: nothing at all.
    counts = {}
    for dims, shape in ((2, INPUT_2D), (3, INPUT_3D)):
        quantizer = XNNPACKQuantizer().set_global(_config(is_per_channel=per_channel))
        converted = quantize_pt2e(ConvReluConvTranspose(dims), _inputs(*shape), quantizer)
        counts[dims] = dict(_quantization_ops(converted))
    assert counts == {2: quantized_2d, 3: {}}


# Slow (20-40 s of torchao's QAT tracing, twice in CI): the 3-D conv staying float is checked in PTQ above, and
# QAT's annotation goes through the same filter (XNNPACKQuantizer.config_filter).
@pytest.mark.slow
def test_a_3d_convolution_with_batch_norm_and_relu_stays_float_in_qat() -> None:
    # In QAT the batch norm is not folded before annotation; 1.5.1 quantizes such a conv3d on its own.
    inputs = _inputs(*INPUT_3D)
    model = torch.export.export(ConvReluConvTranspose(3, batch_norm=True).train(), inputs).module()
    quantizer = XNNPACKQuantizer().set_global(_config(is_per_channel=True, is_qat=True))
    prepared = prepare_qat_pt2e(model, quantizer)
    prepared(*inputs)
    assert _quantization_ops(convert_pt2e(prepared)) == Counter()


class _PatternTraces:
    """Calls through to the stock pattern tracer, counting them: the conv + batch norm patterns are traced there."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self._trace = xnnpack_quantizer_utils._get_aten_graph_module_for_pattern
        monkeypatch.setattr(xnnpack_quantizer_utils, "_get_aten_graph_module_for_pattern", self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.count += 1
        return self._trace(*args, **kwargs)


def test_a_model_without_batch_norm_is_annotated_as_the_stock_quantizer_does_without_tracing_its_patterns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, inputs = ConvReluConvTranspose(2), _inputs(*INPUT_2D)
    stock = quantize_pt2e(model, inputs, StockXNNPACKQuantizer().set_global(_config()))
    traces = _PatternTraces(monkeypatch)
    quantizer = XNNPACKQuantizer().set_global(_config())
    ours = quantize_pt2e(model, inputs, quantizer)
    assert traces.count == 0
    assert ours.code == stock.code
    assert "SUPPORTED_PATTERNS" not in vars(quantizer)  # the stock list is the quantizer's again


def test_a_model_with_batch_norm_is_matched_against_the_conv_batch_norm_patterns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a batch norm no conv precedes: prepare_pt2e folds one that follows a conv before annotating
    inputs = _inputs(*INPUT_2D)
    alone = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.ReLU(), torch.nn.BatchNorm2d(4)).eval()
    model = torch.export.export(alone, inputs).module()
    traces = _PatternTraces(monkeypatch)
    prepare_pt2e(model, XNNPACKQuantizer().set_global(_config()))  # no convert: its conv-bn fold is torchao's
    assert traces.count > 0


@pytest.mark.parametrize(
    ("dynamic", "linear_state"),
    [(False, ("int8", "per-channel", "int8")), (True, ("int8", "per-channel", "float"))],
    ids=["static", "dynamic"],
)
def test_the_neighbour_of_a_3d_convolution_is_quantized_as_next_to_any_float_op(
    dynamic: bool, linear_state: tuple[str, str, str]
) -> None:
    quantizer = XNNPACKQuantizer().set_global(_config(is_per_channel=True, is_dynamic=dynamic))
    converted = quantize_pt2e(Conv3dThenLinear(), _inputs(*INPUT_3D), quantizer)
    assert _quantization_state(converted, "conv3d", "linear") == {
        "conv3d": ("float", "float", "float"),
        "linear": linear_state,
    }


def test_a_cat_fed_by_a_3d_convolution_shares_the_qparams_of_its_quantized_input() -> None:
    # 1.5.1's cat takes its qparams from the first input whose producer is quantized: with the 3-D
    # convolution float, that is the 2-D one, and the 3-D one's edge into the cat is quantized with them.
    torch.manual_seed(0)
    inputs = (torch.randn(1, 2, 2, 6, 6), torch.randn(1, 2, 6, 6))
    quantizer = XNNPACKQuantizer().set_global(_config(is_per_channel=True))
    converted = quantize_pt2e(CatOf3dAnd2dConvs(), inputs, quantizer)
    assert _quantization_state(converted, "conv3d", "conv2d") == {
        "conv3d": ("float", "float", "float"),
        "conv2d": ("int8", "per-channel", "int8"),
    }
    cat = next(node for node in converted.graph.nodes if _is_op(node, "cat"))
    (conv2d_quantize,) = next(node for node in converted.graph.nodes if _is_op(node, "conv2d")).users
    assert all(_is_op(arg, "dequantize_per_tensor") for arg in cat.args[0])
    assert {arg.args[1] for arg in cat.args[0]} == {conv2d_quantize.args[1]}


@pytest.mark.parametrize(
    ("global_config", "expected_2d"),
    [
        (_config(is_per_channel=False), ("int8", "per-tensor", "int8")),
        (None, ("float", "float", "float")),
    ],
    ids=["global-per-tensor", "no-global"],
)
def test_set_operator_type_conv_transpose3d_leaves_1d_and_2d_transposed_convs_as_they_were(
    global_config: Any, expected_2d: tuple[str, str, str]
) -> None:
    quantizer = XNNPACKQuantizer()
    if global_config is not None:
        quantizer.set_global(global_config)
    quantizer.set_operator_type(torch.ops.aten.conv_transpose3d.input, _config(is_per_channel=True))
    torch.manual_seed(0)
    inputs = (torch.randn(1, 2, 8), torch.randn(1, 2, 6, 6), torch.randn(1, 2, 3, 4, 4))
    converted = quantize_pt2e(TransposedConvs(), inputs, quantizer)
    assert _quantization_state(converted, "conv_transpose1d", "conv_transpose2d", "conv_transpose3d") == {
        "conv_transpose1d": expected_2d,
        "conv_transpose2d": expected_2d,
        "conv_transpose3d": ("float", "float", "float"),
    }


def test_set_operator_type_for_a_3d_convolution_warns_that_it_has_no_effect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="xnnguard"):
        XNNPACKQuantizer().set_operator_type(torch.ops.aten.conv3d.default, _config())
    assert [r.name for r in caplog.records] == ["xnnguard.quantizer"]
    assert "has no effect: 3-D convolutions stay float" in caplog.records[0].getMessage()


def test_left_in_float_names_each_3d_convolution_and_annotate_logs_one_info_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inputs = _inputs(*INPUT_3D)
    quantizer = XNNPACKQuantizer().set_global(_config(is_per_channel=True))
    with caplog.at_level(logging.INFO, logger="xnnguard"):
        prepare_pt2e(torch.export.export(ConvReluConvTranspose(3), inputs).module(), quantizer)
    assert [str(record) for record in quantizer.left_in_float] == [
        "conv3d (aten.conv3d.default): conv3d at node conv3d left in float: XNNPACK has no 3-D convolution",
        "conv_transpose3d (aten.conv_transpose3d.input): conv_transpose3d at node conv_transpose3d left in float: "
        "XNNPACK has no 3-D convolution",
    ]
    assert {record.rule for record in quantizer.left_in_float} == {Rule.CONV3D}
    assert [r.getMessage() for r in caplog.records if r.name.startswith("xnnguard")] == [
        "xnnguard: 2 3-D convolutions left in float (conv3d, conv_transpose3d)"
    ]


def test_annotate_refuses_a_3d_convolution_that_an_earlier_quantizer_annotated() -> None:
    inputs = _inputs(*INPUT_3D)
    stock = StockXNNPACKQuantizer().set_global(_config())
    guarded = XNNPACKQuantizer().set_global(_config())
    model = torch.export.export(ConvReluConvTranspose(3), inputs).module()
    with pytest.raises(QuantizedConv3dError, match=r"conv3d \(aten\.conv3d\.default\) is annotated for quantization"):
        prepare_pt2e(model, ComposableQuantizer([stock, guarded]))


def test_the_2d_twin_lowers_into_one_xnnpack_delegate_and_matches_the_converted_model() -> None:
    inputs = _inputs(*INPUT_2D)
    quantizer = XNNPACKQuantizer().set_global(_config(is_per_channel=True))
    converted = quantize_pt2e(ConvReluConvTranspose(2), inputs, quantizer)
    lowered = lower(torch.export.export(converted, inputs), inputs, XnnpackPartitioner())
    assert lowered.outside_ops() == Counter()
    assert lowered.num_delegates == 1
    (actual,) = run_pte(lowered.buffer, inputs)
    expected = converted(*inputs)
    torch.testing.assert_close(actual, expected, rtol=0, atol=2 * _output_step(converted))


def test_the_3d_program_has_no_quantize_or_dequantize_around_its_convolutions() -> None:
    # 1.5.1's portable kernels cannot run a 3-D convolution, so the program's structure is the spec.
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    inputs = _inputs(*INPUT_3D)
    quantizer = XNNPACKQuantizer().set_global(_config(is_per_channel=True))
    converted = quantize_pt2e(ConvReluConvTranspose(3), inputs, quantizer)
    lowered = lower(torch.export.export(converted, inputs), inputs, XnnpackPartitioner())
    every_op = lowered.outside_ops() + lowered.delegated_ops()
    assert lowered.outside_ops()["convolution"] == 2
    assert sorted(op for op in every_op if "quantize" in op or "choose_qparams" in op) == []
    _load_for_executorch_from_buffer(lowered.buffer)


class OneChannelUpsampler(nn.Module):
    """Fuzz seed 179: a ConvTranspose3d of one input channel, which ``rewrite_for_xnnpack`` writes as a 2-D
    transposed conv of one input channel (depthwise to XNNPACK, which runs none dynamically quantized)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose3d(1, 8, kernel_size=(1, 3, 3), stride=(1, 1, 2), dilation=(1, 2, 1))
        self.pool = nn.AdaptiveMaxPool3d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.up(x))  # no ReLU: the conv alone is the pattern a dynamic config annotates


def test_a_conv_xnnpack_runs_no_dynamically_quantized_stays_float_on_xnnpack_with_a_record() -> None:
    """The quantizer quantized it dynamically all the same, and 1.5.1's conv config then refused it: the conv
    and its q/dq ran on portable kernels between two delegates."""
    torch.manual_seed(179)
    model, x = OneChannelUpsampler().eval(), torch.randn(1, 1, 1, 10, 6)
    run = lower_and_run(model, (x,), "dynamic int8")
    assert run.lowered.num_delegates == 1 and run.lowered.outside_ops() == {}, run.lowered.outside_ops()
    run.assert_matches()
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))
    prepare_pt2e(rewrite_for_xnnpack(torch.export.export(model, (x,))).module(), quantizer)  # annotates
    assert {record.rule for record in quantizer.report} == {Rule.DYNAMIC_CONV_KIND}, quantizer.report


def test_a_conv_left_float_without_a_dynamic_config_gets_no_dynamic_conv_record() -> None:
    """The record says a dynamic config reached the conv; with none given nothing is quantized, and a
    depthwise conv is no exception to report."""
    quantizer = XNNPACKQuantizer()  # no config: nothing is quantized
    depthwise = torch.nn.Conv2d(4, 4, 3, groups=4).eval()
    prepare_pt2e(torch.export.export(depthwise, (torch.randn(1, 4, 6, 6),)).module(), quantizer)  # annotates
    assert quantizer.report == []
