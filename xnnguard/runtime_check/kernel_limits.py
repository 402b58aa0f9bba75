"""Kernel calls outside the delegates that the runtime has a kernel for, but not for these arguments.

ExecuTorch 1.5.1's portable convolution computes 1-D and 2-D convolutions only: a 3-D convolution left
outside XNNPACK (the stock partitioner never takes one; xnnguard's rewrite may leave one, e.g. with a
dynamic depth) loads, then fails the first time the method runs ("Expect input tensor to be 3-D or
4-D, but got, 5"). The runtime finds it only by running; the program says it up front: the rank of the
call's weight (``xnnguard.rules.conv3d``).

What to do about it depends on what the program shows, since it carries no record of whether
``xnnguard.rewrite_for_xnnpack`` ran: an input of dynamic shape or a weight computed at run time is
something that rewrite declines (``xnnguard.rewrite.conv3d.operands``), so the advice is what to change
in the export; otherwise the rewrite would take it.
"""

from __future__ import annotations

from xnnguard.rules.conv3d import is_3d_convolution_weight
from xnnguard.runtime_check.pte_reader import DelegateCall, KernelCall, Method, TensorMeta
from xnnguard.runtime_check.report import Problem
from xnnguard.runtime_check.xnnpack_blob import XnnGraph

__all__ = ["Dependencies", "output_dependencies", "unsupported_input_problems"]

_CONVOLUTION = "aten::convolution.out"  # (input, weight, bias, stride, padding, dilation, transposed, ...)
_DEPTH_LIMIT = 16  # how many kernel calls back a weight is traced


def _is_3d_convolution(call: KernelCall) -> bool:
    weight = call.arg_dims[1] if call.operator == _CONVOLUTION and len(call.arg_dims) > 1 else None
    return weight is not None and is_3d_convolution_weight(len(weight))


# (delegate index, external id of an output) -> external ids of the inputs it is computed from
Dependencies = dict[tuple[int, int], frozenset[int]]


def output_dependencies(delegate: int, graph: XnnGraph) -> Dependencies:
    """Which delegate inputs each delegate output is computed from, by the delegate's dataflow."""
    writers = {output: node for node in graph.nodes for output in node.outputs}
    by_id = graph.value_map()
    found: Dependencies = {}
    for value in graph.values:
        if not value.is_external_output:
            continue
        inputs: set[int] = set()
        stack, seen = [value.id], set()
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            source = by_id.get(current)
            if source is not None and source.is_external_input:
                inputs.add(source.external_id)
            if current in writers:
                stack += writers[current].inputs
        found[(delegate, value.external_id)] = frozenset(inputs)
    return found


def _metas(method: Method) -> dict[int, TensorMeta]:
    """EValue -> tensor metadata, from every call that mentions it."""
    found: dict[int, TensorMeta] = {}
    calls: list[KernelCall | DelegateCall] = [*method.kernel_calls]
    calls += [call for delegate in method.delegates for call in delegate.calls]
    for call in calls:
        for arg, meta in zip(call.args, call.arg_tensors):
            if meta is not None:
                found.setdefault(arg, meta)
    return found


def _sources(method: Method, value: int, dependencies: Dependencies, metas: dict[int, TensorMeta]) -> list[list[int]]:
    """For each call that writes ``value``: the tensor EValues it computes it from."""
    found = [  # an out-variant call lists its out argument last, and again as its return value
        [arg for arg in kernel.args if arg in metas and arg != value]
        for kernel in method.kernel_calls
        if kernel.args and kernel.args[-1] == value
    ]
    # a delegate (e.g. one that dequantizes a weight) computes each output from some of its inputs and its
    # own constants
    for delegate in method.delegates:
        for call in delegate.calls:
            for position in range(call.num_inputs, len(call.args)):
                if call.args[position] == value:
                    used = dependencies.get((delegate.index, position), frozenset(range(call.num_inputs)))
                    found.append([call.args[i] for i in sorted(used) if i < call.num_inputs])
    return found


def _from_parameters(
    method: Method, value: int, dependencies: Dependencies, metas: dict[int, TensorMeta], depth: int = 0
) -> bool:
    """Whether EValue ``value`` is a constant, or computed by kernel calls and delegates from constants only
    (a quantized or weight-normalized parameter): what a weight needs for the rewrite to fold it. An
    out-variant kernel call writes its last argument; a delegate call its arguments after its inputs."""
    meta = metas.get(value)
    if meta is not None and meta.constant:
        return True
    sources = _sources(method, value, dependencies, metas)
    if depth >= _DEPTH_LIMIT or len(sources) != 1:
        return False
    return all(_from_parameters(method, arg, dependencies, metas, depth + 1) for arg in sources[0])


def _advice(method: Method, call: KernelCall, dependencies: Dependencies) -> str:
    """What would keep this convolution on XNNPACK, from what the program shows about it."""
    tensors = call.arg_tensors
    source = tensors[0] if tensors else None
    if source is not None and source.dynamic:
        return (
            f"its input has a dynamic shape (at most {list(source.sizes)}), and xnnguard.rewrite_for_xnnpack "
            "keeps one dynamic dim, the batch or the frames (height and width must be static): export the model "
            "with static frames and resolution, or dynamic frames alone, to keep the convolution on XNNPACK"
        )
    if len(call.args) > 1 and not _from_parameters(method, call.args[1], dependencies, _metas(method)):
        return (
            "its weight is computed when the method runs, and xnnguard.rewrite_for_xnnpack folds only weights "
            "computed from parameters: make the weight a parameter (or a function of parameters only)"
        )
    return (
        "xnnguard.rewrite_for_xnnpack turns a static-shape 3-D convolution like this one into 2-D convolutions "
        "XNNPACK runs (if the rewrite ran and left it, its report says why)"
    )


def unsupported_input_problems(method: Method, dependencies: Dependencies | None = None) -> list[Problem]:
    """3-D convolutions on the portable kernel; ``dependencies`` (``output_dependencies`` of each XNNPACK
    delegate) lets the advice see through a delegate that dequantizes a weight."""
    return [
        Problem(
            "unsupported_input",
            f"the runtime's kernel for {call.operator} computes 1-D and 2-D convolutions only and this one "
            f"is 3-D: the method fails when it runs; {_advice(method, call, dependencies or {})}",
            method=method.name,
            op=call.operator,
            value=call.args[0],
            dims=call.arg_dims[0],
        )
        for call in method.kernel_calls
        if _is_3d_convolution(call)
    ]
