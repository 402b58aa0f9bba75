"""verify_pte(load=True / run=True): the real runtime's verdict, with its log captured into the report."""

from __future__ import annotations

import os
import sys
from functools import cache

import pytest

from testbed.lowered import lower
from tests.runtime_check_corpus import ON_ONE_WORKER, program, write_program
from xnnguard.runtime_check import verify_pte
from xnnguard.runtime_check.runtime_load import captured_stderr

pytestmark = [pytest.mark.release_sensitive, ON_ONE_WORKER]


def test_a_rank7_delegate_fails_to_load_with_the_runtimes_own_message() -> None:
    report = verify_pte(program("stock_rank7"), load=True)
    (load,) = [p for p in report.problems if p.kind == "load"]
    assert load.method == "forward"
    assert "Failed to define tensor" in load.message
    assert not report.loaded


def test_an_orphaned_qdq_fails_to_create_the_xnnpack_runtime() -> None:
    (load,) = [p for p in verify_pte(program("stock_qconv3d_relu"), load=True).problems if p.kind == "load"]
    assert "XNN Runtime creation failed" in load.message


def test_a_missing_kernel_is_what_the_runtime_fails_on_too() -> None:
    report = verify_pte(program("stock_maxpool3d"), load=True)
    assert report.kinds() == {"missing_kernel", "load"}
    assert "kernel 'aten::max_pool3d_with_indices.out' not found" in report.runtime_log


def test_a_good_program_loads_and_runs(tmp_path) -> None:
    report = verify_pte(write_program(tmp_path, "stock_qconv_linear"), run=True)
    assert report.ok and report.loaded and report.ran


def test_a_conv3d_left_to_the_portable_kernel_fails_when_run_as_the_static_check_says() -> None:
    report = verify_pte(program("guarded_qconv3d_relu"), run=True)
    assert report.kinds() == {"unsupported_input", "run"}
    (problem,) = [p for p in report.problems if p.kind == "run"]
    assert problem.method == "forward"
    assert "aten::convolution.out" in problem.message and report.loaded and not report.ran


def test_runtime_log_lines_go_into_the_report_not_to_stderr(capfd) -> None:
    report = verify_pte(program("stock_rank7"), load=True)
    assert "XNNCompiler" in report.runtime_log
    assert "XNNCompiler" not in capfd.readouterr().err


def test_both_stderr_streams_are_captured_and_restored() -> None:
    before_fd, before_stream = os.fstat(2), sys.stderr
    with captured_stderr() as capture:
        os.write(2, b"native line\n")
        print("python line", file=sys.stderr)
        assert capture.text() == "native line\npython line\n"
    after_fd = os.fstat(2)
    assert (before_fd.st_dev, before_fd.st_ino) == (after_fd.st_dev, after_fd.st_ino)
    assert sys.stderr is before_stream


def test_a_missing_kernel_load_failure_carries_the_runtimes_log_lines() -> None:
    """The 0x14 of a missing kernel is explained by the runtime's "kernel ... not found" line, as others are."""
    (load,) = [p for p in verify_pte(program("stock_maxpool3d"), load=True).problems if p.kind == "load"]
    assert "error: 0x:14" in load.message
    assert "kernel 'aten::max_pool3d_with_indices.out' not found" in load.message


@cache
def _conv3d_with_dynamic_height() -> bytes:
    """A Conv3d exported with a dynamic frame count: xnnguard's rewrite declines it, the partitioner keeps it out."""
    import torch
    from torch.export import Dim

    import xnnguard
    from xnnguard.example_models import Conv3dReLU

    x = (torch.randn(1, 3, 4, 6, 6),)
    ep = torch.export.export(Conv3dReLU().eval(), x, dynamic_shapes=({3: Dim("height", min=2, max=8)},))
    rewriter = xnnguard.XnnpackRewriter()
    ep = rewriter(ep)
    assert [record.rule for record in rewriter.report] == [xnnguard.Rule.CONV3D]  # declined, and said so
    return lower(ep, x, xnnguard.XnnpackPartitioner()).buffer


def test_the_advice_on_a_3d_convolution_the_rewrite_declined_says_what_to_change() -> None:
    (problem,) = verify_pte(_conv3d_with_dynamic_height()).problems
    assert problem.kind == "unsupported_input"
    assert "its input has a dynamic shape (at most [1, 3, 4, 8, 6])" in problem.message
    assert "export the model with static frames and resolution" in problem.message
    assert "turns a static-shape 3-D convolution" not in problem.message


def test_the_advice_on_a_static_3d_convolution_is_the_rewrite() -> None:
    """Its weight is dequantized by a delegate from a constant: a parameter the rewrite folds."""
    (problem,) = verify_pte(program("guarded_qconv3d_relu")).problems
    assert "xnnguard.rewrite_for_xnnpack turns a static-shape 3-D convolution like this one" in problem.message


def test_the_advice_sees_a_weight_dequantized_by_a_kernel_as_a_parameter() -> None:
    report = verify_pte(program("stock_qconv3d_relu_per_channel"))
    (problem,) = [p for p in report.problems if p.kind == "unsupported_input"]
    assert "xnnguard.rewrite_for_xnnpack turns a static-shape 3-D convolution like this one" in problem.message


def test_the_advice_on_a_3d_convolution_whose_weight_depends_on_the_input_says_so() -> None:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    class InputScaledConv3d(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(4, 3, 3, 3, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.conv3d(x, self.weight * x.mean())

    x = (torch.randn(1, 3, 4, 6, 6),)
    (problem,) = verify_pte(lower(InputScaledConv3d().eval(), x, XnnpackPartitioner()).buffer).problems
    assert problem.kind == "unsupported_input"
    assert "its weight is computed when the method runs" in problem.message
