"""``make demo``: built-in models lowered with the installed stock ExecuTorch and with xnnguard, loaded and run.

The stock side is what a user of ExecuTorch writes: export, (``XNNPACKQuantizer`` + pt2e,) lower with
``XnnpackPartitioner``. The xnnguard side is the same with xnnguard's pieces: ``rewrite_for_xnnpack``
first, ``xnnguard.XNNPACKQuantizer``, ``xnnguard.XnnpackPartitioner``.

Prints one row per model: what the stock program does (load error / run error / wrong by X / ok) next to
what xnnguard's does, the largest error against the reference, and how many ops each put on XNNPACK and
left outside. Then it verifies every ``.pte`` it wrote (``xnnguard verify``) and shows what is flagged.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from xnnguard import example_models as models

logger = logging.getLogger("xnnguard.demo")

Inputs = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Pipeline:
    """How one side (stock or xnnguard) turns a model into an ExportedProgram and a reference output."""

    prepare: Callable[[torch.nn.Module, Inputs], tuple[torch.export.ExportedProgram, torch.Tensor]]
    partitioner: Callable[[], object]


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], tuple[torch.nn.Module, Inputs]]
    quantize: str | None = None  # None (float), "static", "static-float-output" or "dynamic"


@dataclass
class Outcome:
    verdict: str
    max_error: float | None
    delegated_ops: int
    outside_ops: int = 0
    pte: Path | None = None


def _stock_partitioner() -> object:
    # A stock user with q/dq left outside XNNPACK must register the quantized kernels by hand (xnnguard's
    # partitioner does it for them); without it the stock side would fail earlier than it does on device.
    import executorch.kernels.quantized  # noqa: F401
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner()


def _guarded_partitioner() -> object:
    from xnnguard import XnnpackPartitioner

    return XnnpackPartitioner()


def _quantization_config(kind: str):  # type: ignore[no-untyped-def]
    import dataclasses

    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config

    config = get_symmetric_quantization_config(
        is_per_channel=kind != "static-float-output", is_dynamic=kind == "dynamic"
    )
    return dataclasses.replace(config, output_activation=None) if kind == "static-float-output" else config


def _prepare(
    case: Case, model: torch.nn.Module, inputs: Inputs, *, guarded: bool
) -> tuple[torch.export.ExportedProgram, torch.Tensor]:
    """Export (and, for quantized cases, quantize with pt2e) the way each side would."""
    model = model.eval()
    ep = torch.export.export(model, inputs)
    if guarded:
        from xnnguard import rewrite_for_xnnpack

        ep = rewrite_for_xnnpack(ep)
    if case.quantize is None:
        return ep, model(*inputs)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if guarded:
        from xnnguard import XNNPACKQuantizer

        quantizer = XNNPACKQuantizer()
    else:
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer as StockXNNPACKQuantizer

        quantizer = StockXNNPACKQuantizer()
    quantizer = quantizer.set_global(_quantization_config(case.quantize))
    prepared = prepare_pt2e(ep.module(), quantizer)
    prepared(*inputs)
    converted = convert_pt2e(prepared)
    return torch.export.export(converted, inputs), converted(*inputs)


def _lower_and_run(ep: torch.export.ExportedProgram, inputs: Inputs, expected: torch.Tensor, partitioner: object,
                   pte_path: Path) -> Outcome:
    from executorch.exir import to_edge_transform_and_lower

    from xnnguard.boundary.runtime import load_program
    from xnnguard.runtime_check.runtime_load import captured_stderr

    try:
        edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
        gm = edge.exported_program().graph_module
        delegated = sum(
            1
            for _, child in gm.named_children()
            if hasattr(child, "original_module")
            for node in child.original_module.graph.nodes
            if node.op == "call_function"
        )
        outside = sum(
            1
            for node in gm.graph.nodes
            if node.op == "call_function" and "executorch_call_delegate" not in str(node.target)
            and "getitem" not in str(node.target)
        )
        buffer = edge.to_executorch().buffer
    except Exception as error:  # a lowering failure is a result to show, not a crash of the demo
        logger.warning("%s: lowering failed: %s", pte_path.name, str(error).splitlines()[0][:200])
        return Outcome("lowering error", None, 0)
    pte_path.write_bytes(buffer)
    with captured_stderr():
        try:
            method = load_program(buffer).load_method("forward")
        except Exception:
            return Outcome("load error", None, delegated, outside, pte_path)
        try:
            out = method.call(list(inputs))[0]
        except Exception:
            return Outcome("run error", None, delegated, outside, pte_path)
    deviation = (out - expected).abs().max().item()
    scale = max(expected.abs().max().item(), 1e-6)
    verdict = "ok" if deviation <= 0.02 * scale else f"wrong by {deviation:.3g}"
    return Outcome(verdict, deviation, delegated, outside, pte_path)


CASES: tuple[Case, ...] = (
    Case("patchify (8-D permute)", lambda: (models.Patchify(), models.Patchify.example_inputs())),
    Case("linear on 8-D input", lambda: (models.HighRankLinear(), models.HighRankLinear.example_inputs())),
    Case("int8 conv2d, float output", lambda: (models.Conv2dReLU(relu=False), models.Conv2dReLU.example_inputs()),
         quantize="static-float-output"),
    Case("int8 linear, float output", lambda: (models.LinearModel(), (torch.randn(4, 16),)),
         quantize="static-float-output"),
    Case("int8 conv2d + relu", lambda: (models.Conv2dReLU(), models.Conv2dReLU.example_inputs()), quantize="static"),
    Case("video 3-D CNN (conv3d/bn/pool3d)", lambda: (models.Video3dCNN(), models.Video3dCNN.example_inputs())),
    Case("int8 conv3d + relu", lambda: (models.Conv3dReLU(), models.Conv3dReLU.example_inputs()), quantize="static"),
)


def run_demo(out_dir: Path, cases: tuple[Case, ...] = CASES) -> list[tuple[str, Outcome, Outcome]]:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for index, case in enumerate(cases):
        torch.manual_seed(index)
        model, inputs = case.build()
        results = []
        for side, guarded, make_partitioner in (("stock", False, _stock_partitioner),
                                                ("xnnguard", True, _guarded_partitioner)):
            logger.info("%s: lowering with %s", case.name, side)
            ep, expected = _prepare(case, model, inputs, guarded=guarded)
            slug = "".join(c if c.isalnum() else "_" for c in case.name).strip("_")
            results.append(_lower_and_run(ep, inputs, expected, make_partitioner(), out_dir / f"{slug}.{side}.pte"))
        rows.append((case.name, results[0], results[1]))
    return rows


def _release() -> str:
    """The installed ExecuTorch release, as the table's header names the stock side."""
    from xnnguard.boundary.releases import executorch_version

    return (executorch_version() or "?").split("+")[0]


