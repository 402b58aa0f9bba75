"""Each define-, create- and reshape-time check on a real program with one field changed.

For every check: the program ExecuTorch 1.5.1 lowered passes it, the same program with one field of its
XNNPACK graph changed fails it (the check itself finds it, and ``verify_pte`` reports its kind), and the
real runtime agrees: it fails to load the program, fails its first run, or (for undefined behaviour the
runtime does not detect) at least does not contradict the check by being part of a different outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.mutation import RuntimeSandbox, edit, node_value
from tests.runtime_check_corpus import ON_ONE_WORKER, program
from xnnguard.runtime_check import verify_pte
from xnnguard.runtime_check.define_checks import (
    DEFINE_CHECKS,
    RESHAPES,
    check_argument_bindings,
    check_node_type_is_defined,
    check_required_ids,
    data_movement as moves,
    elementwise,
    gemm,
    pooling,
    values,
)
from xnnguard.runtime_check.define_checks.base import Finding, NodeView
from xnnguard.runtime_check.define_checks.quant_params import check_quantization_parameters_match
from xnnguard.runtime_check.pte_reader import read_methods
from xnnguard.runtime_check.xnnpack_blob import XNNPACK_BACKEND_ID, read_xnnpack_blob

pytestmark = ON_ONE_WORKER

NO_VALUE = 0xFFFFFFFF
FP16, INT32, QINT8, QCINT8 = 2, 12, 3, 6  # XNNDatatype codes of the runtime schema


@pytest.fixture(scope="module")
def sandbox() -> Iterator[RuntimeSandbox]:
    with RuntimeSandbox() as box:
        yield box


def findings_of(check: Callable[..., Iterator[Finding]], data: bytes) -> list[Finding]:
    """What one check finds on every XNNPACK delegate of ``data``."""
    found: list[Finding] = []
    for method in read_methods(data, "program"):
        for delegate in method.delegates:
            if delegate.backend != XNNPACK_BACKEND_ID:
                continue
            graph = read_xnnpack_blob(delegate.blob)
            if check in values.VALUE_CHECKS:
                found += [f for value in graph.values for f in check(value, graph)]
            elif check is values.check_unique_value_ids:
                found += check(graph)
            elif check is check_argument_bindings:
                found += check(graph, delegate.calls)
            elif check in (check_node_type_is_defined, check_required_ids):
                found += [f for node in graph.nodes for f in check(node)]
            else:
                table = graph.value_map()
                nodes = [node for node in graph.nodes if check in DEFINE_CHECKS.get(node.op, ())]
                found += [f for node in nodes for f in check(NodeView(node, table))]
    return found


@dataclass(frozen=True)
class Case:
    """``program`` with ``field`` (a path pattern; ``{op:field}`` names the value a node's id field holds)
    set to ``value`` breaks ``check``: ``verify_pte`` reports ``kind``, and the runtime fails ``at`` ("load",
    "run", "fails": load, run, a crash or a hang (1.4's runtime hangs where 1.5's fails to load); None:
    undefined behaviour the runtime may not notice)."""

    check: Callable[..., Iterator[Finding]]
    program: str
    field: str
    value: float
    kind: str
    at: str | None
    aspect: str = ""

    @property
    def name(self) -> str:
        return getattr(self.check, "__name__", "check") + (f"[{self.aspect}]" if self.aspect else "")


def _resolve(data: bytes, pattern: str) -> str:
    """``{XNNSoftmax:output_id}/datatype`` -> ``value 17/datatype``."""
    if pattern.startswith("{"):
        reference, rest = pattern[1:].split("}", 1)
        op, id_field = reference.split(":")
        return rf"/value {node_value(data, op, id_field)}{rest}$"
    return pattern


def _changed(data: bytes, program_name: str, pattern: str, value: float) -> bytes:
    """``data`` with the field ``pattern`` names set to ``value``; skips when this release's program has no
    such field (ExecuTorch 1.4's partitioner leaves some of the programs' ops, e.g. a padded average
    pooling, outside XNNPACK)."""
    try:
        return edit(data, _resolve(data, pattern), value)
    except (LookupError, IndexError) as error:
        pytest.skip(f"{program_name} as this ExecuTorch lowers it has no {pattern} ({error})")


CASES = [
    # value definition (XNNCompiler::defineTensor, src/tensor.c)
    Case(values.check_value_flags, "stock_float_conv_linear", r"value 0/flags$", 5, "value_def", "load"),
    Case(values.check_internal_value_has_no_external_id, "stock_float_conv_linear", r"value 3/external_id$", 0,
         "extern_ids", "fails"),
    Case(values.check_plain_datatype, "stock_float_conv_linear", r"value 3/datatype$", QINT8, "datatype", "load"),
    Case(values.check_quantized_value_has_parameters, "stock_qconv_linear", r"value 1/quant_params_type$", 0,
         "value_def", "load"),
    Case(values.check_per_tensor_quantization, "stock_qconv_linear_per_tensor", r"value 4 PerTensorQuant/zero_point$",
         200, "quant_range", "load", "zero point"),
    Case(values.check_per_tensor_quantization, "stock_qconv_linear_per_tensor", r"value 4 PerTensorQuant/scale$",
         -0.5, "quant_range", "load", "scale"),
    Case(values.check_per_tensor_quantization, "stock_qconv_linear_per_tensor", r"value 8/datatype$", QCINT8,
         "datatype", "fails", "per-channel datatype"),
    Case(values.check_per_channel_quantization, "stock_qconv_linear", r"value 3 PerChannelQuant/scale_buffer_idx$",
         1, "constants", "fails", "scale buffer is a tensor"),
    Case(values.check_per_channel_quantization, "stock_qconv_linear", r"value 3 PerChannelQuant/scale_buffer_idx$",
         40, "constants", "load", "scale buffer missing"),
    Case(values.check_per_channel_group_quantization, "stock_int4_linear",
         r"value 2 PerChannelGroupQuant/group_size$", 48, "quant_range", "load", "scale count"),
    Case(values.check_per_channel_group_quantization, "stock_int4_linear",
         r"value 2 PerChannelGroupQuant/group_size$", 0, "quant_range", "fails", "group size 0"),
    Case(values.check_dynamic_quantization, "stock_dynamic_linear", r"PerTokenDynamicQuant/num_nonbatch_dims$", 5,
         "value_def", "load"),
    Case(values.check_constant_entry, "stock_float_conv_linear", r"value 2/constant_buffer_idx$", 9, "constants",
         "load", "index"),
    Case(values.check_constant_entry, "stock_float_conv_linear", r"value 7/constant_buffer_idx$", 4, "constants",
         None, "data smaller than the tensor"),
    Case(values.check_unique_value_ids, "stock_float_conv_linear", r"value 3/id_out$", 2, "value_def", "fails"),
    # nodes in general and the delegate's arguments
    Case(check_node_type_is_defined, "stock_move_values", r"node 3 XNNMultiply/xnode_union_type$", 36,
         "unsupported_node", "load"),
    Case(check_required_ids, "stock_move_values", r"XNNMultiply/input2_id$", NO_VALUE, "unwritten_value", "load"),
    Case(check_argument_bindings, "stock_zoo", r"{XNNBatchMatrixMultiply:input1_id}/datatype", FP16, "datatype",
         None),
    # XNNPACK's quantization-parameter equality rule (issue 13)
    Case(check_quantization_parameters_match, "stock_qconv_linear_per_tensor", r"value 7 PerTensorQuant/scale$",
         0.25, "quant_params", "load"),
    # elementwise nodes
    Case(elementwise.check_binary_datatypes_match, "stock_zoo", r"{XNNAvgPooling2d:output_id}/datatype", FP16,
         "datatype", "load"),
    Case(elementwise.check_unary_datatypes_match, "stock_zoo", r"{XNNSigmoid:output_id}/datatype", FP16, "datatype",
         "load"),
    Case(elementwise.check_convert_pair_supported, "stock_qconv_linear", r"value 1/datatype$", QCINT8, "datatype",
         "fails"),
    Case(elementwise.check_softmax_datatypes, "stock_zoo", r"{XNNSoftmax:output_id}/datatype", FP16, "datatype",
         "load"),
    # GEMM-like nodes
    Case(gemm.check_datatype_combination, "stock_float_conv_linear", r"value 8/datatype$", FP16, "datatype", "load"),
    Case(gemm.check_filter_and_bias_are_static, "stock_float_conv_linear", r"value 2/constant_buffer_idx$", 0,
         "datatype", "load"),
    Case(gemm.check_convolution_parameters, "stock_float_conv_linear", r"XNNConv2d/kernel_height$", 0, "node_params",
         "load"),
    Case(gemm.check_convolution_parameters, "stock_zoo", r"XNNDepthwiseConv2d/group_input_channels$", 0,
         "node_params", "fails", "depthwise"),
    Case(gemm.check_output_min_max, "stock_float_conv_linear", r"XNNConv2d/output_min_max/output_max$", -1.0,
         "node_params", "load"),
    Case(gemm.check_filter_matches_channels, "stock_float_conv_linear", r"XNNConv2d/group_output_channels$", 5,
         "shape", "load"),
    Case(gemm.check_requantization_scale, "stock_qconv_linear_per_tensor", r"value 10 PerTensorQuant/scale$", 1e-9,
         "quant_range", "load"),
    Case(gemm.check_dynamic_input_rank, "stock_dynamic_conv1x1", r"PerTokenDynamicQuant/num_nonbatch_dims$", 4,
         "value_def", "load"),
    Case(gemm.check_bmm_datatypes, "stock_zoo", r"{XNNBatchMatrixMultiply:output_id}/datatype", INT32, "datatype",
         "load"),
    Case(gemm.check_blockwise_filter, "stock_int4_linear", r"value 2/dims\[1\]$", 65, "quant_range", "load"),
    # pooling nodes
    Case(pooling.check_pooling_parameters, "stock_zoo", r"XNNMaxPooling2d/stride_height$", 0, "node_params", "load"),
    Case(pooling.check_max_pooling_datatypes, "stock_zoo", r"{XNNMaxPooling2d:output_id}/datatype", FP16, "datatype",
         "load"),
    Case(pooling.check_average_pooling_datatypes, "stock_zoo", r"{XNNAvgPooling2d:output_id}/datatype", INT32,
         "datatype", "load"),
    Case(pooling.check_global_pooling_datatypes, "stock_zoo", r"{XNNGlobalAvgPooling2d:output_id}/datatype", INT32,
         "datatype", "fails"),
    # nodes that move values
    Case(moves.check_datatypes_match, "stock_move_values", r"{XNNConcatenate2:output_id}/datatype", FP16,
         "datatype", "load"),
    Case(moves.check_pad_arrays_cover_rank, "stock_move_values", r"pre_paddings.length$", 3, "node_params", None),
    Case(moves.check_transpose_permutation, "stock_move_values", r"XNNStaticTranspose/perm\[1\]$", 1, "node_params",
         "load"),
    Case(moves.check_reshape_shape, "stock_float_conv_linear", r"new_shape.length$", 7, "node_params", "load"),
    Case(moves.check_slice_arrays, "stock_zoo", r"XNNStaticSlice/sizes.length$", 3, "node_params", "load"),
    Case(moves.check_resize_parameters, "stock_zoo", r"XNNStaticResizeBilinear2D/new_height$", 0, "node_params",
         "load"),
    Case(moves.check_resize_datatypes, "stock_zoo", r"{XNNStaticResizeBilinear2D:output_id}/datatype", INT32,
         "datatype", "load"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_a_changed_field_fails_its_define_time_check(case: Case, sandbox: RuntimeSandbox) -> None:
    data = program(case.program)
    assert findings_of(case.check, data) == [] and verify_pte(data).ok
    mutated = _changed(data, case.program, case.field, case.value)
    assert findings_of(case.check, mutated), "the check finds nothing on the changed program"
    report = verify_pte(mutated)
    assert case.kind in report.kinds(), str(report)
    outcome = sandbox.outcome(mutated)
    if case.at == "fails":
        assert outcome in ("load", "run", "crash", "timeout"), (outcome, sandbox.last_message)
    elif case.at is not None:
        assert outcome == case.at, (outcome, sandbox.last_message)


@dataclass(frozen=True)
class ShapeCase:
    """``program`` with ``field`` set to ``value`` makes XNNPACK's reshape of ``op`` (or the resize of the
    method's output, ``op`` None) fail at the first run: a ``shape`` problem, and a ``run`` failure."""

    rule: str
    program: str
    field: str
    value: int | Callable[[bytes], int]  # or computed from the program (value ids differ between releases)
    op: str | None
    older_xnnpack_runs_it: bool = False  # channels that disagree: 1.4's XNNPACK runs the node on them


SHAPE_CASES = [
    ShapeCase("reshape_binary", "stock_zoo", r"XNNAvgPooling2d/stride_height$", 1, "XNNAdd"),
    ShapeCase(
        "reshape_convolution", "stock_float_conv_linear", r"XNNConv2d/group_input_channels$", 1, "XNNConv2d", True
    ),
    ShapeCase("reshape_convolution_depthwise", "stock_zoo", r"XNNDepthwiseConv2d/groups$", 2, "XNNDepthwiseConv2d"),
    ShapeCase("reshape_deconvolution", "stock_zoo", r"XNNConvTranspose2d/subsampling_height$", 1, "XNNAdd"),
    ShapeCase(
        "reshape_fully_connected", "stock_float_conv_linear", r"value 7/dims\[1\]$", 72, "XNNFullyConnected", True
    ),
    # the batch matmul's second input becomes b itself instead of b transposed: K no longer matches
    ShapeCase(
        "reshape_batch_matrix_multiply",
        "stock_zoo",
        r"XNNBatchMatrixMultiply/input2_id$",
        lambda data: node_value(data, "XNNStaticTranspose", "input_id", occurrence=-1),
        "XNNBatchMatrixMultiply",
    ),
    ShapeCase("reshape_pad_output", "stock_move_values", r"post_paddings\[2\]$", 3, None),
    ShapeCase("reshape_transpose", "stock_move_values", r"XNNStaticTranspose/perm.length$", 3, "XNNStaticTranspose"),
    ShapeCase("reshape_static_reshape", "stock_float_conv_linear", r"new_shape\[0\]$", 2, "XNNStaticReshape"),
    ShapeCase("reshape_concatenate", "stock_move_values", r"XNNConcatenate2/axis$", 2, "XNNConcatenate2"),
    ShapeCase("reshape_slice_output", "stock_zoo", r"XNNStaticSlice/sizes\[1\]$", 2, None),
    ShapeCase("reshape_resize", "stock_zoo", r"XNNStaticResizeBilinear2D/new_height$", 9, "XNNAdd"),
    # sizes the first run cannot allocate: a 4-billion-row output, a 4-billion-tap indirection buffer
    ShapeCase(
        "allocation_of_an_output", "stock_zoo", r"XNNDepthwiseConv2d/padding_bottom$", NO_VALUE, "XNNDepthwiseConv2d"
    ),
    ShapeCase(
        "allocation_of_an_indirection_buffer",
        "stock_zoo",
        r"XNNAvgPooling2d/pooling_width$",
        NO_VALUE,
        "XNNAvgPooling2d",
    ),
]


@pytest.mark.parametrize("case", SHAPE_CASES, ids=lambda case: case.rule)
def test_a_changed_field_fails_the_first_runs_shape_propagation(case: ShapeCase, sandbox: RuntimeSandbox) -> None:
    data = program(case.program)
    value = case.value(data) if callable(case.value) else case.value
    mutated = _changed(data, case.program, case.field, value)
    report = verify_pte(mutated)
    shapes = [p for p in report.problems if p.kind == "shape"]
    assert shapes and all("fails when it first runs" in p.message for p in shapes), str(report)
    assert shapes[0].op == case.op, str(report)
    assert report.kinds() <= {"shape", "node_params"} or case.op is None, str(report)
    outcome = sandbox.outcome(mutated)
    if case.older_xnnpack_runs_it and outcome == "runs":
        # an XNNPACK that does not check the channels (ExecuTorch 1.4's): the program runs, computing wrong values
        assert "the XNNPACK of 1.4 does not check this" in shapes[0].message, str(report)
        changed_outputs = sandbox.last_outputs
        assert sandbox.outcome(data) == "runs" and sandbox.last_outputs != changed_outputs
    else:
        assert outcome == "run", sandbox.last_message


def test_every_node_type_executorch_defines_has_its_checks_and_shape_rule() -> None:
    """Each of the 46 node types XNNCompiler defines (getDefineNodeFunc, XNNCompiler.cpp:2008-2064) but
    ArgMaxPooling2d (never built by the 1.5.1 partitioner) has define-time checks and a shape rule here."""
    defined = set(DEFINE_CHECKS) | set(RESHAPES)
    assert len(defined) == 45 and set(RESHAPES) == defined and "XNNArgMaxPooling2d" not in defined


def test_the_quantized_pad_of_issue_13_is_flagged_as_quant_params_and_fails_to_load(sandbox: RuntimeSandbox) -> None:
    """Stock XNNPACKQuantizer + XnnpackPartitioner on conv -> F.pad -> relu: InsertPadQDQPass gives the pad an
    fp32 input and a qint8 output, which XNNPACK refuses ("Failed to create StaticConstantPad node")."""
    data = program("stock_qconv_pad")
    report = verify_pte(data)
    (pad,) = [p for p in report.problems if p.kind == "quant_params"]
    assert (pad.op, pad.method, pad.delegate) == ("XNNStaticConstantPad", "forward", 0)
    assert "qint8" in pad.message and "not quantized" in pad.message
    assert sandbox.outcome(data) == "load"
    assert "Failed to create StaticConstantPad node" in sandbox.last_message
