"""A whole network of ``testbed.networks`` through xnnguard's flow (or stock ExecuTorch's), stage by stage.

``lower_network`` builds a network (``fp16``: made float16), exports it (with a dynamic batch if asked),
rewrites it (``xnnguard.XnnpackRewriter``), quantizes it for int8 (pt2e with ``xnnguard.XNNPACKQuantizer``,
per-channel symmetric, static or dynamic, calibrated on the example input, after the rewrite), lowers it
with ``xnnguard.XnnpackPartitioner``, serializes, loads and runs it with the real runtime, and compares
with eager (float; fp16: eager float16, ``testbed.flow.half_reference``) or the converted pt2e model
(int8) by ``testbed.tolerance``'s whole-network verdict. With
``stock=True`` it does the same with ExecuTorch's own partitioner and quantizer and no rewrite. Every
failure is caught and named by its stage; the result is plain data (it crosses processes).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import xnnguard
from testbed.quantize import xnnguard_quantizer, xnnpack_quantizer
from testbed.rounding_floor import rounding_floor
from testbed.tolerance import NETWORK_TOLERANCE, mean_relative_error, network_matches, relative_error
from xnnguard.compat import load_quantized_kernels

__all__ = [
    "MAX_DELEGATES",
    "NOT_COMPUTE",
    "PRECISIONS",
    "Result",
    "StageError",
    "compute_outside",
    "count_graph",
    "describe_error",
    "dynamic_batch",
    "dynamic_frames",
    "failure_lines",
    "frames_example",
    "longer_clip",
    "lower_network",
    "matches",
    "stage",
    "verdict_tolerance",
]

PRECISIONS = ("float", "fp16", "static", "dynamic")
# Issue 12's target: at most this many XNNPACK delegates per network, and no compute op outside them.
MAX_DELEGATES = 3
# What a graph outside the delegates may keep without counting as compute left on portable kernels.
NOT_COMPUTE = ("getitem", "executorch_call_delegate", "alloc", "sym_size", "_assert", "dim_order_ops")


@dataclass
class Result:
    """Everything one (network, precision, flow) lowering produced, as plain data (it crosses processes)."""

    network: str
    size: str
    precision: str
    flow: str  # "xnnguard" or "stock"
    batch: str = "static"  # "dynamic": a dynamic batch (see dynamic_batch); "frames": dynamic frames (dynamic_frames)
    status: str = "ok"  # "ok", "mismatch", or "<stage> failed"
    error: str = ""
    delegates: int | None = None
    delegated_ops: int | None = None
    outside: int | None = None
    outside_kinds: list[tuple[str, int]] = field(default_factory=list)
    max_err: float | None = None
    float_err: float | None = None  # int8 only: the same measure against the float eager model
    reference_float_err: float | None = None  # int8 only: the converted model's own error against float
    float_mean_err: float | None = None  # int8 only: mean abs error against float, over float's max abs value
    reference_float_mean_err: float | None = None  # int8 only: the converted model's, the same way
    rounding_floor: float | None = None  # int8, measured only when the verdict needs it (verdict_tolerance)
    rewrite_report: list[str] = field(default_factory=list)
    kept_out: list[str] = field(default_factory=list)
    no_equivalent: list[str] = field(default_factory=list)  # ops of the kept-out nodes no XNNPACK node computes
    left_in_float: list[str] = field(default_factory=list)
    lower_s: float | None = None
    pte: str | None = None
    eager_ms: float | None = None
    et_ms: float | None = None
    stage_s: dict[str, float] = field(default_factory=dict)  # seconds per stage of the flow
    long_frames: int | None = None  # "frames": the longer clip the program also ran at (twice the example's)
    long_err: float | None = None  # "frames": max_err at long_frames
    long_et_ms: float | None = None  # "frames": ExecuTorch ms at long_frames


class StageError(Exception):
    """A stage of the flow failed; ``stage`` names it, the cause is chained."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage


