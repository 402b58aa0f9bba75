"""Shape propagation as XNNPACK does it at the first execute (``xnn_reshape_runtime``, src/runtime.c).

The serialized dims of internal values are only a hint: at every execute XNNPACK takes the shapes of the
tensors ExecuTorch passes in (``XNNExecutor::prepare_args``, permuted by their dim order), runs each
node's ``reshape`` in order, and resizes ExecuTorch's output tensors to what comes out
(``XNNExecutor::resize_outputs``). A reshape that fails, or an output that cannot take its new shape,
fails the method when it first runs even though the program loaded. This module runs that propagation
on the serialized graph; each node type's shape rule lives with the node's other checks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from xnnguard.runtime_check.define_checks.base import AT_RUN, Finding, NodeView, element_bytes as _element_bytes
from xnnguard.runtime_check.pte_reader import DelegateCall, TensorMeta
from xnnguard.runtime_check.xnnpack_blob import XnnGraph, XnnValue

__all__ = [
    "Reshape",
    "ReshapeFailure",
    "Shape",
    "ShapeOf",
    "broadcast",
    "propagate_shapes",
    "require",
    "require_channels_agree",
]

logger = logging.getLogger("xnnguard.runtime_check")

Shape = tuple[int, ...]
ShapeOf = Callable[[str], Shape]  # the runtime shape of the value in an id field
Reshape = Callable[[NodeView, ShapeOf], dict[str, Shape]]  # output id field -> shape


class ReshapeFailure(Exception):
    """A node's reshape fails: the message says why (it ends up in a ``shape`` problem)."""


class _Unknown(Exception):
    """An input's runtime shape is not known (it comes from a node whose reshape failed or is not modelled)."""


