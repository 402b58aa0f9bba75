"""The memory a method needs, from the sizes in the file: what the runtime allocates when it loads and runs it.

Three kinds of buffers, all sized by the file alone:

* ExecuTorch's memory plan: each ``non_const_buffer_sizes`` entry is one buffer the runtime allocates when
  it loads the program (the Python runtime allocates them all up front, ``pybindings.cpp:1419-1446``); a
  negative or impossible size fails the load (``std::bad_alloc``);
* XNNPACK's intermediate tensors: every value of a delegate that is neither a method input or output nor a
  constant lives in XNNPACK's workspace from the first node that touches it to the last. XNNPACK plans the
  workspace at the first run (``xnn_plan_memory``, src/runtime.c) and allocates it in one piece, so the
  busiest node's live tensors are a lower bound of its size (the planner may leave gaps between them). Its
  size comes from the dims XNNPACK defines the values with, which is where a damaged dim ends up: a tensor
  beyond what can be allocated fails the first run ("Propagating input shapes failed with code:
  xnn_status_out_of_memory"), and one whose size overflows 64 bits wraps to a small buffer written past;
* XNNPACK's weights: the constants, which XNNPACK copies (packs) into its own buffers when it creates the
  runtime.

``method_memory`` gives the figures per method (``MethodMemory``); ``allocation_problems`` the sizes no
device can allocate, and, with a limit (``verify --max-memory``), a method that needs more than it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from xnnguard.runtime_check.define_checks.base import AT_LOAD, AT_RUN, element_bytes
from xnnguard.runtime_check.define_checks.shapes import ALLOCATION_LIMIT
from xnnguard.runtime_check.pte_reader import Method
from xnnguard.runtime_check.report import MethodMemory, Problem, format_bytes
from xnnguard.runtime_check.xnnpack_blob import XnnGraph, XnnValue

__all__ = ["allocation_problems", "method_memory"]

_SIZE_LIMIT = 2**64  # size_t


def _bytes(value: XnnValue) -> int:
    return math.ceil(math.prod(value.dims) * element_bytes(value.datatype))


def _live_peak(graph: XnnGraph) -> int:
    """The largest sum of intermediate tensor bytes live at one node (a value is live from the first node
    that reads or writes it to the last; an aliased output shares its input's bytes). Linear: one pass over
    the nodes, one over the values."""
    sizes = {value.id: _bytes(value) for value in _intermediates(graph)}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for node in graph.nodes:
        for value_id in (*node.inputs, *node.outputs):
            first.setdefault(value_id, node.index)
            last[value_id] = node.index
    change = [0] * (len(graph.nodes) + 1)
    for value_id, start in first.items():
        size = sizes.get(value_id)
        if size is None:
            continue
        change[start] += size
        change[last[value_id] + 1] -= size
    peak = live = 0
    for delta in change:
        live += delta
        peak = max(peak, live)
    return peak


# XNNPACK lets these nodes' outputs reuse their input's memory (optimize_tensor_allocation_for_in_place_operations,
# src/runtime.c:400-440): their own dims are not what it allocates. Measured: a StaticReshape output declared
# with 2**32 rows runs; any other intermediate declared that large fails the first run.
_ALIASED_OUTPUTS = frozenset({"XNNStaticReshape"})


def _intermediates(graph: XnnGraph) -> Iterable[XnnValue]:
    """Values XNNPACK allocates in its workspace by the dims they are defined with."""
    aliased = {value_id for node in graph.nodes if node.op in _ALIASED_OUTPUTS for value_id in node.outputs}
    return (
        value
        for value in graph.values
        if not value.is_external and not value.is_constant and value.id not in aliased
    )


def method_memory(method: Method, graphs: list[XnnGraph]) -> MethodMemory:
    """What ``method`` needs: its planned buffers, XNNPACK's busiest intermediates and weights, the largest one."""
    planned = sum(max(size, 0) for size in method.planned_buffers)
    workspace = sum(_live_peak(graph) for graph in graphs)
    weights = sum(_bytes(value) for graph in graphs for value in graph.values if value.is_constant)
    largest = max(
        [
            *(max(size, 0) for size in method.planned_buffers),
            *(_bytes(value) for graph in graphs for value in graph.values if not value.is_external),
        ],
        default=0,
    )
    return MethodMemory(method.name, planned, workspace, weights, largest)


def _value_problems(graph: XnnGraph, method: str, delegate: int) -> Iterable[Problem]:
    for value in _intermediates(graph):
        size = _bytes(value)
        if size <= ALLOCATION_LIMIT:
            continue
        if size >= _SIZE_LIMIT:
            what = f"takes {size:.3g} bytes, more than a 64-bit size holds: the size wraps and XNNPACK writes past it"
        else:
            what = f"takes {format_bytes(size)}, more than XNNPACK can allocate"
        yield Problem(
            "allocation",
            f"intermediate tensor {list(value.dims)} of {value.datatype} {what}: {AT_RUN} "
            '("Propagating input shapes failed": out of memory)',
            method=method,
            delegate=delegate,
            value=value.id,
            dims=value.dims,
        )


def allocation_problems(
    method: Method, graphs: list[tuple[int, XnnGraph]], memory: MethodMemory, max_memory: int | None = None
) -> list[Problem]:
    """Buffers no device can allocate, and with ``max_memory`` a method that needs more than that."""
    problems: list[Problem] = []
    for index, size in enumerate(method.planned_buffers):
        if size < 0 or size > ALLOCATION_LIMIT:
            problems.append(
                Problem(
                    "allocation",
                    f"memory-planned buffer {index + 1} takes {size} bytes, which the runtime cannot allocate: "
                    f"{AT_LOAD} (the Python runtime fails to load the program)",
                    method=method.name,
                )
            )
    for delegate, graph in graphs:
        problems += _value_problems(graph, method.name, delegate)
    if max_memory is not None and memory.peak > max_memory:
        problems.append(
            Problem(
                "allocation",
                f"needs at least {format_bytes(memory.peak)} ({memory.describe()}), more than --max-memory "
                f"{format_bytes(max_memory)}",
                method=method.name,
            )
        )
    return problems
