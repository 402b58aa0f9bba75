"""The delegate checks, one rule per test, on XNNPACK graphs built by hand and serialized by ExecuTorch.

Each graph goes through ExecuTorch 1.5.1's own XNNPACK serializer (``serialize_xnnpack_binary``, the
one ``to_edge_transform_and_lower`` uses), so the reader and the checks see real blob bytes.
"""

from __future__ import annotations

from executorch.backends.xnnpack.serialization import xnnpack_graph_schema as xs
from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import serialize_xnnpack_binary

from xnnguard.runtime_check.checks import delegate_problems
from xnnguard.runtime_check.define_checks import define_problems
from xnnguard.runtime_check.flatbuffer_view import Region
from xnnguard.runtime_check.pte_reader import DelegateCall
from xnnguard.runtime_check.xnnpack_blob import PerChannelQuant, PerTensorQuant, XnnGraph, read_xnnpack_blob

NO_VALUE = 0xFFFFFFFF
INPUT, OUTPUT = 1, 2


def tensor(
    id_out: int, dims: list[int], *, flags: int = 0, external_id: int = NO_VALUE, constant: int = 0
) -> xs.XValue:
    return xs.XValue(
        xs.XNNTensorValue(xs.XNNDatatype.xnn_datatype_fp32, len(dims), dims, constant, external_id, flags, id_out)
    )


def add(a: int, b: int, out: int) -> xs.XNode:
    return xs.XNode(xs.XNNAdd(input1_id=a, input2_id=b, output_id=out, flags=0), debug_handle=0)


def serialized(values: list[xs.XValue], nodes: list[xs.XNode], num_externs: int) -> XnnGraph:
    graph = xs.XNNGraph("0", nodes, values, num_externs, [], [], [])
    blob = serialize_xnnpack_binary(graph, bytearray())
    return read_xnnpack_blob(Region(blob, 0, len(blob), "blob"))


def kinds(graph: XnnGraph, num_inputs: int, num_args: int | None = None) -> list[str]:
    args = tuple(range(graph.num_externs if num_args is None else num_args))
    return [p.kind for p in delegate_problems(graph, (DelegateCall(args, num_inputs),), "forward", 0)]


# x (ext 0) + y (ext 1) -> t ; t + x -> out (ext 2): well-formed
def well_formed_values(**changes: dict) -> list[xs.XValue]:
    specs = {
        0: dict(dims=[2, 3], flags=INPUT, external_id=0),
        1: dict(dims=[2, 3], flags=INPUT, external_id=1),
        2: dict(dims=[2, 3]),
        3: dict(dims=[2, 3], flags=OUTPUT, external_id=2),
    }
    for key, change in changes.items():
        specs[int(key[1:])] |= change
    return [tensor(i, **spec) for i, spec in specs.items()]


WELL_FORMED_NODES = [add(0, 1, 2), add(2, 0, 3)]


def test_the_reader_returns_what_executorch_serialized() -> None:
    graph = serialized(well_formed_values(), WELL_FORMED_NODES, 3)
    assert graph.num_externs == 3
    assert [(v.id, v.dims, v.flags, v.external_id) for v in graph.values] == [
        (0, (2, 3), INPUT, 0),
        (1, (2, 3), INPUT, 1),
        (2, (2, 3), 0, NO_VALUE),
        (3, (2, 3), OUTPUT, 2),
    ]
    assert [(n.op, n.inputs, n.outputs) for n in graph.nodes] == [("XNNAdd", (0, 1), (2,)), ("XNNAdd", (2, 0), (3,))]