def _table(rows: list[tuple[str, Outcome, Outcome]]) -> str:
    stock_column = f"stock {_release()}"
    header = ("model", stock_column, "xnnguard", "xnnguard max err", "ops in/outside XNNPACK: stock", "xnnguard")
    body = [
        (name, stock.verdict, guarded.verdict,
         "-" if guarded.max_error is None else f"{guarded.max_error:.2e}",
         f"{stock.delegated_ops}/{stock.outside_ops}", f"{guarded.delegated_ops}/{guarded.outside_ops}")
        for name, stock, guarded in rows
    ]
    widths = [max(len(str(r[i])) for r in (header, *body)) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in (header, *body)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xnnguard.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("demo-out"), help="where to write the .pte files")
    parser.add_argument("--case", action="append", default=[], metavar="NAME",
                        help="only the models whose name starts with NAME (repeatable; default: all)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    cases = tuple(c for c in CASES if not args.case or any(c.name.startswith(name) for name in args.case))
    with _quiet_third_parties():
        print(f"Lowering {len(cases)} example models with stock ExecuTorch {_release()} and with xnnguard ...",
              flush=True)
        rows = run_demo(args.out, cases)
        print(_table(rows))
        print(f"\nVerifying the .pte files in {args.out}/ (what `xnnguard verify {args.out}` does):")
        print(_verification(rows))
    return 0


@contextmanager
def _quiet_third_parties() -> Iterator[None]:
    """What the CLI silences, silenced here too: torchao's missing CUDA extensions and triton (its logger),
    torch's pytree deprecations (a logger and FutureWarnings), ExecuTorch's experimental-API warnings.

    Through logging levels and warning filters, so that the demo's own messages and real errors still
    reach stderr; the native runtime's lines are captured around each load (``captured_stderr``).
    torch is imported already (this module needs it), so the levels it sets at import are overridden.
    """
    from xnnguard.third_party_logs import quiet_third_party_loggers

    with warnings.catch_warnings():
        for category in (FutureWarning, DeprecationWarning, UserWarning):
            warnings.simplefilter("ignore", category)
        quiet_third_party_loggers()
        yield


def _verification(rows: list[tuple[str, Outcome, Outcome]]) -> str:
    """One line per written .pte: passes, or the kinds of problem ``verify_pte`` flags, with the first one."""
    from xnnguard.runtime_check import PteReadError, verify_pte

    lines = []
    for _, *outcomes in rows:
        for outcome in outcomes:
            if outcome.pte is None:
                continue
            try:
                report = verify_pte(outcome.pte)
            except PteReadError as error:
                lines.append(f"  {outcome.pte.name}: unreadable: {error}")
                continue
            if report.ok:
                lines.append(f"  {outcome.pte.name}: ok")
            else:
                kinds = ", ".join(sorted(report.kinds()))
                lines.append(f"  {outcome.pte.name}: FLAGGED ({kinds}): {report.problems[0].message}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
