"""verify_pte on real programs: stock 1.5.1's bad ones are flagged with the right kind, good ones pass."""

from __future__ import annotations

import pytest
import torch

from testbed.lowered import run_pte
from testbed.tolerance import float_tolerance, int8_tolerance
from tests.runtime_check_corpus import CORPUS, ON_ONE_WORKER, inputs_of, program, reference_model, write_program
from xnnguard.runtime_check import assert_pte_ok, verify_pte

pytestmark = [pytest.mark.release_sensitive, ON_ONE_WORKER]

STATICALLY_JUDGED = [name for name, entry in CORPUS.items() if entry.static_kinds is not None]
# Programs the runtime loads and runs: their numbers say whether they are good.
RUNNABLE = [
    "stock_qconv2d_float_output",
    "guarded_qconv2d_float_output",
    "stock_float_conv_linear",
    "stock_qconv_linear",
    "guarded_rank7",
]


@pytest.mark.parametrize("name", STATICALLY_JUDGED)
def test_verify_reports_exactly_the_expected_problem_kinds(name: str) -> None:
    report = verify_pte(program(name))
    assert report.kinds() == CORPUS[name].static_kinds, str(report)


@pytest.mark.parametrize("name", RUNNABLE)
def test_the_verdict_agrees_with_the_numbers_the_runtime_returns(name: str) -> None:
    inputs = inputs_of(name)
    expected = reference_model(name)(*inputs)
    (actual,) = run_pte(program(name), inputs)
    model = reference_model(name)
    tolerance = int8_tolerance(model, expected, dynamic=False) if CORPUS[name].quantizer else float_tolerance(expected)
    numbers_right = bool(torch.allclose(actual, expected, atol=tolerance, rtol=0))
    assert verify_pte(program(name)).ok == numbers_right


def test_a_rank_problem_names_method_delegate_node_op_value_and_dims() -> None:
    problem = verify_pte(program("stock_rank7")).problems[0]
    assert (problem.method, problem.delegate, problem.node, problem.op) == ("forward", 0, 0, "XNNStaticTranspose")
    assert len(problem.dims) == 7 and problem.value == 0
    assert "XNNPACK rejects tensors above 6 dims at load" in str(problem)


def test_an_orphaned_qdq_is_reported_as_delegate_outputs_never_written() -> None:
    report = verify_pte(program("stock_qconv3d_relu"))
    outputs = [p for p in report.problems if p.kind == "unwritten_output"]
    assert [(p.method, p.delegate) for p in outputs] == [("forward", 0), ("forward", 0)]
    assert "delegate output 0" in outputs[0].message and "nothing writes it" in outputs[0].message


def test_an_operator_without_kernel_is_named() -> None:
    (problem,) = verify_pte(program("stock_maxpool3d")).problems
    assert (problem.kind, problem.op) == ("missing_kernel", "aten::max_pool3d_with_indices.out")


def test_a_3d_convolution_outside_xnnpack_is_reported_before_it_runs() -> None:
    (problem,) = verify_pte(program("guarded_qconv3d_relu")).problems
    assert (problem.kind, problem.method, problem.op) == ("unsupported_input", "forward", "aten::convolution.out")
    assert problem.dims == (1, 3, 4, 6, 6)
    assert "kernel for aten::convolution.out computes 1-D and 2-D convolutions only" in problem.message


def _portable_program(model: torch.nn.Module, x: torch.Tensor) -> bytes:
    """``model`` lowered with no partitioner: every op on ExecuTorch's portable kernels."""
    from executorch.exir import to_edge

    return to_edge(torch.export.export(model.eval(), (x,))).to_executorch().buffer


def test_a_2d_convolution_on_the_portable_kernel_is_fine() -> None:
    report = verify_pte(_portable_program(torch.nn.Conv2d(3, 4, 3), torch.randn(1, 3, 8, 8)))
    assert report.ok, str(report)


def test_the_3d_convolution_check_is_a_kernel_check() -> None:
    buffer = _portable_program(torch.nn.Conv3d(3, 4, 3), torch.randn(1, 3, 4, 6, 6))
    assert verify_pte(buffer).kinds() == {"unsupported_input"}
    assert verify_pte(buffer, kernels=False).ok


def test_the_report_counts_what_was_checked() -> None:
    report = verify_pte(program("stock_qconv3d_relu"))
    assert (report.methods, report.delegates, report.nodes, report.values) == (1, 2, 3, 5)


def test_a_path_and_its_bytes_get_the_same_verdict(tmp_path) -> None:
    path = write_program(tmp_path, "stock_rank7")
    from_path, from_bytes = verify_pte(path), verify_pte(memoryview(program("stock_rank7")))
    assert from_path.problems == from_bytes.problems and from_path.source == str(path)


def test_assert_pte_ok_returns_the_report_of_a_good_program() -> None:
    assert assert_pte_ok(program("stock_float_conv_linear")).delegates == 1


def test_assert_pte_ok_raises_listing_every_problem() -> None:
    with pytest.raises(AssertionError) as failure:
        assert_pte_ok(program("stock_rank7"))
    assert str(failure.value).count("[rank]") == 3
