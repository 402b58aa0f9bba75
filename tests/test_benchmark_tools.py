"""The benchmarks' own tools compute what their tables claim: ceilings, verdicts on targets, details.

These test ``benchmarks/``, not xnnguard: a table whose ceiling counted layout copies, or whose verdict
called a missed target out of reach when it was not, would mislead whoever reads it.
"""

from __future__ import annotations

import torch


def test_the_heavy_ops_module_feeds_each_conv_in_xnnpacks_layout_without_a_transpose() -> None:
    """A ceiling counts the convs' time, not layout copies no network pays between two convs.

    Each activation is a stored constant plus the input: stored NCHW, ExecuTorch transposed every conv
    input into NHWC and every output back, and those copies made some ceilings lower than the ratio the
    whole network reached.
    """
    import math

    from executorch.exir import to_edge_transform_and_lower

    import xnnguard
    from benchmarks.gemm_floor import HeavyOps
    from xnnguard.runtime_check.pte_reader import read_methods
    from xnnguard.runtime_check.xnnpack_blob import read_xnnpack_blob

    conv = (torch.ops.aten.conv2d.default, (torch.Size([1, 8, 16, 16]), torch.Size([16, 8, 3, 3]), torch.Size([16]),
                                            [1, 1], [1, 1], [1, 1], 1))
    linear = (torch.ops.aten.linear.default, (torch.Size([4, 32]), torch.Size([8, 32]), torch.Size([8])))
    example = (torch.randn(1, 1, 1, 1),)
    program = torch.export.export(HeavyOps([conv, linear]).eval(), example)
    buffer = to_edge_transform_and_lower(program, partitioner=[xnnguard.XnnpackPartitioner()]).to_executorch().buffer
    (method,) = read_methods(buffer, "heavy")
    (delegate,) = method.delegates
    graph = read_xnnpack_blob(delegate.blob)
    values = graph.value_map()
    ops = [node.op for node in graph.nodes]
    assert ops.count("XNNConv2d") == 1 and ops.count("XNNFullyConnected") == 1
    moved = [math.prod(values[node.outputs[0]].dims) for node in graph.nodes if node.op == "XNNStaticTranspose"]
    assert all(elements <= 1 for elements in moved), moved  # at most the one element each output keeps


def test_a_missed_median_is_out_of_reach_only_when_every_ceiling_bounds_its_network() -> None:
    from benchmarks.bench_networks import COUNTED, Row, misses
    from testbed.network_flow import Result

    def row(name: str, eager_ms: float, et_ms: float, heavy_ms: float) -> Row:
        float_result = Result(name, "bench", "float", "xnnguard", delegates=1, eager_ms=eager_ms, et_ms=et_ms)
        return Row(name, {"float": float_result}, heavy_ms=heavy_ms)

    bounded = [row(name, 30.0, 10.0, 9.0) for name in COUNTED]  # ratio 3.0, ceiling 3.33 each
    (missed,) = misses(bounded)
    assert missed.startswith("median eager/ET 3.00 < 4.0") and "ceiling 3.33" in missed and "out of reach" in missed
    room = [row(name, 30.0, 10.0, 5.0) for name in COUNTED]  # ceiling 6.0: the kernels leave room
    assert "room is left" in misses(room)[0]
    at_floor = [*bounded[:-1], row(COUNTED[-1], 30.0, 10.0, 10.5)]  # ceiling 2.86, 5 % below its ratio
    (missed,) = misses(at_floor)
    assert "out of reach" in missed and f"at their floor: {COUNTED[-1]}" in missed
    not_a_bound = [*bounded[:-1], row(COUNTED[-1], 30.0, 10.0, 12.0)]  # ceiling 2.5, 17 % below its ratio
    (missed,) = misses(not_a_bound)
    assert "no bound" in missed and COUNTED[-1] in missed and "out of reach" not in missed


def test_the_details_of_a_lowering_name_its_dynamic_batch() -> None:
    from benchmarks.network_report import details
    from testbed.network_flow import Result

    static, dynamic = (Result("s3d", "bench", "static", "xnnguard", batch=batch) for batch in ("static", "dynamic"))
    assert details([static, dynamic]).splitlines() == [
        "s3d [static, xnnguard]: ok", "s3d [static, dynamic batch, xnnguard]: ok"]
