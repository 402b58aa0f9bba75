"""What the verifier found in one ``.pte``: plain data, printed (or serialized) by whoever wants to."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["KINDS", "MethodCoverage", "MethodMemory", "Problem", "Report", "format_bytes"]

# Every kind of problem, with what it means. The static ones are decided by the blob and program alone.
KINDS: dict[str, str] = {
    "rank": "a tensor above 6 dims, or a rank the graph contradicts",
    "unwritten_value": "a node reads a value nothing writes, or an id that names no value",
    "unwritten_output": "a delegate output nothing writes",
    "extern_ids": "delegate inputs and outputs not bound one-to-one to the call's arguments",
    "blob_format": "the XNNPACK blob cannot be read",
    "flatbuffer": "an XNNPACK graph the runtime's flatbuffers verifier rejects (it names the table and field)",
    "value_def": "a value XNNPACK cannot define (flags, duplicate ids, dynamic quantization)",
    "datatype": "datatypes a node or value does not take, or that differ from the bound tensor",
    "quant_params": "a quantized output whose input does not share its scale and zero point",
    "quant_range": "a zero point, scale, channel dim or requantization scale out of range",
    "node_params": "a node parameter out of range (kernel, stride, perm, paddings, flags, clamp)",
    "shape": "shapes XNNPACK's reshape rejects at the first run, or data smaller than a tensor",
    "allocation": "a buffer no device can allocate (or more memory than --max-memory)",
    "constants": "a constant entry that does not exist or lies outside its data",
    "named_data": "a constant's key the runtime does not find in the named data (or --data file), or cannot load",
    "method_load": "a method whose values, instructions or delegates the runtime cannot load from the Program",
    "unsupported_node": "a node type the runtime cannot build",
    "missing_kernel": "an operator outside the delegates the runtime has no kernel for",
    "missing_backend": "a delegate whose backend id is damaged: the runtime registers no such backend",
    "unsupported_input": "a kernel the runtime has that cannot take the call's inputs",
    "weights": "constant bytes that do not hash to their name (with --weights)",
    "unreadable": "the file is not a readable program",
    "internal": "the checker itself failed on the file (a bug in xnnguard: please report it)",
    "load": "the runtime fails to load a method (--load)",
    "run": "a method fails on generated inputs (--run)",
}


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'s' * (number != 1)}"


_UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(size: float) -> str:
    """``1536`` -> ``1.5 KiB``; bytes below a KiB as they are."""
    unit = 0
    while size >= 1024 and unit < len(_UNITS) - 1:
        size /= 1024
        unit += 1
    return f"{size:.0f} bytes" if unit == 0 else f"{size:.3g} {_UNITS[unit]}"


@dataclass(frozen=True)
class Problem:
    """One thing that will go wrong on device.

    ``kind`` says which check found it (one of ``KINDS``); ``message`` says in a sentence what and what
    will happen. The other fields locate it; None where they do not apply.
    """

    kind: str
    message: str
    method: str | None = None
    delegate: int | None = None
    node: int | None = None
    op: str | None = None
    value: int | None = None
    dims: tuple[int, ...] | None = None

    @property
    def location(self) -> str:
        """``forward/delegate 0/node 3 (XNNConv2d)/value 5 [1, 3, 8, 8]``, only the parts that are known."""
        parts = []
        if self.method is not None:
            parts.append(self.method)
        if self.delegate is not None:
            parts.append(f"delegate {self.delegate}")
        if self.node is not None:
            parts.append(f"node {self.node}" + (f" ({self.op})" if self.op else ""))
        if self.value is not None:
            parts.append(f"value {self.value}" + (f" {list(self.dims)}" if self.dims is not None else ""))
        return "/".join(parts)

    def __str__(self) -> str:
        where = self.location
        return f"[{self.kind}] {where + ': ' if where else ''}{self.message}"


_TOP_OUTSIDE = 5  # operators named on a coverage line; the rest are counted


@dataclass(frozen=True)
class MethodCoverage:
    """Where one method's work runs: XNNPACK nodes by type, and the operator calls left outside the delegates.

    Calls of ExecuTorch's scalar ``executorch_prim`` operators (symbolic sizes) are not counted: they are
    bookkeeping, not compute an XNNPACK delegate could take.
    """

    method: str
    delegates: int  # XNNPACK delegates
    inside: tuple[tuple[str, int], ...] = ()  # XNNPACK node type -> count, most first
    outside: tuple[tuple[str, int], ...] = ()  # operator -> calls outside delegates, most first
    other_delegates: tuple[str, ...] = ()  # delegates of other backends (their ops are not seen)

    @property
    def nodes_inside(self) -> int:
        return sum(count for _, count in self.inside)

    @property
    def calls_outside(self) -> int:
        return sum(count for _, count in self.outside)

    def lines(self) -> list[str]:
        """One summary line, then the operators outside (the most called first), when there are any."""
        inside, outside = self.nodes_inside, self.calls_outside
        line = f"{self.method}: {_count(inside, 'XNNPACK node')} in {_count(self.delegates, 'delegate')}, "
        if outside:
            share = 100 * inside / (inside + outside)
            line += f"{_count(outside, 'operator call')} outside ({share:.0f}% in XNNPACK)"
        else:
            line += "nothing outside"
        if self.other_delegates:
            line += (
                f", {_count(len(self.other_delegates), 'delegate')} of {', '.join(sorted(set(self.other_delegates)))}"
            )
        lines = [line]
        if self.outside:
            named = ", ".join(f"{op} x{count}" for op, count in self.outside[:_TOP_OUTSIDE])
            rest = len(self.outside) - _TOP_OUTSIDE
            lines.append(f"  outside: {named}" + (f", and {rest} more" if rest > 0 else ""))
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "xnnpack_delegates": self.delegates,
            "xnnpack_nodes": dict(self.inside),
            "outside": dict(self.outside),
            "other_delegates": list(self.other_delegates),
        }


@dataclass(frozen=True)
class MethodMemory:
    """What one method needs at least, in bytes, from the sizes in the file (``runtime_check.allocations``).

    ``planned``: the buffers of ExecuTorch's memory plan; ``xnnpack``: XNNPACK's intermediate tensors live at
    its busiest node (its workspace is at least that); ``weights``: the constants XNNPACK copies into its own
    buffers; ``largest``: the largest single buffer among them. ``peak`` is their sum, all held at once.
    """

    method: str
    planned: int
    xnnpack: int
    weights: int
    largest: int

    @property
    def peak(self) -> int:
        return self.planned + self.xnnpack + self.weights

    def describe(self) -> str:
        return (
            f"planned {format_bytes(self.planned)}, XNNPACK tensors {format_bytes(self.xnnpack)}, "
            f"XNNPACK weights {format_bytes(self.weights)}"
        )

    def line(self) -> str:
        return (
            f"{self.method}: needs at least {format_bytes(self.peak)} of memory ({self.describe()}; "
            f"largest buffer {format_bytes(self.largest)})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "peak_bytes": self.peak,
            "planned_bytes": self.planned,
            "xnnpack_tensor_bytes": self.xnnpack,
            "xnnpack_weight_bytes": self.weights,
            "largest_buffer_bytes": self.largest,
        }


@dataclass(frozen=True)
class Report:
    """The verdict on one program: ``ok`` when no problem was found, and what was looked at.

    An input that is not a readable program is a report too, with one ``unreadable`` problem
    (``Report.unreadable``): every input gets one shape of answer.
    """

    source: str
    problems: tuple[Problem, ...] = ()
    methods: int = 0
    delegates: int = 0  # XNNPACK delegates checked
    nodes: int = 0
    values: int = 0
    other_delegates: tuple[str, ...] = ()  # backends of delegates that are not XNNPACK (not checked)
    loaded: bool = False
    ran: bool = False
    coverage: tuple[MethodCoverage, ...] = ()
    weights_checked: int | None = None  # named constants whose bytes were hashed; None: not asked for
    notes: tuple[str, ...] = ()  # what could not be checked, in a sentence each
    memory: tuple[MethodMemory, ...] = ()  # what each method needs at least
    runtime_log: str = field(default="", repr=False)

    @classmethod
    def unreadable(cls, source: str, reason: str) -> Report:
        """The report on an input that is not a readable program (``reason`` does not repeat ``source``)."""
        return cls(source=source, problems=(Problem("unreadable", reason),))

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def readable(self) -> bool:
        return not any(problem.kind in ("unreadable", "internal") for problem in self.problems)

    def kinds(self) -> set[str]:
        return {problem.kind for problem in self.problems}

    def summary(self) -> str:
        """One line: verdict, file and what was checked."""
        if not self.readable:
            return f"ERROR {self.source}: {self.problems[0].message}"
        checked = ", ".join(
            [
                _count(self.methods, "method"),
                _count(self.delegates, "XNNPACK delegate"),
                _count(self.nodes, "node"),
                _count(self.values, "value"),
            ]
        )
        if self.other_delegates:
            checked += f", not checked: {', '.join(self.other_delegates)}"
        if self.weights_checked is not None:
            checked += f", {_count(self.weights_checked, 'weight blob')} hashed"
        if self.loaded:
            checked += ", loaded" + (" and ran" if self.ran else "")
        if self.ok:
            return f"ok    {self.source} ({checked})"
        return f"FAIL  {self.source}: {_count(len(self.problems), 'problem')} ({checked})"

    def __str__(self) -> str:
        if not self.readable:
            return self.summary()
        lines = [self.summary(), *(f"  {problem}" for problem in self.problems)]
        lines += [f"  {line}" for coverage in self.coverage for line in coverage.lines()]
        lines += [f"  {memory.line()}" for memory in self.memory]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the same content as the text form, one shape for every input."""
        data = asdict(self)
        data["ok"] = self.ok
        data["problems"] = [asdict(p) | {"dims": list(p.dims) if p.dims is not None else None} for p in self.problems]
        data["other_delegates"] = list(self.other_delegates)
        data["coverage"] = [coverage.to_dict() for coverage in self.coverage]
        data["notes"] = list(self.notes)
        data["memory"] = [memory.to_dict() for memory in self.memory]
        return data
