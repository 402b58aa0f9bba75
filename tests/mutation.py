"""Structure-aware mutation of real ``.pte`` files: change one field of an XNNPACK graph, in place.

* ``xnnpack_fields(data)`` lists every field the runtime reads from the XNNPACK graphs of a program
  (value ids, dims, datatypes, flags, quantization parameters, node parameters and ids, output
  clamps, ``num_externs``), with its byte offset, width and current value;
* ``with_field(data, field, value)`` returns a copy of the program with that one field changed: what
  a test needs to build a program that breaks exactly one rule;
* ``mutants(data, count, seed)`` draws seeded single-field mutants for the mutation test;
* ``RuntimeSandbox`` loads and runs programs with the real runtime in a worker process, so a program
  that crashes the native runtime costs a worker restart, not the test.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xnnguard.runtime_check.fbs_schema import FieldKind
from xnnguard.runtime_check.flatbuffer_view import TableView
from xnnguard.runtime_check.pte_reader import read_methods
from xnnguard.runtime_check.xnnpack_blob import XNNPACK_BACKEND_ID, graph_table

__all__ = ["Field", "RuntimeSandbox", "edit", "field", "mutants", "node_value", "with_field", "xnnpack_fields"]

_ID_FIELDS = ("id_out", "external_id", "constant_buffer_idx", "scale_buffer_idx")
_QUANT_TABLES = ("PerTensorQuant", "PerChannelQuant", "PerChannelGroupQuant", "PerTokenDynamicQuant")
NO_VALUE = 0xFFFFFFFF


@dataclass(frozen=True)
class Field:
    """One serialized field: where (``path``, e.g. ``delegate 0/node 3 XNNConv2d/kernel_height``), what kind
    (``id``, ``dims``, ``datatype``, ``flags``, ``quant``, ``param``, ``externs``, ``length`` of a vector,
    ``union`` type tag), its byte offset in the file, its struct format and its value."""

    path: str
    category: str
    offset: int
    fmt: str
    value: Any


def _category(table: str, name: str) -> str:
    if name == "datatype" or name == "dq_datatype":
        return "datatype"
    if name == "flags":
        return "flags"
    if name == "dims":
        return "dims"
    if table in _QUANT_TABLES:
        return "quant"
    if name in _ID_FIELDS or name.endswith("_id"):
        return "id"
    return "param"


def _table_fields(view: TableView, path: str, data: bytes) -> Iterator[Field]:
    for name, definition in view.fields.items():
        if definition.kind is FieldKind.SCALAR:
            offset = view.field_offset(name)
            if offset is not None:
                value = struct.unpack_from(definition.scalar_format, data, offset)[0]
                yield Field(f"{path}/{name}", _category(view.name, name), offset, definition.scalar_format, value)
        elif definition.kind is FieldKind.SCALAR_VECTOR:
            length = view.vector_length_offset(name)
            if length is not None:
                value = struct.unpack_from("<I", data, length)[0]
                yield Field(f"{path}/{name}.length", "length", length, "<I", value)
            for index, offset in enumerate(view.element_offsets(name)):
                value = struct.unpack_from(definition.scalar_format, data, offset)[0]
                category = "dims" if name == "dims" else _category(view.name, name)
                yield Field(f"{path}/{name}[{index}]", category, offset, definition.scalar_format, value)


def xnnpack_fields(data: bytes) -> list[Field]:
    """Every field of every XNNPACK graph in the program, in file order of discovery."""
    fields: list[Field] = []
    for method in read_methods(data, "mutation source"):
        for delegate in method.delegates:
            if delegate.backend != XNNPACK_BACKEND_ID:
                continue
            graph = graph_table(delegate.blob)
            where = f"{method.name}/delegate {delegate.index}"
            offset = graph.field_offset("num_externs")
            if offset is not None:
                fields.append(Field(f"{where}/num_externs", "externs", offset, "<I", graph.scalar("num_externs")))
            for index, value in enumerate(graph.tables("xvalues")):
                kind, table = value.union("xvalue_union")
                if table is None:
                    continue
                if kind == "XNNQuantizedTensorValue":
                    quant_kind, params = table.union("quant_params")
                    tag = table.union_tag_offset("quant_params")
                    if tag is not None:
                        fields.append(Field(f"{where}/value {index}/quant_params_type", "union", tag, "<B", data[tag]))
                    if params is not None:
                        fields += _table_fields(params, f"{where}/value {index} {quant_kind}", data)
                    tensor = table.table("tensor_value")
                    if tensor is None:
                        continue
                    table = tensor
                fields += _table_fields(table, f"{where}/value {index}", data)
            for index, node in enumerate(graph.tables("xnodes")):
                op, table = node.union("xnode_union")
                tag = node.union_tag_offset("xnode_union")
                if tag is not None:
                    fields.append(Field(f"{where}/node {index} {op}/xnode_union_type", "union", tag, "<B", data[tag]))
                if table is not None:
                    fields += _table_fields(table, f"{where}/node {index} {op}", data)
                min_max = node.table("output_min_max")
                if min_max is not None:
                    fields += _table_fields(min_max, f"{where}/node {index} {op}/output_min_max", data)
    return fields


def with_field(data: bytes, field: Field, value: Any) -> bytes:
    """A copy of ``data`` with ``field`` set to ``value`` (same width: the file's layout does not move)."""
    out = bytearray(data)
    struct.pack_into(field.fmt, out, field.offset, value)
    return bytes(out)


def field(data: bytes, pattern: str) -> Field:
    """The one field whose path matches ``pattern`` (a regular expression searched in the path)."""
    found = [f for f in xnnpack_fields(data) if re.search(pattern, f.path)]
    if len(found) != 1:
        raise LookupError(f"{len(found)} fields match {pattern!r}: {[f.path for f in found][:8]}")
    return found[0]


def edit(data: bytes, pattern: str, value: Any) -> bytes:
    """``data`` with the one field matching ``pattern`` set to ``value``."""
    return with_field(data, field(data, pattern), value)


def node_value(data: bytes, op: str, id_field: str, occurrence: int = 0) -> int:
    """The value id in ``id_field`` of the ``occurrence``-th node of type ``op`` (``"XNNSoftmax"``)."""
    fields = xnnpack_fields(data)
    nodes = [f.path.removesuffix("/xnode_union_type") for f in fields if f.path.endswith(f" {op}/xnode_union_type")]
    for found in fields:
        if found.path == f"{nodes[occurrence]}/{id_field}":
            return int(found.value)
    return 0  # an absent field holds its default


def _fits(fmt: str, value: Any) -> bool:
    try:
        struct.pack(fmt, value)
    except (struct.error, OverflowError):
        return False
    return True


def _candidates(field: Field, rng: random.Random, ids: list[int]) -> list[Any]:
    """Values a damaged or mis-generated field plausibly takes, per kind of field."""
    value = field.value
    if field.fmt in ("<f", "<d"):
        finite = value if math.isfinite(value) else 1.0
        return [0.0, -finite, finite * 2, finite * 1.001, finite / 1000, math.nan, math.inf, -math.inf, 1e-40, 300.0]
    if field.category == "datatype":
        return [d for d in range(0, 16) if d != value]
    if field.category == "flags":
        return [value ^ (1 << rng.randrange(8)), 0, 1, 2, 3, 4, 0x40]
    if field.category == "id":
        return [value + 1, value - 1, 0, NO_VALUE, rng.choice(ids) if ids else 0, value + 2]
    if field.category == "length":
        return [0, value - 1, value + 1, 7]
    if field.category == "union":
        return [0, 1, 2, 3, 4, 5] if field.path.endswith("quant_params_type") else list(range(0, 48))
    if field.category == "dims":
        return [0, 1, value + 1, value * 2, value - 1, value + 7]
    if field.category == "quant":
        return [value + 1, value - 1, -value, 128, -129, 256, 0, 1, 2]
    return [0, 1, value + 1, value - 1, value * 2, value + 3, NO_VALUE, 7]


def mutants(data: bytes, count: int, seed: str) -> list[tuple[Field, Any, bytes]]:
    """``count`` distinct single-field mutants of ``data``: (field, new value, mutated bytes), seeded."""
    rng = random.Random(seed)
    fields = xnnpack_fields(data)
    if not fields:
        return []
    ids = sorted({f.value for f in fields if f.path.endswith("/id_out")})
    seen: set[bytes] = {data}
    out: list[tuple[Field, Any, bytes]] = []
    attempts = 0
    while len(out) < count and attempts < count * 50:
        attempts += 1
        field = rng.choice(fields)
        value = rng.choice(_candidates(field, rng, ids))
        if not _fits(field.fmt, value):
            continue
        mutated = with_field(data, field, value)
        if mutated in seen:
            continue
        seen.add(mutated)
        out.append((field, value, mutated))
    return out


_WORKER = "tests.mutation"
_REPO = Path(__file__).resolve().parent.parent


class RuntimeSandbox:
    """Loads and runs programs with the real ExecuTorch runtime in a worker process.

    ``outcome(data)`` returns ``"runs"`` (with a hash of the outputs in ``last_outputs``), ``"load"``
    or ``"run"`` (what failed, with the runtime's message in ``last_message``), ``"crash"`` (the worker
    died: the native runtime crashed) or ``"timeout"``. The worker imports the runtime once and serves
    programs until it dies; then the next one starts it again.
    """

    def __init__(self, timeout: float = 60.0, memory_limit: int | None = None) -> None:
        self.timeout = timeout
        self.memory_limit = memory_limit  # bytes of address space the worker may map (None: no limit)
        self.last_message = ""
        self.last_outputs = ""  # a hash of the outputs of the last program that ran
        self._process: subprocess.Popen[str] | None = None
        self._directory = tempfile.TemporaryDirectory(prefix="xnnguard-sandbox-")
        self.restarts = 0

    def _start(self) -> subprocess.Popen[str]:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [sys.executable, "-m", _WORKER, "--worker"],
                cwd=_REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
                preexec_fn=self._limit_memory if self.memory_limit is not None else None,
            )
            self.restarts += 1
        return self._process

    def _limit_memory(self) -> None:
        """In the worker, before it starts: a program that allocates more fails there instead of taking the
        machine's memory (the test runs beside others)."""
        import resource

        assert self.memory_limit is not None
        resource.setrlimit(resource.RLIMIT_AS, (self.memory_limit, self.memory_limit))

    def outcome(self, data: bytes) -> str:
        self.last_message = self.last_outputs = ""
        path = Path(self._directory.name, "program.pte")
        path.write_bytes(data)
        process = self._start()
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(str(path) + "\n")
            process.stdin.flush()
        except BrokenPipeError:
            self._process = None
            return "crash"
        import select

        ready, _, _ = select.select([process.stdout], [], [], self.timeout)
        if not ready:
            process.kill()
            process.wait()
            self._process = None
            return "timeout"
        line = process.stdout.readline()
        if not line:
            process.wait()
            self._process = None
            self.last_message = f"worker exit code {process.returncode}"
            return "crash"
        answer = json.loads(line)
        self.last_message = answer.get("message", "")
        self.last_outputs = answer.get("outputs", "")
        return str(answer["outcome"])

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._directory.cleanup()

    def __enter__(self) -> RuntimeSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _outputs_digest(data: bytes, names: list[str]) -> str:
    """A hash of every method's outputs on the inputs ``load_and_run`` generates (seeded, so the same each time)."""
    import hashlib

    from xnnguard.boundary.runtime import load_program
    from xnnguard.runtime_check.runtime_load import _inputs

    digest = hashlib.sha256()
    program = load_program(data)  # holds its own copy of the bytes
    for name in names:
        method = program.load_method(name)
        for output in method.call(_inputs(method.method_meta())):
            digest.update(output.contiguous().numpy().tobytes() if hasattr(output, "numpy") else repr(output).encode())
    return digest.hexdigest()