def test_the_reader_returns_datatypes_quantization_and_node_parameters() -> None:
    qint8, qcint8 = xs.XNNDatatype.xnn_datatype_qint8, xs.XNNDatatype.xnn_datatype_qcint8
    values = [
        xs.XValue(
            xs.XNNQuantizedTensorValue(
                xs.XNNTensorValue(qint8, 4, [1, 4, 4, 2], 0, 0, INPUT, 0), xs.PerTensorQuant(0.5, -3)
            )
        ),
        xs.XValue(
            xs.XNNQuantizedTensorValue(
                xs.XNNTensorValue(qcint8, 4, [3, 1, 1, 2], 1, NO_VALUE, 0, 1),
                xs.PerChannelQuant([0.25, 0.5, 1.0], 0, 0, 0),
            )
        ),
        xs.XValue(
            xs.XNNQuantizedTensorValue(
                xs.XNNTensorValue(qint8, 4, [1, 4, 4, 3], 0, 1, OUTPUT, 2), xs.PerTensorQuant(0.125, 7)
            )
        ),
    ]
    conv = xs.XNNConv2d(
        padding_top=0, padding_right=1, padding_bottom=0, padding_left=1, kernel_height=1, kernel_width=1,
        subsampling_height=1, subsampling_width=1, dilation_height=1, dilation_width=1, group_input_channels=2,
        group_output_channels=3, groups=1, adjustment_height=0, adjustment_width=0, input1_id=0, filter_id=1,
        bias_id=NO_VALUE, output_id=2, flags=0,
    )  # fmt: skip
    node = xs.XNode(conv, debug_handle=7, output_min_max=xs.OutputMinMax(0.0, 6.0))
    graph = serialized(values, [node], 2)
    assert [(v.datatype, v.quantization) for v in graph.values] == [
        ("qint8", PerTensorQuant(0.5, -3)),
        ("qcint8", PerChannelQuant((0.25, 0.5, 1.0), True, 0, 0, 0)),
        ("qint8", PerTensorQuant(0.125, 7)),
    ]
    (read,) = graph.nodes
    assert read.ids == {"input1_id": 0, "filter_id": 1, "bias_id": NO_VALUE, "output_id": 2}
    assert (read.params["padding_right"], read.params["group_output_channels"], read.params["flags"]) == (1, 3, 0)
    assert (read.output_min_max, read.debug_handle) == ((0.0, 6.0), 7)


def test_vector_parameters_are_read_as_tuples() -> None:
    values = [tensor(0, [2, 3, 4], flags=INPUT, external_id=0), tensor(1, [4, 2, 3], flags=OUTPUT, external_id=1)]
    transpose = xs.XNNStaticTranspose(num_dims=3, perm=[2, 0, 1], input_id=0, output_id=1, flags=0)
    (node,) = serialized(values, [xs.XNode(transpose, 0)], 2).nodes
    assert node.params["perm"] == (2, 0, 1) and node.output_min_max is None


def test_a_missing_bias_and_unused_concatenation_inputs_are_not_reads() -> None:
    values = [tensor(i, [2, 2], flags=INPUT, external_id=i) for i in range(3)] + [tensor(3, [2, 2]), tensor(4, [4, 2])]
    nodes = [
        xs.XNode(xs.XNNFullyConnected(input1_id=0, filter_id=1, bias_id=NO_VALUE, output_id=3, flags=0), 0),
        # a 2-input concatenation whose unused slots hold 0, a real value id
        xs.XNode(
            xs.XNNConcatenate2(
                axis=0, input1_id=3, input2_id=2, input3_id=0, input4_id=0, output_id=4, flags=0, input5_id=0
            ),
            0,
        ),
    ]
    graph = serialized(values, nodes, 3)
    assert [(n.op, n.inputs) for n in graph.nodes] == [("XNNFullyConnected", (0, 1)), ("XNNConcatenate2", (3, 2))]


def test_a_well_formed_delegate_has_no_problem() -> None:
    assert kinds(serialized(well_formed_values(), WELL_FORMED_NODES, 3), num_inputs=2) == []


def test_a_tensor_above_six_dims_is_a_rank_problem() -> None:
    graph = serialized(well_formed_values(v2=dict(dims=[1] * 7)), WELL_FORMED_NODES, 3)
    (problem,) = delegate_problems(graph, (DelegateCall((0, 1, 2), 2),), "forward", 0)
    assert (problem.kind, problem.value, problem.dims, problem.node, problem.op) == ("rank", 2, (1,) * 7, 0, "XNNAdd")
    assert "above 6 dims" in problem.message


def test_a_six_dim_tensor_is_fine() -> None:
    assert kinds(serialized(well_formed_values(v2=dict(dims=[1] * 6)), WELL_FORMED_NODES, 3), num_inputs=2) == []


def test_num_dims_that_disagree_with_the_listed_sizes_is_a_rank_problem() -> None:
    values = well_formed_values()
    values[2].xvalue_union.num_dims = 3  # lists 2 sizes
    assert kinds(serialized(values, WELL_FORMED_NODES, 3), num_inputs=2) == ["rank"]


def test_reading_a_value_nothing_writes_is_an_unwritten_value() -> None:
    # value 1 lost its input flag: node 0 reads it, nothing writes it (and external id 1 binds nothing)
    graph = serialized(well_formed_values(v1=dict(flags=0, external_id=NO_VALUE)), WELL_FORMED_NODES, 3)
    problems = delegate_problems(graph, (DelegateCall((0, 1, 2), 2),), "forward", 0)
    unwritten = [p for p in problems if p.kind == "unwritten_value"]
    assert [(p.node, p.value) for p in unwritten] == [(0, 1)]


