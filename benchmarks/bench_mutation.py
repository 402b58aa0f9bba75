"""The mutation tests of issues 14 and 30 at scale: how often does ``verify`` call a broken program ok?

Field level (issue 14): the three programs of ``tests/test_runtime_check_mutation.py`` (float conv + linear,
static-int8 conv + linear, transpose/concatenate/pad) and five more of the test corpus (the node-type zoo,
per-tensor int8, dynamic int8, int4 weights, the issue-13 pad), each mutated in one field of its XNNPACK
graph at a time, up to ``MUTANTS_PER_SOURCE`` distinct mutants each (a fixed seed).

Byte level (issue 30): the same programs and an MLP, damaged in raw 32-bit words and single bytes of the
Program and XNNPACK flatbuffers (``BYTE_MUTANTS_PER_SPAN`` of each per flatbuffer), cut at 64 lengths and
with garbage appended. ``verify`` is asked for ``MAX_MEMORY`` at most and the runtime's worker is capped.

``verify_pte`` must never crash or hang; every mutant it calls ok is loaded and run by the real runtime in
a worker process (a crash costs a worker). Byte mutants the structural verifier rejects are run too: the
runtime must reject every one (no false alarm).

Figures, measured in this run: mutants, unreadable, flagged, verify-ok, verify-ok but failing in the runtime
(share of the ok ones; target at most 2 %), verifier crashes and hangs (target 0), and runtime crashes among
the ok ones.
"""

from __future__ import annotations

import time
from collections import Counter

from benchmarks.bench_verify import Figure

SOURCES = [
    "stock_float_conv_linear",
    "stock_qconv_linear",
    "stock_move_values",
    "stock_zoo",
    "stock_qconv_linear_per_tensor",
    "stock_dynamic_linear",
    "stock_int4_linear",
    "stock_qconv_pad",
]
MUTANTS_PER_SOURCE = 1500
BYTE_SOURCES = [*SOURCES, "stock_mlp"]
BYTE_MUTANTS_PER_SPAN = 150
MAX_MEMORY = 2**30
SANDBOX_MEMORY = 6 * 2**30


def main() -> bool:
    """Print the figures of both arms; True when every target is met."""
    fields = field_level()
    return byte_level() and fields


def field_level() -> bool:
    """Print the figures; True when every target is met."""
    from tests.mutation import RuntimeSandbox, mutants
    from tests.runtime_check_corpus import program
    from xnnguard.runtime_check import PteReadError, verify_pte

    print(f"bench_mutation: single-field mutants of {len(SOURCES)} real programs, verify vs the runtime")
    started = time.perf_counter()
    total: Counter[str] = Counter()
    failing: list[str] = []
    with RuntimeSandbox(timeout=60) as sandbox:
        for source in SOURCES:
            counts: Counter[str] = Counter()
            for field, value, mutated in mutants(program(source), MUTANTS_PER_SOURCE, f"bench-{source}"):
                counts["mutants"] += 1
                try:
                    report = verify_pte(mutated)
                except PteReadError:
                    counts["unreadable"] += 1
                    continue
                except Exception as error:  # the figure this benchmark exists for: must stay 0
                    counts["verifier crashes"] += 1
                    failing.append(f"{source}: {field.path} = {value}: verify raised {error!r}")
                    continue
                if not report.ok:
                    counts["flagged"] += 1
                    continue
                counts["ok"] += 1
                outcome = sandbox.outcome(mutated)
                if outcome not in ("runs", "skipped"):
                    counts["ok but failing"] += 1
                    counts[f"ok but failing: {outcome}"] += 1
                    failing.append(f"{source}: {field.path} = {value}: {outcome}: {sandbox.last_message[:160]}")
            print(
                f"  {source}: " + ", ".join(f"{counts[k]} {k}" for k in ("mutants", "flagged", "ok", "ok but failing"))
            )
            total += counts
    for line in failing:
        print(f"    {line}")
    share = total["ok but failing"] / max(total["ok"], 1)
    print(
        f"  all: {total['mutants']} mutants, {total['flagged']} flagged, {total['unreadable']} unreadable, "
        f"{total['ok']} ok, {total['ok but failing']} of them failing in the runtime "
        f"({total['ok but failing: crash']} crashes), {time.perf_counter() - started:.0f} s"
    )
    figures = [
        Figure("verify-ok mutants failing in the runtime", 100 * share, "%", "<= 2 %", share <= 0.02),
        Figure("verifier crashes", total["verifier crashes"], "", "0", total["verifier crashes"] == 0),
    ]
    for figure in figures:
        print(figure)
    return all(figure.met for figure in figures)