def _method_names(data: bytes) -> list[str]:
    """The methods as the runtime names them (not as xnnguard reads them: the worker also runs programs
    xnnguard calls unreadable); none when the runtime cannot load the program (``load_and_run`` says why)."""
    from xnnguard.boundary.runtime import load_program
    from xnnguard.runtime_check.runtime_load import captured_stderr, import_runtime

    import_runtime()
    with captured_stderr():
        try:
            program = load_program(data)
            return [program.get_method_name(index) for index in range(program.num_methods())]
        except Exception:  # the load (or a name that is not text): load_and_run reports the load failure
            return []


def _serve() -> None:
    """The worker: one path per line in, one JSON outcome per line out."""
    import warnings

    warnings.filterwarnings("ignore")
    from xnnguard.runtime_check.runtime_load import load_and_run

    for line in sys.stdin:
        path = line.strip()
        data = Path(path).read_bytes()
        names = _method_names(data)
        result = load_and_run(data, names, run=True)
        kinds = [problem.kind for problem in result.problems]
        outcome = "load" if "load" in kinds else "run" if "run" in kinds else "runs" if result.ran else "skipped"
        message = "; ".join(problem.message for problem in result.problems)[:500]
        digest = _outputs_digest(data, names) if outcome == "runs" else ""
        sys.stdout.write(json.dumps({"outcome": outcome, "message": message, "outputs": digest}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__" and "--worker" in sys.argv:
    _serve()
