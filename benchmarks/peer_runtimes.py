"""The runtimes ``bench_peers`` compares, each converted and run the way its own users do.

``python -m benchmarks.peer_runtimes --convert RUNTIME ...`` converts one zoo network for one runtime in
this (fresh) process and prints what it made; ``--time RUNTIME ...`` loads that and takes one turn
(``benchmarks.timing.turn_ms``). Both run in the interpreter that has the runtime: ExecuTorch, eager
PyTorch and ONNX Runtime in ``.venv`` (ONNX Runtime from the ``bench`` extra), LiteRT in
``.venv-litert`` (litert-torch pins ``typing_extensions`` below what ExecuTorch's dependencies allow).
So this module imports only the standard library, torch and ``testbed.networks`` at its top, and each
runtime's package inside the functions for it.

* ``eager``: the network itself, ``torch.no_grad()``;
* ``xnnguard`` / ``xnnguard-int8``: the ``.pte`` ``testbed.network_flow.lower_network`` writes (float;
  static int8 with ``xnnguard.XNNPACKQuantizer``, per-channel, calibrated on the example input);
* ``ort`` / ``ort-int8``: ``torch.onnx.export(..., dynamo=True)`` (onnxscript's optimizer on), run by
  ``onnxruntime.InferenceSession`` on the CPU provider with every graph optimization; int8 is
  ``onnxruntime.quantization.quantize_static``: QDQ, per-channel, u8 activations and s8 weights
  (ONNX Runtime's fast x86 pairing), calibrated on the example input, after ``quant_pre_process``;
* ``litert``: ``litert_torch.convert`` to a ``.tflite`` run by LiteRT's ``Interpreter``, whose default op
  resolver applies the XNNPACK delegate, on ``num_threads`` threads.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

RUNTIMES = ("eager", "xnnguard", "xnnguard-int8", "ort", "ort-int8", "litert")
FLOAT_RUNTIMES = ("eager", "xnnguard", "ort", "litert")
PEERS = ("ort", "ort-int8", "litert")
LABELS = {"eager": "eager PyTorch", "xnnguard": "xnnguard", "xnnguard-int8": "xnnguard int8",
          "ort": "ONNX Runtime", "ort-int8": "ONNX Runtime int8", "litert": "LiteRT"}
# ONNX keeps a model in one protobuf of at most 2 GB: larger weights go to a file beside it.
EXTERNAL_DATA_BYTES = 1 << 30


def first_tensor(output: Any) -> torch.Tensor:
    while isinstance(output, list | tuple):
        output = output[0]
    return torch.as_tensor(output)


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float | None:
    """Max abs error over the expected output's max abs value (None when the shapes differ)."""
    got = got.reshape(expected.shape) if got.numel() == expected.numel() else got
    if got.shape != expected.shape:
        return None
    return float((got.float() - expected).abs().max()) / max(float(expected.abs().max()), 1e-6)


