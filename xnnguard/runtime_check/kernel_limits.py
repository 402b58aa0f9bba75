"""Kernel calls outside the delegates that the runtime has a kernel for, but not for these arguments.

ExecuTorch 1.5.1's portable convolution computes 1-D and 2-D convolutions only: a 3-D convolution left
outside XNNPACK (the stock partitioner never takes one; xnnguard's rewrite may leave one, e.g. with a
dynamic depth) loads, then fails the first time the method runs ("Expect input tensor to be 3-D or
4-D, but got, 5"). The runtime finds it only by running; the program says it up front: the rank of the
call's weight (``xnnguard.rules.conv3d``).
"""

from __future__ import annotations

from xnnguard.rules.conv3d import is_3d_convolution_weight
from xnnguard.runtime_check.pte_reader import KernelCall, Method
from xnnguard.runtime_check.report import Problem

__all__ = ["unsupported_input_problems"]

_CONVOLUTION = "aten::convolution.out"  # (input, weight, bias, stride, padding, dilation, transposed, ...)


def _is_3d_convolution(call: KernelCall) -> bool:
    weight = call.arg_dims[1] if call.operator == _CONVOLUTION and len(call.arg_dims) > 1 else None
    return weight is not None and is_3d_convolution_weight(len(weight))


def unsupported_input_problems(method: Method) -> list[Problem]:
    return [
        Problem(
            "unsupported_input",
            f"the runtime's kernel for {call.operator} computes 1-D and 2-D convolutions only and this one "
            "is 3-D: the method fails when it runs (xnnguard.rewrite_for_xnnpack keeps it on XNNPACK)",
            method=method.name,
            op=call.operator,
            value=call.args[0],
            dims=call.arg_dims[0],
        )
        for call in method.kernel_calls
        if _is_3d_convolution(call)
    ]