def test_a_constant_counts_as_written() -> None:
    values = well_formed_values(v1=dict(flags=0, external_id=NO_VALUE, constant=1), v3=dict(external_id=1))
    graph = serialized(values, WELL_FORMED_NODES, 2)
    assert kinds(graph, num_inputs=1) == []


def test_the_rank_is_that_of_the_sizes_listed_as_the_runtime_takes_it() -> None:
    """XNNCompiler ignores num_dims (XNNCompiler.cpp:354): a 2-D value declaring 8 dims is no rank-limit
    problem, only a contradiction in the graph."""
    values = well_formed_values()
    values[2].xvalue_union.num_dims = 8
    (problem,) = delegate_problems(serialized(values, WELL_FORMED_NODES, 3), (DelegateCall((0, 1, 2), 2),), "f", 0)
    assert problem.kind == "rank" and "declares 8 dims but lists 2 sizes" in problem.message


def test_reading_a_value_a_later_node_writes_is_an_unwritten_value() -> None:
    """XNNPACK runs nodes in the order they are defined: node 0 reads t before node 1 writes it."""
    graph = serialized(well_formed_values(), [add(2, 0, 3), add(0, 1, 2)], 3)
    problems = delegate_problems(graph, (DelegateCall((0, 1, 2), 2),), "forward", 0)
    assert [(p.kind, p.node, p.value) for p in problems] == [("unwritten_value", 0, 2)]
    assert "before any node writes it" in problems[0].message


def test_reading_an_id_the_delegate_never_defines_is_an_unwritten_value() -> None:
    graph = serialized(well_formed_values(), [add(0, 9, 2), add(2, 0, 3)], 3)
    assert kinds(graph, num_inputs=2) == ["unwritten_value"]


def test_an_external_output_no_node_writes_is_an_unwritten_output() -> None:
    graph = serialized(well_formed_values(), [add(0, 1, 2)], 3)  # nothing writes value 3 any more
    (problem,) = delegate_problems(graph, (DelegateCall((0, 1, 2), 2),), "forward", 0)
    assert (problem.kind, problem.value) == ("unwritten_output", 3)


def test_a_delegate_output_bound_to_no_value_is_an_unwritten_output() -> None:
    # the orphaned implicit q/dq shape: four arguments, two of them outputs, no value bound to them
    graph = serialized(well_formed_values(), WELL_FORMED_NODES, 5)
    assert kinds(graph, num_inputs=4) == ["extern_ids", "unwritten_output"]  # args 3 (an input), 4 (an output)


def test_an_external_id_used_twice_is_an_extern_ids_problem() -> None:
    graph = serialized(well_formed_values(v1=dict(external_id=0)), WELL_FORMED_NODES, 3)
    problems = delegate_problems(graph, (DelegateCall((0, 1, 2), 2),), "forward", 0)
    assert [p.message.split(":")[0] for p in problems if p.kind == "extern_ids"] == [
        "external id 0 is bound to 2 values",
        "external id 1 (delegate input 1, EValue 1) is bound to no value",
    ]


def test_an_external_id_out_of_range_is_an_extern_ids_problem() -> None:
    graph = serialized(well_formed_values(v3=dict(external_id=7)), WELL_FORMED_NODES, 3)
    assert "extern_ids" in kinds(graph, num_inputs=2)


def test_a_call_with_another_argument_count_than_num_externs_is_an_extern_ids_problem() -> None:
    graph = serialized(well_formed_values(), WELL_FORMED_NODES, 3)
    assert kinds(graph, num_inputs=2, num_args=4) == ["extern_ids"]


# Define-time rules no single field of a real 1.5.1 program reaches (the field they need is absent there,
# flatbuffers leaves out default values): the same check on a graph built by hand.


def define_kinds(graph: XnnGraph, num_inputs: int) -> list[str]:
    args = tuple(range(graph.num_externs))
    return [p.kind for p in define_problems(graph, (DelegateCall(args, num_inputs),), "forward", 0)]


def quantized(id_out: int, dims: list[int], datatype: xs.XNNDatatype, params: object, **fields: int) -> xs.XValue:
    spec = {"constant": 0, "external_id": NO_VALUE, "flags": 0} | fields
    tensor_value = xs.XNNTensorValue(
        datatype, len(dims), dims, spec["constant"], spec["external_id"], spec["flags"], id_out
    )
    return xs.XValue(xs.XNNQuantizedTensorValue(tensor_value, params))


