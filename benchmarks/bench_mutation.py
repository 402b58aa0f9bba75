"""The mutation test of issue 14 at scale: how often does ``verify`` call a broken program ok?

The three programs of ``tests/test_runtime_check_mutation.py`` (float conv + linear, static-int8 conv +
linear, transpose/concatenate/pad) and five more of the test corpus (the node-type zoo, per-tensor int8,
dynamic int8, int4 weights, the issue-13 pad), each mutated in one field of its XNNPACK graph at a time,
up to ``MUTANTS_PER_SOURCE`` distinct mutants each (a fixed seed). ``verify_pte`` must never crash; every
mutant it calls ok is loaded and run by the real runtime in a worker process (a crash costs a worker).

Figures, measured in this run: mutants, flagged, verify-ok, verify-ok but failing in the runtime (share of
the ok ones; target at most 2 %), verifier crashes (target 0), and runtime crashes among the ok ones.
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


def main() -> bool:
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


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
