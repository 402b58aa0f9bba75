"""A fuzz run's report: Markdown tables of outcomes, ops left outside and splits, and a repro per finding.

``write(out, outcomes)`` writes ``out/report.md`` and, for every finding (a program wrong, failing,
crashing, hanging, or split into more than one XNNPACK delegate), ``out/repro/<seed>-<mode>.py``: the
network's source and the flow call of its mode, runnable from the repository's root
(``PYTHONPATH=. python fuzz-out/repro/17-fp16.py``). Outcomes are read back from ``results.jsonl``
(``read``), so a report can be rewritten from a run at any time.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from testbed.fuzz.generator import Network, generate
from testbed.fuzz.runner import DYNAMIC_BATCH_EXAMPLE, MODES, STATUSES, Outcome

__all__ = ["RESULTS", "markdown", "read", "repro_source", "write"]

RESULTS = "results.jsonl"
# Nodes outside a delegate that compute nothing (a delegate's outputs, sizes of a dynamic batch).
NOT_COMPUTE = ("getitem", "executorch_call_delegate", "sym_size", "_assert", "alloc")


def read(path: Path) -> list[Outcome]:
    """The outcomes of ``results.jsonl``; a program run twice (a resumed run) counts with its last outcome."""
    latest: dict[tuple[int, str], Outcome] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            outcome = Outcome.from_dict(json.loads(line))
            latest[(outcome.seed, outcome.mode)] = outcome
    return list(latest.values())


def repro_source(network: Network, outcome: Outcome) -> str:
    """The network's source, then the flow call of the outcome's mode and what it printed when fuzzed."""
    arguments = ", ".join(f"{name}={value!r}" for name, value in MODES[outcome.mode].items())
    batch = DYNAMIC_BATCH_EXAMPLE if "dynamic_batch" in MODES[outcome.mode] else network.batch
    summary = f"{outcome.status}, {outcome.delegates} XNNPACK delegate(s)"
    lines = [
        "",
        "",
        'if __name__ == "__main__":',
        f"    # fuzzed in mode {outcome.mode}: {summary}",
        *(f"    # {line}" for line in _wrapped(outcome.error, 110)),
        "    import warnings",
        "",
        "    from testbed.flow import lower_and_run",
        "",
        '    warnings.simplefilter("ignore")',
        f"    model, inputs = build({batch})",
        f"    run = lower_and_run(model, inputs, {arguments})",
        '    print("XNNPACK delegates:", run.lowered.num_delegates)',
        "    for record in run.kept_out:",
        '        print("left outside:", record.op, "|", record.rule.value, "|", record.reason)',
        "    for record in run.rewrite_report:",
        '        print("not rewritten:", record)',
        '    print(run.mismatch() or f"matches (max error {run.max_error():.3g}, tolerance {run.tolerance:.3g})")',
        "",
    ]
    return network.source + "\n".join(lines)


def _wrapped(text: str, width: int) -> list[str]:
    text = text[:1000]
    return [text[i:i + width] for i in range(0, len(text), width)]


def _reason(reason: str) -> str:
    """A reason with its numbers as N, so that one cause is one row (``dim = 1 for tensor of rank 4``)."""
    return re.sub(r"(?<!float)(?<!int)(?<!fp)(?<!\d)\d+", "N", reason)  # dtypes keep theirs


def _is_compute(op: str) -> bool:
    return not any(word in op for word in NOT_COMPUTE)


def _outcome_table(outcomes: Sequence[Outcome], modes: Sequence[str]) -> list[str]:
    statuses = [status for status in STATUSES if any(o.status == status for o in outcomes)] or ["ok"]
    header = ["mode", "programs", *statuses, ">1 delegate"]
    rows = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for mode in [*modes, "all"]:
        chosen = [o for o in outcomes if mode in (o.mode, "all")]
        if not chosen:
            continue
        counts = Counter(o.status for o in chosen)
        lowered = [o for o in chosen if o.delegates is not None]
        split = sum(o.split for o in lowered)
        share = f"{split} of {len(lowered)} ({100 * split / len(lowered):.0f} %)" if lowered else "-"
        cells = [mode if mode != "all" else "**all**", str(len(chosen)), *(str(counts[s]) for s in statuses), share]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _outside_table(outcomes: Sequence[Outcome]) -> list[str]:
    """Nodes left outside XNNPACK, by (op, rule, reason): nodes, programs, which modes."""
    nodes: Counter[tuple[str, str, str]] = Counter()
    programs: dict[tuple[str, str, str], set[tuple[int, str]]] = defaultdict(set)
    for outcome in outcomes:
        for op, rule, reason in outcome.kept_out:
            if _is_compute(op):
                key = (op, rule, _reason(reason))
                nodes[key] += 1
                programs[key].add((outcome.seed, outcome.mode))
    rows = ["| op | rule | reason | nodes | programs | modes (programs) |", "| --- | --- | --- | --- | --- | --- |"]
    for key, count in sorted(nodes.items(), key=lambda item: (-len(programs[item[0]]), -item[1], item[0])):
        by_mode = Counter(mode for _, mode in programs[key])
        modes = ", ".join(f"{mode} {n}" for mode, n in sorted(by_mode.items()))
        op, rule, reason = key
        rows.append(f"| `{op}` | {rule} | {reason.replace('|', '/')} | {count} | {len(programs[key])} | {modes} |")
    return rows


def _rewrite_table(outcomes: Sequence[Outcome]) -> list[str]:
    """What the rewriter left as it was (its report: ``node (op): reason``), by op and reason, and where."""
    programs: dict[str, set[tuple[int, str]]] = defaultdict(set)
    for outcome in outcomes:
        for record in outcome.rewrite_report:
            programs[_reason(re.sub(r"^\S+ \(", "(", record))].add((outcome.seed, outcome.mode))
    rows = ["| (op): reason | programs | modes (programs) |", "| --- | --- | --- |"]
    for record, where in sorted(programs.items(), key=lambda item: (-len(item[1]), item[0])):
        modes = ", ".join(f"{mode} {n}" for mode, n in sorted(Counter(mode for _, mode in where).items()))
        rows.append(f"| {_cell(record)} | {len(where)} | {modes} |")
    return rows


def _split_causes(outcomes: Sequence[Outcome]) -> list[str]:
    """For the programs split into several delegates: how many leave each compute op outside, by mode."""
    split = [o for o in outcomes if o.split]
    programs: dict[str, set[tuple[int, str]]] = defaultdict(set)
    for outcome in split:
        for op in outcome.outside:
            if _is_compute(op):
                programs[op].add((outcome.seed, outcome.mode))
    rows = [f"{len(split)} programs split. Compute ops they leave outside (a program counts once per op):", "",
            "| op outside | split programs | modes (programs) |", "| --- | --- | --- |"]
    for op, where in sorted(programs.items(), key=lambda item: (-len(item[1]), item[0])):
        modes = ", ".join(f"{mode} {n}" for mode, n in sorted(Counter(mode for _, mode in where).items()))
        rows.append(f"| `{op}` | {len(where)} | {modes} |")
    return rows


def _outside_ops(outcome: Outcome) -> str:
    ops = {op: n for op, n in outcome.outside.items() if _is_compute(op)}
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(ops.items())) or "-"


def _fp16_table(outcomes: Sequence[Outcome]) -> list[str]:
    """Networks with more delegates in fp16 than in float32, and what fp16 leaves outside that float32 does not."""
    by_program = {(o.seed, o.mode): o for o in outcomes}
    rows = ["| seed | float32 delegates | fp16 delegates | left outside in fp16 only (op: reason) |",
            "| --- | --- | --- | --- |"]
    causes: Counter[tuple[str, str]] = Counter()
    compared = worse = 0
    for (seed, mode), fp16 in sorted(by_program.items()):
        float32 = by_program.get((seed, "float32"))
        if mode != "fp16" or float32 is None or fp16.delegates is None or float32.delegates is None:
            continue
        compared += 1
        float_outside = {(op, _reason(reason)) for op, _, reason in float32.kept_out}
        only = sorted({(op, _reason(reason)) for op, _, reason in fp16.kept_out
                       if _is_compute(op) and (op, _reason(reason)) not in float_outside})
        causes.update(only)
        if fp16.delegates > float32.delegates:
            worse += 1
            text = "; ".join(f"`{op}`: {reason}" for op, reason in only) or "-"
            rows.append(f"| {seed} | {float32.delegates} | {fp16.delegates} | {text.replace('|', '/')} |")
    summary = [f"{compared} networks lowered in both; {worse} split into more delegates in fp16 than in float32.", ""]
    cause_rows = ["| op | reason (fp16 only) | networks |", "| --- | --- | --- |"]
    cause_rows += [f"| `{op}` | {reason.replace('|', '/')} | {n} |" for (op, reason), n in causes.most_common()]
    return [*summary, *cause_rows, "", *rows]


def markdown(outcomes: Sequence[Outcome], title: str = "xnnguard fuzz run") -> str:
    modes = [mode for mode in MODES if any(o.mode == mode for o in outcomes)]
    seeds = sorted({o.seed for o in outcomes})
    findings = sorted((o for o in outcomes if o.status not in ("ok", "invalid")),
                      key=lambda o: (STATUSES.index(o.status), o.seed, o.mode))
    split = sorted((o for o in outcomes if o.split and o.status in ("ok", "wrong")), key=lambda o: (o.mode, o.seed))
    lines = [
        f"# {title}",
        "",
        f"{len(outcomes)} programs: {len(seeds)} networks (seeds {_ranges(seeds)}) in {len(modes)} modes "
        f"({', '.join(modes)}). A program is one network in one mode; `invalid`: PyTorch itself cannot run or "
        "export it (not a finding). Repros: `PYTHONPATH=. python fuzz-out/repro/<seed>-<mode>.py`.",
        "",
        "## Outcomes per mode",
        "",
        *_outcome_table(outcomes, modes),
        "",
        "## Ops left outside XNNPACK",
        "",
        "Compute nodes the partitioner left outside, by its report's rule and reason (numbers as N), ranked by "
        "the programs they occur in.",
        "",
        *_outside_table(outcomes),
        "",
        "## Left as it was by the rewriter",
        "",
        "The rewriter's report: nodes a rewrite could not replace (numbers as N).",
        "",
        *_rewrite_table(outcomes),
        "",
        "## Wrong, failing, crashing and hanging programs",
        "",
        "`stock`: what stock ExecuTorch's flow (no rewrite, its partitioner and quantizer) makes of the same "
        "program (not tried after a crash or a timeout).",
        "",
        "| program | status | stock | delegates | error | repro |",
        "| --- | --- | --- | --- | --- | --- |",
        *(f"| {o.seed} {o.mode} | {o.status} | {o.stock or '-'} | {o.delegates if o.delegates is not None else '-'} | "
          f"{_cell(o.error)} | `repro/{o.seed}-{o.mode}.py` |" for o in findings),
        "",
        "## Programs split into more than one delegate",
        "",
        *_split_causes(outcomes),
        "",
        "| program | delegates | compute left outside | network | repro |",
        "| --- | --- | --- | --- | --- |",
        *(f"| {o.seed} {o.mode} | {o.delegates} | {_outside_ops(o)} | {' -> '.join(o.ops)} | "
          f"`repro/{o.seed}-{o.mode}.py` |" for o in split),
        "",
        "## fp16 against float32",
        "",
        *_fp16_table(outcomes),
        "",
    ]
    return "\n".join(lines)


def _cell(text: str, limit: int = 300) -> str:
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + " ..."


def _ranges(values: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2, 5``."""
    parts: list[str] = []
    for value in values:
        if parts and value == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{value}"
        else:
            parts.append(str(value))
    return ", ".join(parts)


def write(out: Path, outcomes: Iterable[Outcome]) -> Path:
    """``out/report.md`` and a repro for every finding (the network as the outcome recorded it, else its seed's)."""
    outcomes = list(outcomes)
    repro = out / "repro"
    repro.mkdir(parents=True, exist_ok=True)
    for outcome in outcomes:
        if outcome.finding:
            network = outcome.network() if outcome.source else generate(outcome.seed)
            (repro / f"{outcome.seed}-{outcome.mode}.py").write_text(repro_source(network, outcome))
    report = out / "report.md"
    report.write_text(markdown(outcomes))
    return report
