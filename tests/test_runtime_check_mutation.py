"""The seeded, structure-aware mutation test (issue 14): does ``ok`` mean "it loads and runs"?

Three small real programs (float conv + linear, static-int8 conv + linear, a transpose/concatenate/pad
one), each changed in one field of its XNNPACK graph at a time (value ids, dims, datatypes, flags,
quantization parameters, node parameters and ids, vector lengths, union tags). ``verify_pte`` must never
crash on a mutant; every mutant it calls ok is loaded and run by the real runtime in a worker process, and
at most 2 % of them may fail there. ``benchmarks/bench_mutation.py`` runs the same on more mutants.

The byte-level arm (issue 30, at the end) damages bytes instead of fields: what a truncated upload, a cache
that flips bits or a tool that rewrites a word does.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from tests.byte_mutation import byte_level_mutants
from tests.mutation import RuntimeSandbox, mutants
from tests.runtime_check_corpus import ON_ONE_WORKER, program
from tests.test_runtime_check_bad_input import time_limit
from xnnguard.runtime_check import PteReadError, verify_pte
from xnnguard.runtime_check.report import KINDS

pytestmark = ON_ONE_WORKER

SOURCES = ["stock_float_conv_linear", "stock_qconv_linear", "stock_move_values"]
MUTANTS_PER_SOURCE = 400
MAX_OK_BUT_FAILING = 0.02


@dataclasses.dataclass
class Outcomes:
    """Per source, counts of what verify and the runtime did; and each mutant verify calls ok that fails in
    the runtime, described with what it does in a fresh worker (the sandbox's worker serves many programs:
    a failure only after others ran points at one of those)."""

    counts: dict[str, Counter[str]] = dataclasses.field(default_factory=dict)
    failing: list[str] = dataclasses.field(default_factory=list)

    def total(self) -> Counter[str]:
        return sum(self.counts.values(), Counter())

    def record_failure(self, where: str, outcome: str, sandbox: RuntimeSandbox, data: bytes) -> None:
        message = sandbox.last_message[:160]
        with RuntimeSandbox(timeout=sandbox.timeout, memory_limit=sandbox.memory_limit) as fresh:
            alone = fresh.outcome(data)
        self.failing.append(f"{where}: {outcome} ({message}); in a fresh worker: {alone}")

    def share_failing(self) -> tuple[float, str]:
        total = self.total()
        share = total["ok_but_fails"] / total["ok"]
        return share, f"{share:.1%} of {total['ok']} ok mutants fail: {self.failing}; {dict(total)}"


@pytest.fixture(scope="module")
def outcomes() -> Iterator[Outcomes]:
    """Per source: how many mutants were flagged, and for the ones verify calls ok, what the runtime did."""
    found = Outcomes()
    with RuntimeSandbox(timeout=60) as sandbox:
        for source in SOURCES:
            data = program(source)
            assert sandbox.outcome(data) == "runs", sandbox.last_message
            counts: Counter[str] = Counter()
            for case, (field, value, mutated) in enumerate(mutants(data, MUTANTS_PER_SOURCE, f"xnnguard-{source}")):
                with time_limit(seconds=5, what=f"verifying mutant {case} ({field.path} = {value})"):
                    report = verify_pte(mutated)
                assert report.kinds() <= set(KINDS), (field.path, value, str(report))
                counts["mutants"] += 1
                if not report.ok:
                    counts["flagged"] += 1
                    continue
                counts["ok"] += 1
                outcome = sandbox.outcome(mutated)
                counts[f"ok_{outcome}"] += 1
                if outcome not in ("runs", "skipped"):
                    counts["ok_but_fails"] += 1
                    found.record_failure(f"{source} {field.path} = {value}", outcome, sandbox, mutated)
            found.counts[source] = counts
    yield found


@pytest.mark.parametrize("source", SOURCES)
def test_mutants_reach_both_verdicts(source: str, outcomes: Outcomes) -> None:
    counts = outcomes.counts[source]
    assert counts["mutants"] >= MUTANTS_PER_SOURCE * 0.9 and counts["flagged"] and counts["ok"], counts


def test_at_most_2_percent_of_the_mutants_verify_calls_ok_fail_in_the_runtime(outcomes: Outcomes) -> None:
    share, description = outcomes.share_failing()
    assert share <= MAX_OK_BUT_FAILING, description


# The byte-level arm (issue 30): raw 32-bit words and single bytes of the Program and XNNPACK flatbuffers,
# truncations at 64 lengths and garbage appended, of a float conv net, its static-int8 twin and an MLP.
# Every mutant verify calls ok is loaded and run by the runtime in a worker process capped at
# SANDBOX_MEMORY; verify is asked for MAX_MEMORY at most, so "ok" means "loads and runs within 1 GiB".
BYTE_SOURCES = ["stock_float_conv_linear", "stock_qconv_linear", "stock_mlp"]
BYTE_MUTANTS_PER_SPAN = 20  # word mutants and byte mutants each, per flatbuffer
MAX_MEMORY = 2**30
SANDBOX_MEMORY = 6 * 2**30
BYTE_ARM_BUDGET = 300.0  # seconds for the whole arm on one core (a hang detector: it takes well under a minute)


@pytest.fixture(scope="module")
def byte_outcomes() -> Iterator[Outcomes]:
    """Per source: counts of mutants, unreadable, flagged, ok and what the runtime did with the ok ones; and
    for those the structural checks reject (the runtime's flatbuffers verifier), what the runtime did."""
    found = Outcomes()
    started = time.monotonic()
    with RuntimeSandbox(timeout=60, memory_limit=SANDBOX_MEMORY) as sandbox:
        for source in BYTE_SOURCES:
            data = program(source)
            assert sandbox.outcome(data) == "runs", sandbox.last_message
            counts: Counter[str] = Counter()
            for case, mutant in enumerate(byte_level_mutants(data, BYTE_MUTANTS_PER_SPAN, f"xnnguard-bytes-{source}")):
                assert time.monotonic() - started < BYTE_ARM_BUDGET, f"the byte-level arm overran at {source} {case}"
                counts["mutants"] += 1
                try:
                    with time_limit(seconds=5, what=f"verifying byte mutant {case} ({mutant.where})"):
                        report = verify_pte(mutant.data, max_memory=MAX_MEMORY)
                except PteReadError as error:
                    counts["unreadable"] += 1
                    rejected = "flatbuffers verifier rejects" in error.detail
                else:
                    assert report.kinds() <= set(KINDS), (mutant.where, str(report))
                    rejected = report.kinds() == {"flatbuffer"}
                    if report.ok:
                        counts["ok"] += 1
                        outcome = sandbox.outcome(mutant.data)
                        counts[f"ok_{outcome}"] += 1
                        if outcome not in ("runs", "skipped"):
                            counts["ok_but_fails"] += 1
                            found.record_failure(f"{source} {mutant.where}", outcome, sandbox, mutant.data)
                        continue
                    counts["flagged"] += 1
                if rejected:  # the structural verifier says no: the runtime's own verifier must say no too
                    counts["verifier_rejects"] += 1
                    if sandbox.outcome(mutant.data) in ("runs", "skipped"):
                        counts["verifier_false_alarms"] += 1
            found.counts[source] = counts
    yield found


@pytest.mark.parametrize("source", BYTE_SOURCES)
def test_byte_level_mutants_reach_every_verdict(source: str, byte_outcomes: Outcomes) -> None:
    counts = byte_outcomes.counts[source]
    assert counts["unreadable"] and counts["flagged"] and counts["ok"] and counts["verifier_rejects"], counts


def test_at_most_2_percent_of_the_byte_level_mutants_verify_calls_ok_fail_in_the_runtime(
    byte_outcomes: Outcomes,
) -> None:
    share, description = byte_outcomes.share_failing()
    assert share <= MAX_OK_BUT_FAILING, description


def test_every_byte_level_mutant_the_structural_verifier_rejects_is_refused_by_the_runtime(
    byte_outcomes: Outcomes,
) -> None:
    """Neither stricter than the runtime's verifier: what it rejects, the runtime rejects too."""
    total = byte_outcomes.total()
    assert total["verifier_rejects"] and total["verifier_false_alarms"] == 0, dict(total)
