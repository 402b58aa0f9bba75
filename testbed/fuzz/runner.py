"""Run generated networks through xnnguard's flow in every mode, each program in a child process of its own.

A program is one network in one mode (``MODES``): float32, fp16, static int8, dynamic int8 (both with
``xnnguard.XNNPACKQuantizer`` after ``rewrite_for_xnnpack``), or float32 exported with a dynamic batch and
run at other batches. It goes through ``testbed.flow.lower_and_run`` (the flow the tests use) and gets an
``Outcome``: its status (``STATUSES``), the delegate count, the ops left outside XNNPACK (by op, and by the
partitioner's ``report``: rule and reason) and the rewriter's report.

A native crash or a hang is an outcome too: each program runs in a child forked from a server that has
imported and warmed up torch, ExecuTorch and xnnguard once (``testbed.fuzz.warm``), and its stdout and
stderr go to a log file. A child is killed as hung after ``timeout`` seconds of CPU (a loop) or
``HANG_FACTOR`` times that of wall time (a deadlock): on a shared machine a child that waits for a core
is slow, not hung. A network PyTorch itself cannot run or
export (in fp16: a CPU kernel without half, an overflow) is ``invalid``, not a finding.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from testbed.fuzz.generator import Network
from testbed.network_flow import describe_error

__all__ = ["FAILED", "MODES", "STATUSES", "Outcome", "Runner", "run_program"]

logger = logging.getLogger("testbed.fuzz")

# A mode: the arguments of testbed.flow.lower_and_run besides the model and its inputs.
MODES: dict[str, dict[str, Any]] = {
    "float32": {"precision": "float"},
    "fp16": {"precision": "fp16"},
    "static-int8": {"precision": "static int8"},
    "dynamic-int8": {"precision": "dynamic int8"},
    "dynamic-batch": {"precision": "float", "dynamic_batch": (1, 3)},
}
DYNAMIC_BATCH_EXAMPLE = 2  # the batch a dynamic-batch program is exported at (a batch of 1 would be specialized)
# testbed.flow's stage -> the outcome when it fails ("eager" and "export": PyTorch's own, not a finding).
FAILED = {
    "rewrite": "rewrite failed",
    "quantize": "quantize failed",
    "reexport": "export failed",
    "lower": "lower failed",
    "load": "load failed",
    "run": "run failed",
}
STATUSES = ("ok", "wrong", *FAILED.values(), "crash", "timeout", "invalid")
TIMEOUT_S = 600.0  # CPU seconds; a lone batch norm's int8 fold (torchao) alone takes a minute or two
HANG_FACTOR = 6  # wall time allowed, in CPU timeouts
POLL_S = 5.0  # how often the children's CPU time is read


@dataclass
class Outcome:
    """What one program came to, as plain data (it crosses processes and is written as JSON)."""

    seed: int
    mode: str
    status: str = "ok"
    error: str = ""
    delegates: int | None = None
    outside: dict[str, int] = field(default_factory=dict)  # op -> nodes left outside XNNPACK
    kept_out: list[tuple[str, str, str]] = field(default_factory=list)  # the partitioner's (op, rule, reason)
    rewrite_report: list[str] = field(default_factory=list)
    stock: str | None = None  # a wrong or failing program: what stock ExecuTorch's flow makes of it (a status)
    max_error: float | None = None
    tolerance: float | None = None
    seconds: float = 0.0  # wall time (of the child, when it reported)
    cpu_s: float | None = None  # CPU time of the program in its child (a shared machine's wall time is not)
    ops: list[str] = field(default_factory=list)  # the network's catalogue ops
    batch: int = 1  # the network's example batch
    source: str = ""  # the network's source: a report written later needs no generator of the same version

    def network(self) -> Network:
        return Network(self.seed, self.batch, tuple(self.ops), self.source)

    @property
    def stock_wanted(self) -> bool:
        """A wrong or failing program is also run the stock way (a crash or a timeout ended its child)."""
        return self.status not in ("ok", "invalid", "crash", "timeout")

    @property
    def split(self) -> bool:
        return (self.delegates or 0) > 1

    @property
    def finding(self) -> bool:
        """Wrong, failing, crashing, hanging, or split into more than one delegate."""
        return self.status not in ("ok", "invalid") or self.split

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        data = dict(data)
        data["kept_out"] = [tuple(record) for record in data.get("kept_out", [])]
        return cls(**data)


def _describe(error: BaseException) -> str:
    """``describe_error``'s chain on one line, cut to what a report row holds."""
    return describe_error(error).replace("\n", " ")[:3000]