def conv_graph(filter_params: object, filter_type: xs.XNNDatatype, **node: float) -> XnnGraph:
    """x (qint8 NHWC input) -> 3x3 Conv2d with a 2-channel constant filter -> y (qint8 output)."""
    qint8 = xs.XNNDatatype.xnn_datatype_qint8
    values = [
        quantized(0, [1, 4, 4, 3], qint8, xs.PerTensorQuant(0.5, 0), external_id=0, flags=INPUT),
        quantized(1, [2, 3, 3, 3], filter_type, filter_params, constant=1),
        quantized(2, [1, 2, 2, 2], qint8, xs.PerTensorQuant(0.5, 0), external_id=1, flags=OUTPUT),
    ]
    fields = dict(
        padding_top=0, padding_right=0, padding_bottom=0, padding_left=0, kernel_height=3, kernel_width=3,
        subsampling_height=1, subsampling_width=1, dilation_height=1, dilation_width=1, group_input_channels=3,
        group_output_channels=2, groups=1, adjustment_height=0, adjustment_width=0, input1_id=0, filter_id=1,
        bias_id=NO_VALUE, output_id=2, flags=0,
    )  # fmt: skip
    fields.update({key: int(value) for key, value in node.items()})
    graph = xs.XNNGraph("0", [xs.XNode(xs.XNNConv2d(**fields), 0)], values, 2, [], [], [])
    graph.constant_data = [xs.ConstantDataOffset(0, 0), xs.ConstantDataOffset(0, 54)]
    blob = serialize_xnnpack_binary(graph, bytearray(b"\0" * 64))
    return read_xnnpack_blob(Region(blob, 0, len(blob), "blob"))


def test_an_external_value_with_constant_data_is_an_extern_ids_problem() -> None:
    """XNNPACK treats a value with data as static even when flagged external: binding it fails at run."""
    graph = serialized(well_formed_values(v0=dict(constant=1)), WELL_FORMED_NODES, 3)
    assert "extern_ids" in define_kinds(graph, num_inputs=2)


def test_a_symmetric_qint8_filter_is_fine() -> None:
    qint8 = xs.XNNDatatype.xnn_datatype_qint8
    assert define_kinds(conv_graph(xs.PerTensorQuant(0.25, 0), qint8), num_inputs=1) == []


def test_a_qint8_filter_with_a_zero_point_is_a_quant_range_problem() -> None:
    """xnn_define_convolution_2d: a qint8 filter needs zero point 0 (convolution-2d.c:1219)."""
    qint8 = xs.XNNDatatype.xnn_datatype_qint8
    assert define_kinds(conv_graph(xs.PerTensorQuant(0.25, 3), qint8), num_inputs=1) == ["quant_range"]


def test_a_per_channel_filter_along_another_dim_than_its_outputs_is_a_quant_range_problem() -> None:
    """A Conv2d's qcint8 filter is quantized along dim 0, its output channels (convolution-2d.c:1359)."""
    qcint8 = xs.XNNDatatype.xnn_datatype_qcint8
    along_outputs = xs.PerChannelQuant([0.25, 0.5], 0, 0, 0)
    along_inputs = xs.PerChannelQuant([0.25, 0.5, 0.5], 3, 0, 0)
    assert define_kinds(conv_graph(along_outputs, qcint8), num_inputs=1) == []
    assert define_kinds(conv_graph(along_inputs, qcint8), num_inputs=1) == ["quant_range"]


def test_a_pooling_clamp_with_min_above_max_is_a_node_params_problem() -> None:
    """xnn_subgraph_check_output_min_max on MaxPooling2d (max-pooling-2d.c:326)."""
    values = [tensor(0, [1, 4, 4, 2], flags=INPUT, external_id=0), tensor(1, [1, 2, 2, 2], flags=OUTPUT, external_id=1)]
    pool = xs.XNNMaxPooling2d(
        padding_top=0, padding_right=0, padding_bottom=0, padding_left=0, pooling_height=2, pooling_width=2,
        stride_height=2, stride_width=2, dilation_height=1, dilation_width=1, input_id=0, output_id=1, flags=0,
    )  # fmt: skip
    fine = serialized(values, [xs.XNode(pool, 0, xs.OutputMinMax(0.0, 6.0))], 2)
    inverted = serialized(values, [xs.XNode(pool, 0, xs.OutputMinMax(6.0, 0.0))], 2)
    assert define_kinds(fine, num_inputs=1) == [] and define_kinds(inverted, num_inputs=1) == ["node_params"]