def _network(name: str, size: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from testbed.networks import NETWORKS

    return NETWORKS[name](size)


def _eager_output(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    with torch.no_grad():
        return first_tensor(model(*inputs))


# ---------------------------------------------------------------------------------------------------------
# Conversions (xnnguard's go through benchmarks.network_report's worker instead)


def convert_ort(name: str, size: str, out_dir: Path, int8: bool) -> dict[str, Any]:
    """Export to ONNX (and quantize for int8); the model's path and its output's error against eager."""
    import onnxruntime

    model, inputs = _network(name, size)
    path = export_ort(model, inputs, out_dir / f"{name}.{size}.onnx", int8)
    session = ort_session(str(path), threads=2)
    got = _run_ort(session, inputs)
    del onnxruntime
    return {"artifact": str(path), "max_err": relative_error(got, _eager_output(model, inputs))}


def export_ort(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], float_path: Path, int8: bool) -> Path:
    """``model`` as ONNX Runtime's users convert it: exported to ``float_path`` (kept when it exists), and
    for int8 quantized beside it; the path of the model to run."""
    if not float_path.exists():
        program = torch.onnx.export(model, inputs, dynamo=True, verbose=False)
        assert program is not None
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        program.save(str(float_path), external_data=weights > EXTERNAL_DATA_BYTES)
    return _quantize_ort(float_path, inputs, model) if int8 else float_path


def _quantize_ort(float_path: Path, inputs: tuple[torch.Tensor, ...], model: torch.nn.Module) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    large = sum(p.numel() * p.element_size() for p in model.parameters()) > EXTERNAL_DATA_BYTES
    prepared = float_path.with_suffix(".pre.onnx")
    quant_pre_process(str(float_path), str(prepared), skip_symbolic_shape=True, save_as_external_data=large)
    names = _ort_input_names(str(prepared))

    class OneInput(CalibrationDataReader):  # type: ignore[misc]
        """The example input, once: the calibration ``bench_peers`` gives every int8 program."""

        def __init__(self) -> None:
            self.feeds = iter([{n: x.numpy() for n, x in zip(names, inputs)}])

        def get_next(self) -> dict[str, Any] | None:
            return next(self.feeds, None)

    out = float_path.with_suffix(".int8.onnx")
    quantize_static(str(prepared), str(out), OneInput(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, use_external_data_format=large)
    return out


def _ort_input_names(path: str) -> list[str]:
    import onnx

    model = onnx.load(path, load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    return [value.name for value in model.graph.input if value.name not in initializers]


def ort_session(path: str, threads: int, profile_prefix: str | None = None) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def ort_feeds(session: Any, inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    return {meta.name: x.numpy() for meta, x in zip(session.get_inputs(), inputs)}


def _run_ort(session: Any, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return torch.from_numpy(session.run(None, ort_feeds(session, inputs))[0])


def convert_litert(name: str, size: str, out_dir: Path) -> dict[str, Any]:
    """Convert with litert-torch to a ``.tflite``; its path and its output's error against eager."""
    import litert_torch

    model, inputs = _network(name, size)
    path = out_dir / f"{name}.{size}.tflite"
    litert_torch.convert(model, inputs).export(str(path))
    interpreter = _litert_interpreter(str(path), threads=2)
    got = _run_litert(interpreter, inputs)
    return {"artifact": str(path), "max_err": relative_error(got, _eager_output(model, inputs))}


def _litert_interpreter(path: str, threads: int) -> Any:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=path, num_threads=threads)  # default resolver: XNNPACK delegate
    interpreter.allocate_tensors()
    return interpreter


def _run_litert(interpreter: Any, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    for detail, x in zip(interpreter.get_input_details(), inputs):
        interpreter.set_tensor(detail["index"], x.numpy().astype(detail["dtype"], copy=False))
    interpreter.invoke()
    return torch.from_numpy(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]).copy())


# ---------------------------------------------------------------------------------------------------------
# Runners: one forward of a converted network, for the turns


def runner(runtime: str, name: str, size: str, artifact: str | None, threads: int) -> Callable[[], object]:
    """A zero-argument call that runs one forward of ``name`` on ``runtime`` (loaded here, once)."""
    torch.set_num_threads(threads)
    model, inputs = _network(name, size)
    if runtime == "eager":
        return _eager_runner(model, inputs)
    del model  # the other runtimes run their converted program: only the inputs are needed
    assert artifact, f"{runtime} needs the converted program"
    if runtime.startswith("xnnguard"):
        from xnnguard.boundary.runtime import load_module, reset_threadpool

        reset_threadpool(threads)  # before loading: delegates keep the pool they saw
        module = load_module(artifact)
        return lambda: module.forward(inputs)
    if runtime.startswith("ort"):
        session = ort_session(artifact, threads)
        feeds = ort_feeds(session, inputs)
        return lambda: session.run(None, feeds)
    if runtime == "litert":
        interpreter = _litert_interpreter(artifact, threads)
        return lambda: _run_litert(interpreter, inputs)
    raise ValueError(f"unknown runtime {runtime!r}; the runtimes are {', '.join(RUNTIMES)}")


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def error_line(error: BaseException) -> str:
    """An exception as one line: the root cause's type and first line, then the exception's own.

    Exporters wrap the error that says what is wrong ("only 4D query, key, and value are supported") in
    one that says which step failed; the cause comes first, and terminal colours are dropped.
    """

    def one(exception: BaseException) -> str:
        lines = [line.strip() for line in ANSI.sub("", str(exception)).splitlines() if line.strip()]
        return f"{type(exception).__name__}: {lines[0] if lines else ''}"

    chain, current = [], error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    text = one(error) if len(chain) == 1 else f"{one(chain[-1])} (in {one(error)})"
    return text[:300]


def _eager_runner(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], object]:
    def eager() -> object:
        with torch.no_grad():
            return model(*inputs)

    return eager


def first_error_line(text: str) -> str:
    """The line of a traceback or log that says what went wrong: the last ``SomeError: ...`` line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Exit", "Interrupt")) or "Error: " in line:
            return line[:300]
    return (lines[-1] if lines else "no output")[:300]


def _main(argv: list[str]) -> int:
    from benchmarks.timing import turn_ms

    parser = argparse.ArgumentParser(prog="python -m benchmarks.peer_runtimes", description=__doc__)
    parser.add_argument("--convert", choices=("ort", "ort-int8", "litert"))
    parser.add_argument("--time", choices=RUNTIMES)
    parser.add_argument("--versions", action="store_true", help="print LiteRT's package versions")
    parser.add_argument("--network")
    parser.add_argument("--size", default="bench")
    parser.add_argument("--out-dir", type=Path)
    parser.add_argument("--artifact")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turn-s", type=float, default=0.5)
    args = parser.parse_args(argv)
    if args.versions:
        from importlib.metadata import version

        print(json.dumps({package: version(package) for package in ("litert-torch", "ai-edge-litert")}))
        return 0
    if args.convert:
        started = time.perf_counter()
        try:
            if args.convert == "litert":
                made = convert_litert(args.network, args.size, args.out_dir)
            else:
                made = convert_ort(args.network, args.size, args.out_dir, int8=args.convert == "ort-int8")
        except Exception as error:  # a conversion that fails is a result: its first error line
            traceback.print_exc(file=sys.stderr)
            print(json.dumps({"error": error_line(error)}))
            return 0
        print(json.dumps({**made, "convert_s": time.perf_counter() - started}))
        return 0
    run = runner(args.time, args.network, args.size, args.artifact, args.threads)
    print(json.dumps(turn_ms(run, args.turn_s)))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