def run_program(network: Network, mode: str, runtime_log: Callable[[], str] | None = None) -> Outcome:
    """``network`` in ``mode`` through ``testbed.flow.lower_and_run``, in this process.

    ``runtime_log``: the runtime's log so far, whose failure lines explain a load or run failure.
    """
    import torch

    import xnnguard
    from testbed.flow import FlowError, lower_and_run
    from testbed.network_flow import failure_lines

    started, cpu_started = time.perf_counter(), time.process_time()
    outcome = Outcome(network.seed, mode, ops=list(network.ops), batch=network.batch, source=network.source)
    rewriter = xnnguard.XnnpackRewriter(strict=True)
    partitioner = xnnguard.XnnpackPartitioner()
    lowered = None
    try:
        model, inputs = network.build(DYNAMIC_BATCH_EXAMPLE if "dynamic_batch" in MODES[mode] else None)
        run = lower_and_run(model, inputs, rewrite=rewriter, partitioner=partitioner, **MODES[mode])
        lowered = run.lowered
        outcome.tolerance = run.tolerance
        if not all(bool(torch.isfinite(reference).all()) for reference in run.references):
            outcome.status, outcome.error = "invalid", "the reference is not finite (an fp16 overflow)"
        else:
            mismatch = run.mismatch()
            if all(out.shape == ref.shape for out, ref in zip(run.outputs, run.references)):
                outcome.max_error = run.max_error()
            if mismatch is not None:
                outcome.status, outcome.error = "wrong", mismatch
    except FlowError as error:
        lowered = error.lowered
        outcome.status = FAILED.get(error.stage, "invalid")
        outcome.error = f"{error.stage}: {_describe(error.__cause__ or error)}"
        if error.stage in ("load", "run") and runtime_log is not None:
            outcome.error += f" | runtime log: {failure_lines(runtime_log())}"
    except Exception as error:  # the network itself did not build: a generator fault, not xnnguard's
        outcome.status, outcome.error = "invalid", f"build: {_describe(error)}"
    if lowered is not None:
        outcome.delegates = lowered.num_delegates
        outcome.outside = dict(lowered.outside_ops())
    outcome.kept_out = [(record.op, record.rule.value, record.reason) for record in partitioner.report]
    outcome.rewrite_report = [str(record) for record in rewriter.report]
    outcome.seconds = time.perf_counter() - started
    outcome.cpu_s = time.process_time() - cpu_started
    return outcome


def stock_status(network: Network, mode: str) -> str:
    """The program through stock ExecuTorch's flow (no rewrite, its own partitioner and quantizer): "ok",
    "wrong" or "<stage> failed". It tells a finding xnnguard could fix from one it inherits."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from testbed.flow import FlowError, lower_and_run

    try:
        model, inputs = network.build(DYNAMIC_BATCH_EXAMPLE if "dynamic_batch" in MODES[mode] else None)
        run = lower_and_run(model, inputs, rewrite=False, quantizer="stock", partitioner=XnnpackPartitioner(),
                            **MODES[mode])
    except FlowError as error:
        return FAILED.get(error.stage, "invalid")
    except Exception:
        return "invalid"
    return "wrong" if run.mismatch() is not None else "ok"


def _child(sender: Connection, network: Network, mode: str, log_path: str) -> None:
    """In the child: output to ``log_path``, one runtime thread, run the program, send its outcome."""
    import sys
    import warnings

    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (the process ends with it)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    warnings.simplefilter("ignore")

    def runtime_log() -> str:
        sys.stderr.flush()
        return Path(log_path).read_text(errors="replace")[-64 * 1024:]

    try:
        from xnnguard.boundary.runtime import reset_threadpool

        reset_threadpool(1)  # the machine is shared: one thread per program
        outcome = run_program(network, mode, runtime_log)
        sender.send(outcome)
        if outcome.stock_wanted:  # then, on its own time, what stock ExecuTorch makes of it
            sender.send(stock_status(network, mode))
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        sender.close()


def _context() -> multiprocessing.context.ForkServerContext:
    """Children forked from a server that imported and warmed up the flow once (a cold start is ~10 s)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["testbed.fuzz.warm"])
    return context


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (Linux /proc); 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15


def _crash_description(log_path: Path, exitcode: int | None) -> str:
    how = f"killed by signal {-exitcode}" if exitcode is not None and exitcode < 0 else f"exit code {exitcode}"
    try:
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    lines = [line for line in lines if not line.startswith("[cpuinfo")]
    return f"{how}; last output: {' | '.join(lines[-6:])[-1500:]}"


@dataclass
class _Running:
    network: Network
    mode: str
    process: Any
    receiver: Connection
    log_path: Path
    started: float
    outcome: Outcome | None = None  # received; the child now runs the program the stock way
    cpu_started: float = 0.0  # the child's CPU seconds when the current part (program, stock run) began


