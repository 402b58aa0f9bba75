"""``python -m testbed.fuzz`` (``make fuzz``): generate networks, run them in every mode, write the report.

    python -m testbed.fuzz --seeds 500                 # seeds 0-499, each in every mode
    python -m testbed.fuzz --seeds 100-199 --modes fp16,float32 --jobs 2
    python -m testbed.fuzz --resume                     # skip the programs results.jsonl has already
    python -m testbed.fuzz --resume --retry timeout     # ... but run those that timed out again
    python -m testbed.fuzz --report-only                # rewrite report.md and the repros from results.jsonl

Each outcome is appended to ``<out>/results.jsonl`` as it comes (a long run can be stopped and resumed);
the report (``<out>/report.md``, ``<out>/repro/``) is rewritten every ``REPORT_EVERY`` programs and at
the end. Progress is logged, one line per program.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from testbed.fuzz import report
from testbed.fuzz.generator import Network, generate
from testbed.fuzz.runner import MODES, STATUSES, TIMEOUT_S, Outcome, Runner

logger = logging.getLogger("testbed.fuzz")

REPORT_EVERY = 25


def seeds(text: str) -> list[int]:
    """``500`` (seeds 0-499), ``100-199``, or ``3,7,20-22``."""
    try:
        if "," not in text and "-" not in text:
            return list(range(int(text)))
        chosen: list[int] = []
        for part in text.split(","):
            low, _, high = part.partition("-")
            chosen.extend(range(int(low), int(high or low) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"seeds are a count (500), a range (100-199) or a list (3,7,20-22): {text!r}") from None
    if any(seed < 0 for seed in chosen):
        raise argparse.ArgumentTypeError(f"seeds are not negative: {text!r}")
    return chosen


def modes(text: str) -> list[str]:
    chosen = list(MODES) if text == "all" else [mode.strip() for mode in text.split(",") if mode.strip()]
    unknown = [mode for mode in chosen if mode not in MODES]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"unknown mode {', '.join(unknown) or text!r}: the modes are all, "
                                         f"{', '.join(MODES)}")
    return chosen


def statuses(text: str) -> list[str]:
    chosen = [status.strip() for status in text.split(",") if status.strip()]
    unknown = [status for status in chosen if status not in STATUSES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown status {', '.join(unknown)}: the statuses are {', '.join(STATUSES)}")
    return chosen


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testbed.fuzz", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=seeds, default=seeds("500"), help="networks: 500, 100-199 or 3,7,20-22")
    parser.add_argument("--modes", type=modes, default=list(MODES), help=f"all, or some of {', '.join(MODES)}")
    parser.add_argument("--out", type=Path, default=Path("fuzz-out"), help="where results and the report go")
    parser.add_argument("--jobs", type=int, default=1, help="programs run at a time (one child each)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S,
                        help="CPU seconds before a program counts as hung (wall time: 6 times that)")
    parser.add_argument("--resume", action="store_true", help="keep results.jsonl, skip the programs it has")
    parser.add_argument("--retry", type=statuses, default=[],
                        help="with --resume: run the programs that came to these statuses again (timeout,crash)")
    parser.add_argument("--report-only", action="store_true", help="only rewrite the report from results.jsonl")
    return parser


def _stop_on_sigterm() -> None:
    """``kill`` stops the run as Ctrl-C does: running children are killed, the results so far stay."""
    import signal

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    arguments = _parser().parse_args(argv)
    if arguments.jobs < 1 or arguments.timeout <= 0:
        _parser().error("--jobs is at least 1 and --timeout positive")
    out: Path = arguments.out
    results = out / report.RESULTS
    if arguments.report_only:
        if not results.exists():
            _parser().error(f"no {results} to report on: run the fuzzer first")
        logger.info("report: %s", report.write(out, report.read(results)))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    done = {(o.seed, o.mode) for o in report.read(results) if o.status not in arguments.retry} \
        if arguments.resume and results.exists() else set()
    if not arguments.resume:
        results.write_text("")
    programs = [(seed, mode) for seed in arguments.seeds for mode in arguments.modes if (seed, mode) not in done]
    logger.info("fuzz: %d programs (%d seeds x %d modes, %d done before), %d at a time, out %s",
                len(programs), len(arguments.seeds), len(arguments.modes), len(done), arguments.jobs, out)
    networks: dict[int, Network] = {}

    def generated() -> Iterator[tuple[Network, str]]:
        for seed, mode in programs:
            if seed not in networks:
                networks.clear()  # programs come seed by seed: keep one network at a time
                networks[seed] = generate(seed)
            yield networks[seed], mode

    runner = Runner(jobs=arguments.jobs, timeout=arguments.timeout, log_dir=out / "logs")
    started = time.monotonic()
    _stop_on_sigterm()
    stopped = False
    with results.open("a") as sink:
        try:
            for count, outcome in enumerate(runner.run(generated()), 1):
                sink.write(json.dumps(outcome.as_dict()) + "\n")
                sink.flush()
                _log(count, len(programs), outcome, time.monotonic() - started)
                if count % REPORT_EVERY == 0:
                    report.write(out, report.read(results))
        except KeyboardInterrupt:
            stopped = True
            logger.info("fuzz: stopped; --resume continues where it stopped")
    path = report.write(out, report.read(results))
    logger.info("fuzz: %s in %.0f s; report: %s", "stopped" if stopped else "done", time.monotonic() - started, path)
    return 130 if stopped else 0


def _log(count: int, total: int, outcome: Outcome, elapsed: float) -> None:
    delegates = "" if outcome.delegates is None else f", {outcome.delegates} delegate{'s' * (outcome.delegates != 1)}"
    error = f": {outcome.error[:160]}" if outcome.status not in ("ok",) and outcome.error else ""
    left = elapsed / count * (total - count)
    logger.info("[%d/%d] seed %d %s: %s%s (%.1f s; about %.0f min left)%s", count, total, outcome.seed, outcome.mode,
                outcome.status, delegates, outcome.seconds, left / 60, error)


if __name__ == "__main__":
    sys.exit(main())