@contextmanager
def stage(name: str, result: Result, log: Callable[[], str] | None = None) -> Iterator[None]:
    """Time the block into ``result.stage_s``; turn its exception into a ``StageError`` naming the stage.

    The exact message is kept; ``log`` gives the runtime's own failure lines (the pybindings' exceptions
    only carry an error code).
    """
    started = time.perf_counter()
    try:
        yield
    except StageError:
        raise
    except Exception as error:
        message = describe_error(error)
        runtime = log() if log is not None else ""
        if runtime:
            message += f" | runtime log: {runtime}"
        if name == "run" and "Init failed" in runtime:  # the pybindings load a method on its first call
            name = "init (first call)"
        raise StageError(name, message) from error
    finally:
        result.stage_s[name] = result.stage_s.get(name, 0.0) + time.perf_counter() - started


def describe_error(error: BaseException) -> str:
    """The exception and what caused it: ExecuTorch's pass manager wraps the real error in a generic one."""
    parts, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}".strip())
        current = current.__cause__ or current.__context__
    return " | caused by: ".join(parts)


def _quantizer(precision: str, stock: bool) -> Any:
    if stock:
        load_quantized_kernels()  # q/dq the stock partitioner leaves outside need them; see testbed.lowered

        return xnnpack_quantizer(dynamic=precision == "dynamic")
    return xnnguard_quantizer(dynamic=precision == "dynamic")


def _partitioner(stock: bool) -> Any:
    if stock:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        return XnnpackPartitioner()
    import xnnguard

    return xnnguard.XnnpackPartitioner()


def _first_tensor(output: Any) -> torch.Tensor:
    while isinstance(output, list | tuple):
        output = output[0]
    assert isinstance(output, torch.Tensor), f"the network returned {type(output).__name__}, not a tensor"
    return output


def _op_name(target: Any) -> str:
    """``aten.permute_copy.default`` for an edge op, the function's name for anything else."""
    name = str(target)
    return name if "." in name and " " not in name else getattr(target, "__name__", name)


def count_graph(edge: Any, result: Result) -> None:
    """Delegates, ops inside them, and call_function nodes left outside (by kind) in the top-level graph."""
    gm = edge.exported_program().graph_module
    outside: Counter[str] = Counter()
    delegates = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = _op_name(node.target)
        if "executorch_call_delegate" in name:
            delegates += 1
        elif "getitem" not in name:
            outside[name] += 1
    result.delegates = delegates
    result.delegated_ops = sum(
        1 for _, child in gm.named_children() if hasattr(child, "original_module")
        for node in child.original_module.graph.nodes if node.op == "call_function")
    result.outside = sum(outside.values())
    result.outside_kinds = outside.most_common()


def _prepare(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], result: Result,
             stock: bool) -> tuple[Any, Callable[..., Any], Any]:
    """Export, rewrite (xnnguard flow) and quantize (int8): the program to lower, its reference and the
    converted pt2e model (None unless int8).

    The reference is eager for float and the converted pt2e model for int8: it isolates what lowering
    and the runtime change from what quantization itself changes.
    """
    dynamic_shapes = getattr(model, "export_dynamic_shapes", None)  # a network exported with dynamic dims
    export_inputs = inputs
    if result.batch == "frames":
        dynamic_shapes, export_inputs = dynamic_frames(inputs), frames_example(model, inputs)
    if result.batch == "dynamic" and dynamic_shapes is None:
        # a network without a batch dim says what varies instead (Qwen2-VL's tower: the patch count)
        dynamic_shapes = getattr(model, "dynamic_batch_shapes", None)
        if dynamic_shapes is None:
            export_inputs, dynamic_shapes = dynamic_batch(inputs)
    with stage("export", result):
        ep = torch.export.export(model, export_inputs, dynamic_shapes=dynamic_shapes)
    if not stock:
        import xnnguard

        rewriter = xnnguard.XnnpackRewriter()
        with stage("rewrite", result):
            ep = rewriter(ep)
        result.rewrite_report = [str(record) for record in rewriter.report]
    if result.precision == "float":
        return ep, _no_grad(model), None
    if result.precision == "fp16":
        from testbed.flow import half_reference

        return ep, lambda *xs: half_reference(model, xs), None
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = _quantizer(result.precision, stock)
    with stage("quantize", result):
        prepared = prepare_pt2e(ep.module(), quantizer)
        prepared(*inputs)  # calibrate on the example input
        converted = convert_pt2e(prepared)
        ep = torch.export.export(converted, export_inputs, dynamic_shapes=dynamic_shapes)
    result.left_in_float = [str(record) for record in getattr(quantizer, "left_in_float", ())]
    return ep, _no_grad(converted), converted