class Runner:
    """Runs programs in forked children, ``jobs`` at a time, each killed as hung after ``timeout`` CPU seconds
    (or ``HANG_FACTOR`` times that of wall time).

    ``log_dir``: where each child's output goes (``<seed>-<mode>.log``, removed when the program is ok);
    a temporary folder by default.
    """

    def __init__(self, jobs: int = 1, timeout: float = TIMEOUT_S, log_dir: Path | None = None) -> None:
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, got {jobs}")
        self.jobs = jobs
        self.timeout = timeout
        self._temporary = None if log_dir is not None else tempfile.TemporaryDirectory(prefix="xnnguard-fuzz-")
        self.log_dir = log_dir if log_dir is not None else Path(self._temporary.name)  # type: ignore[union-attr]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._context = _context()

    def run(self, programs: Iterable[tuple[Network, str]]) -> Iterator[Outcome]:
        """Each program's outcome, as it finishes (not necessarily in the order given)."""
        pending = iter(programs)
        running: list[_Running] = []
        exhausted = False
        try:
            while running or not exhausted:
                while not exhausted and len(running) < self.jobs:
                    program = next(pending, None)
                    if program is None:
                        exhausted = True
                    else:
                        running.append(self._start(*program))
                if not running:
                    break
                ready = wait([job.receiver for job in running] + [job.process.sentinel for job in running],
                             timeout=POLL_S)
                for job in list(running):
                    outcome = self._poll(job, ready)
                    if outcome is not None:
                        running.remove(job)
                        yield outcome
        finally:  # stopped early (Ctrl-C, a consumer that breaks): no child outlives the run
            for job in running:
                job.process.kill()
                job.process.join(timeout=30)

    def _start(self, network: Network, mode: str) -> _Running:
        receiver, sender = self._context.Pipe(duplex=False)
        log_path = self.log_dir / f"{network.seed}-{mode}.log"
        process = self._context.Process(target=_child, args=(sender, network, mode, str(log_path)), daemon=True)
        process.start()
        sender.close()
        return _Running(network, mode, process, receiver, log_path, time.monotonic())

    def _poll(self, job: _Running, ready: list[Any]) -> Outcome | None:
        """The job's outcome once it is complete (sent, with the stock verdict when wanted), or once the child
        died or ran out of time; None while it is still working. The stock run has a timeout of its own."""
        message, gone = None, False
        if job.receiver in ready:
            try:
                message = job.receiver.recv()
            except (EOFError, OSError):
                gone = True  # it died before sending: a crash, told by its exit code below
        elif job.process.sentinel in ready:
            gone = True
        elif (hung := self._hung(job)) is not None:
            job.process.kill()
            if job.outcome is None:
                return self._finish(job, self._failed(job, "timeout", hung))
            job.outcome.stock = "timeout"
            return self._finish(job, job.outcome)
        if gone:
            job.process.join(timeout=30)
            if job.outcome is None:
                return self._finish(job, self._failed(job, "crash",
                                                      _crash_description(job.log_path, job.process.exitcode)))
            job.outcome.stock = "crash"
            return self._finish(job, job.outcome)
        if message is None:
            return None
        if job.outcome is None:
            job.outcome = message
            if not message.stock_wanted:
                return self._finish(job, message)
            job.started, job.cpu_started = time.monotonic(), _cpu_seconds(job.process.pid)  # the stock run's own
            return None
        job.outcome.stock = message
        return self._finish(job, job.outcome)

    def _hung(self, job: _Running) -> str | None:
        """Why the job counts as hung (over its CPU or wall time), or None."""
        cpu = _cpu_seconds(job.process.pid) - job.cpu_started
        wall = time.monotonic() - job.started
        if cpu >= self.timeout:
            return f"no outcome after {cpu:.0f} s of CPU"
        if wall >= HANG_FACTOR * self.timeout:
            return f"no outcome after {wall:.0f} s ({cpu:.0f} s of CPU)"
        return None

    def _finish(self, job: _Running, outcome: Outcome) -> Outcome:
        job.process.join(timeout=30)
        if job.process.is_alive():
            job.process.kill()
            job.process.join(timeout=30)
        job.receiver.close()
        if not outcome.finding and outcome.status != "invalid":
            job.log_path.unlink(missing_ok=True)
        return outcome

    @staticmethod
    def _failed(job: _Running, status: str, error: str) -> Outcome:
        network = job.network
        return Outcome(network.seed, job.mode, status, error,
                       seconds=time.monotonic() - job.started, ops=list(network.ops), batch=network.batch,
                       source=network.source)