class _ChannelsDisagree(ReshapeFailure):
    """A convolution's or fully connected's input has other channels than the node was created for: the
    XNNPACK of ExecuTorch 1.5 checks this at reshape; the older XNNPACK of 1.4 does not, and runs the node
    on them (measured: tests/test_runtime_check_define.py, the reshape_convolution and
    reshape_fully_connected cases)."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ReshapeFailure(message)


def require_channels_agree(condition: bool, message: str) -> None:
    """``require`` for the channel agreement of a convolution or fully connected."""
    if not condition:
        raise _ChannelsDisagree(message)


# Past this many bytes for one tensor or one operator buffer, XNNPACK's allocation at the first run fails
# (xnn_status_out_of_memory, "Propagating input shapes failed"): 16 GiB, beyond any device it runs on.
ALLOCATION_LIMIT = 2**34


def require_allocatable(size: int, what: str) -> None:
    """``size`` bytes for ``what`` (an intermediate tensor, an indirection buffer) can be allocated."""
    require(size <= ALLOCATION_LIMIT, f"{what} would take {size / 2**30:.3g} GiB, more than XNNPACK can allocate")


def broadcast(first: Shape, second: Shape, what: str) -> Shape:
    """NumPy-style broadcasting as ``xnn_reshape_binary_elementwise_nd`` does it (rank-0 is [1]; each pair of
    dims, aligned from the right, is equal or one of them is 1)."""
    first, second = first or (1,), second or (1,)
    rank = max(len(first), len(second))
    a, b = (1,) * (rank - len(first)) + first, (1,) * (rank - len(second)) + second
    out = []
    for index, (x, y) in enumerate(zip(a, b)):
        require(x == y or x == 1 or y == 1, f"{what} {list(first)} and {list(second)} do not broadcast (dim {index})")
        out.append(y if x == 1 else x)
    return tuple(out)


@dataclass(frozen=True)
class _Binding:
    """What the method passes for one external id: the tensor's sizes in XNNPACK's order, and whether it may vary."""

    dims: Shape
    dynamic: bool


def _xnnpack_order(meta: TensorMeta) -> Shape:
    """``dims[j] = sizes[dim_order[j]]`` (XNNExecutor.cpp prepare_args / resize_outputs)."""
    order = meta.dim_order if len(meta.dim_order) == len(meta.sizes) else tuple(range(len(meta.sizes)))
    if sorted(order) != list(range(len(meta.sizes))):
        order = tuple(range(len(meta.sizes)))
    return tuple(meta.sizes[d] for d in order)


def _bindings(calls: Sequence[DelegateCall]) -> dict[int, _Binding]:
    if not calls:
        return {}
    found: dict[int, _Binding] = {}
    for external_id, meta in enumerate(calls[0].arg_tensors):
        if meta is not None:
            found[external_id] = _Binding(_xnnpack_order(meta), meta.dynamic)
    return found


def _output_finding(value: XnnValue, shape: Shape, binding: _Binding) -> Finding | None:
    """``resize_tensor`` of the method's output to XNNPACK's shape: a static tensor keeps its sizes, a
    dynamic one keeps its rank and capacity."""
    if binding.dynamic:
        fits = len(shape) == len(binding.dims) and math.prod(shape) <= math.prod(binding.dims)
    else:
        fits = shape == binding.dims
    if fits:
        return None
    return Finding(
        "shape",
        f"XNNPACK computes delegate output {list(shape)} (external id {value.external_id}) but the method's output "
        f"tensor is {list(binding.dims)}{' at most' if binding.dynamic else ''}: {AT_RUN} (resizing the output fails)",
        value.id,
    )


def propagate_shapes(
    graph: XnnGraph,
    values: dict[int, XnnValue],
    calls: Sequence[DelegateCall],
    reshapes: dict[str, Reshape],
) -> Iterator[tuple[int, Finding]]:
    """(node index or -1, finding) for every reshape that fails and every output that cannot be resized.

    Inputs take the shapes the method passes (its declared sizes, the upper bounds of dynamic ones);
    constants keep their serialized dims. A node whose type has no shape rule here leaves its outputs
    unknown, and nothing downstream of an unknown shape is judged.
    """
    bindings = _bindings(calls)
    shapes: dict[int, Shape] = {}
    for value in values.values():
        if value.is_constant:
            shapes[value.id] = value.dims
        elif value.is_external_input:
            binding = bindings.get(value.external_id)
            shapes[value.id] = binding.dims if binding is not None else value.dims

    for node in graph.nodes:
        reshape = reshapes.get(node.op)
        view = NodeView(node, values)
        outputs = [value_id for value_id in node.outputs]
        if reshape is None:
            for value_id in outputs:
                shapes.pop(value_id, None)
            continue

        def shape_of(field: str, node_ids: dict[str, int] = node.ids) -> Shape:
            value_id = node_ids.get(field)
            if value_id is None or value_id not in shapes:
                raise _Unknown(field)
            return shapes[value_id]

        try:
            computed = reshape(view, shape_of)
        except _Unknown:
            computed = {}
        except _ChannelsDisagree as failure:
            yield (
                node.index,
                Finding(
                    "shape",
                    f"{failure}: {AT_RUN} on the XNNPACK of ExecuTorch 1.5 (its reshape fails); the XNNPACK of 1.4 "
                    "does not check this and runs the node on shapes that do not agree, computing wrong values",
                ),
            )
            computed = {}
        except ReshapeFailure as failure:
            yield node.index, Finding("shape", f"{failure}: {AT_RUN} (XNNPACK's reshape fails)")
            computed = {}
        except (ArithmeticError, IndexError, KeyError, TypeError, ValueError):
            # parameters a define-time check already rejects (a zero stride, a perm out of range): no shape
            logger.debug("no shape for node %d (%s)", node.index, node.op, exc_info=True)
            computed = {}
        for value_id in outputs:
            shapes.pop(value_id, None)
        for field, shape in computed.items():
            written = values.get(node.ids[field])
            size = math.prod(shape) * (_element_bytes(written.datatype) if written is not None else 1)
            if size > ALLOCATION_LIMIT:
                yield (
                    node.index,
                    Finding(
                        "shape",
                        f"its output {list(shape)} would take {size / 2**30:.3g} GiB, more than XNNPACK can allocate: "
                        f"{AT_RUN} (XNNPACK's reshape fails)",
                        node.ids[field],
                    ),
                )
                continue
            shapes[node.ids[field]] = shape

    for value in values.values():
        if value.is_external_output and value.id in shapes:
            binding = bindings.get(value.external_id)
            if binding is not None and (finding := _output_finding(value, shapes[value.id], binding)) is not None:
                yield -1, finding