def byte_level() -> bool:
    """Print the byte-level figures; True when every target is met."""
    from tests.byte_mutation import byte_level_mutants
    from tests.mutation import RuntimeSandbox
    from tests.runtime_check_corpus import program
    from tests.test_runtime_check_bad_input import time_limit
    from xnnguard.runtime_check import PteReadError, verify_pte

    print(f"bench_mutation: byte-level mutants of {len(BYTE_SOURCES)} real programs, verify vs the runtime")
    started = time.perf_counter()
    total: Counter[str] = Counter()
    failing: list[str] = []
    with RuntimeSandbox(timeout=60, memory_limit=SANDBOX_MEMORY) as sandbox:
        for source in BYTE_SOURCES:
            counts: Counter[str] = Counter()
            for mutant in byte_level_mutants(program(source), BYTE_MUTANTS_PER_SPAN, f"bench-bytes-{source}"):
                counts["mutants"] += 1
                try:
                    with time_limit(seconds=10, what=mutant.where):
                        report = verify_pte(mutant.data, max_memory=MAX_MEMORY)
                except PteReadError as error:
                    counts["unreadable"] += 1
                    rejected = "flatbuffers verifier rejects" in error.detail
                except TimeoutError:
                    counts["verifier hangs"] += 1
                    failing.append(f"{source}: {mutant.where}: verify still running after 10 s")
                    continue
                except Exception as error:  # the figure this benchmark exists for: must stay 0
                    counts["verifier crashes"] += 1
                    failing.append(f"{source}: {mutant.where}: verify raised {error!r}")
                    continue
                else:
                    rejected = report.kinds() == {"flatbuffer"}
                    if report.ok:
                        counts["ok"] += 1
                        outcome = sandbox.outcome(mutant.data)
                        if outcome not in ("runs", "skipped"):
                            counts["ok but failing"] += 1
                            counts[f"ok but failing: {outcome}"] += 1
                            failing.append(f"{source}: {mutant.where}: {outcome}: {sandbox.last_message[:160]}")
                        continue
                    counts["flagged"] += 1
                if rejected:
                    counts["verifier rejects"] += 1
                    if sandbox.outcome(mutant.data) in ("runs", "skipped"):
                        counts["false alarms"] += 1
                        failing.append(f"{source}: {mutant.where}: rejected by the verifier, but the runtime runs it")
            print(
                f"  {source}: "
                + ", ".join(f"{counts[k]} {k}" for k in ("mutants", "unreadable", "flagged", "ok", "ok but failing"))
            )
            total += counts
    for line in failing:
        print(f"    {line}")
    share = total["ok but failing"] / max(total["ok"], 1)
    print(
        f"  all: {total['mutants']} mutants, {total['unreadable']} unreadable, {total['flagged']} flagged, "
        f"{total['ok']} ok, {total['ok but failing']} of them failing in the runtime "
        f"({total['ok but failing: crash']} crashes); {total['verifier rejects']} rejected by the structural "
        f"verifier, {total['false alarms']} of them run by the runtime; {time.perf_counter() - started:.0f} s"
    )
    figures = [
        Figure("byte-level verify-ok mutants failing in the runtime", 100 * share, "%", "<= 2 %", share <= 0.02),
        Figure(
            "byte-level verifier crashes and hangs",
            total["verifier crashes"] + total["verifier hangs"],
            "",
            "0",
            total["verifier crashes"] + total["verifier hangs"] == 0,
        ),
        Figure("structural rejections the runtime runs", total["false alarms"], "", "0", total["false alarms"] == 0),
    ]
    for figure in figures:
        print(figure)
    return all(figure.met for figure in figures)


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