def _no_grad(model: Any) -> Callable[..., Any]:
    def reference(*xs: torch.Tensor) -> Any:
        with torch.no_grad():
            return model(*xs)

    return reference


def dynamic_frames(inputs: tuple[torch.Tensor, ...]) -> tuple[dict[int, Any] | None, ...]:
    """Dynamic shapes for a dynamic frame count: a clip ``(N, C, T, H, W)``'s T from 2 to twice the example's
    (``Dim.DYNAMIC``: export narrows the range or adds the divisibility the network needs)."""
    if inputs[0].dim() != 5:
        raise ValueError(f"the network's input is {inputs[0].dim()}-D, not a clip (N, C, T, H, W)")
    frames = torch.export.Dim.DYNAMIC(min=2, max=2 * inputs[0].shape[2])  # type: ignore[attr-defined]
    return ({2: frames}, *(None for _ in inputs[1:]))


def frames_example(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The inputs export traces a dynamic frame count at: the network's own, or the longer clip it asks for
    (``dynamic_frames_example``, seeded): a layer that sees one frame at the example is left as it was, since
    tracing it there would bake that 1 in (S3D after its temporal strides)."""
    frames = getattr(model, "dynamic_frames_example", None)
    if frames is None:
        return inputs
    generator = torch.Generator().manual_seed(0)
    clip = torch.randn(*inputs[0].shape[:2], frames, *inputs[0].shape[3:], generator=generator)
    return (clip.to(inputs[0].dtype), *inputs[1:])


def longer_clip(ep: Any, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...] | None:
    """The inputs with twice the example's frames (seeded), or None when the exported range stops short."""
    frames = ep.graph_module.graph.find_nodes(op="placeholder")[-len(inputs)].meta["val"].shape[2]
    length = 2 * inputs[0].shape[2]
    if isinstance(frames, int):
        return None
    expr = frames.node.expr
    uppers = {symbol: bound.upper for symbol, bound in ep.range_constraints.items() if symbol in expr.free_symbols}
    longest = expr.subs(uppers)
    if longest.is_number and longest.is_finite and int(longest) < length:
        return None
    generator = torch.Generator().manual_seed(0)
    clip = torch.randn(*inputs[0].shape[:2], length, *inputs[0].shape[3:], generator=generator)
    return (clip.to(inputs[0].dtype), *inputs[1:])


def dynamic_batch(inputs: tuple[torch.Tensor, ...]) -> tuple[tuple[torch.Tensor, ...], tuple[dict[int, Any], ...]]:
    """Export inputs and dynamic shapes for a dynamic batch, as export pipelines often keep one.

    The example is the input repeated to batch 2 (an example batch of 1 would be specialized away); the
    program is then run and compared at the network's own batch of 1, another batch than it was traced at.
    """
    batch = torch.export.Dim("batch", min=1, max=4)
    return (tuple(x.repeat(2, *[1] * (x.dim() - 1)) for x in inputs),
            tuple({0: batch} for _ in inputs))


def lower_network(name: str, size: str, precision: str, stock: bool, pte_dir: Path,
                  batch: str = "static") -> Result:
    """Build, export, rewrite, quantize, lower, serialize, load, run and compare one network."""
    from executorch.exir import to_edge_transform_and_lower

    from testbed.networks import NETWORKS
    from xnnguard.boundary.runtime import load_module
    from xnnguard.report import Rule
    from xnnguard.runtime_check.runtime_load import captured_stderr

    result = Result(name, size, precision, "stock" if stock else "xnnguard", batch=batch)
    try:
        with stage("build", result):
            model, inputs = NETWORKS[name](size)
            if precision == "fp16":
                model, inputs = model.half(), tuple(t.half() if t.is_floating_point() else t for t in inputs)
        if batch == "frames" and inputs[0].dim() != 5:
            result.status, result.error = "n/a", "not a video network: its input has no frame dim"
            return result
        started = time.perf_counter()
        ep, reference, converted = _prepare(model, inputs, result, stock)
        expected = _first_tensor(reference(*inputs))
        longer = longer_clip(ep, inputs) if batch == "frames" else None
        partitioner = _partitioner(stock)
        # xnnguard's flow lowers as the README says (the stock flow as users of ExecuTorch do)
        keep_ranges = nullcontext if stock else xnnguard.keep_dynamic_ranges
        with stage("lower", result), keep_ranges():
            edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
        count_graph(edge, result)
        result.kept_out = [str(record) for record in getattr(partitioner, "kept_out", ())]
        result.no_equivalent = [record.op for record in getattr(partitioner, "kept_out", ())
                                if record.rule is Rule.NO_XNNPACK_EQUIVALENT]
        with stage("serialize", result), keep_ranges():
            buffer = edge.to_executorch().buffer
        result.lower_s = time.perf_counter() - started
        pte = pte_dir / f"{name}.{size}.{precision}.{batch}.{result.flow}.pte"
        pte.write_bytes(buffer)
        result.pte = str(pte)
        with captured_stderr() as log:

            def failures() -> str:
                return failure_lines(log.text())

            with stage("load", result, failures):
                module = load_module(buffer)  # buffer outlives the module
            with stage("run", result, failures):
                got = _first_tensor(module.forward(inputs))
                if longer is not None:
                    result.long_frames = int(longer[0].shape[2])
                    result.long_err = relative_error(_first_tensor(module.forward(longer)),
                                                     _first_tensor(reference(*longer)))
        result.max_err = relative_error(got, expected)
        if result.long_err is not None and result.max_err is not None:
            result.max_err = max(result.max_err, result.long_err)
        if precision in ("static", "dynamic"):
            with torch.no_grad():
                eager = _first_tensor(model(*inputs))
            result.float_err = relative_error(got, eager)
            result.reference_float_err = relative_error(expected, eager)
            result.float_mean_err = mean_relative_error(got, eager)
            result.reference_float_mean_err = mean_relative_error(expected, eager)
        tolerance = verdict_tolerance(result, lambda: rounding_floor(converted, inputs))
        if not matches(result, tolerance):
            result.status = "mismatch"
            result.error = (f"output shape {tuple(got.shape)} vs {tuple(expected.shape)}" if result.max_err is None
                            else f"max error {result.max_err:.3g} of the output scale > {tolerance:.3g}")
    except StageError as error:
        result.status = f"{error.stage} failed"
        result.error = str(error)
    return result


def compute_outside(result: Result) -> int | None:
    """Compute ops the lowering left outside XNNPACK (on portable kernels) that some XNNPACK node could
    compute: not ``NOT_COMPUTE``, and not what the partitioner names as having no XNNPACK equivalent."""
    if result.outside is None:
        return None
    floor = Counter(result.no_equivalent)
    return sum(max(0, n - floor[kind]) for kind, n in result.outside_kinds
               if not any(word in kind for word in NOT_COMPUTE))


def failure_lines(log: str) -> str:
    """The runtime log's lines that say what failed (cpuinfo's chatter left out)."""
    lines = [line.strip() for line in log.splitlines() if "fail" in line.lower() or "error" in line.lower()]
    return "; ".join(line for line in lines if not line.startswith("[cpuinfo"))[-1500:]




def verdict_tolerance(result: Result, floor: Callable[[], float | None]) -> float:
    """The tolerance ``result`` is judged by: the network tolerance of its precision, or in int8 the
    rounding floor when that is larger (an error below what one-step rounding differences cause is as
    close as rounding allows). The floor (``floor()``, stored in ``result.rounding_floor``) is measured only
    when the result does not already match without it: it costs five forwards of the converted model,
    minutes at full size (the Wan VAE decoder's)."""
    tolerance = NETWORK_TOLERANCE[result.precision]
    if result.precision not in ("static", "dynamic") or matches(result, tolerance):
        return tolerance
    result.rounding_floor = floor()
    return max(tolerance, result.rounding_floor or 0.0)


def matches(result: Result, tolerance: float) -> bool:
    """``testbed.tolerance.network_matches`` of a result."""
    return network_matches(result.precision, result.max_err, tolerance, float_err=result.float_err,
                           reference_float_err=result.reference_float_err, float_mean_err=result.float_mean_err,
                           reference_float_mean_err=result.reference_float_mean_err)
