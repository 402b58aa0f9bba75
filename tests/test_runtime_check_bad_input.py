"""Bad input gets a clear error or problem naming the file and the damage: never a traceback or a hang."""

from __future__ import annotations

import os
import random
import signal
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.runtime_check_corpus import ON_ONE_WORKER, program, write_program
from xnnguard.runtime_check import PteReadError, Report, verify_pte
from xnnguard.runtime_check.report import KINDS

pytestmark = ON_ONE_WORKER

KNOWN_KINDS = set(KINDS) - {"load", "run", "weights", "unreadable"}  # what a static check reports
FUZZ_SOURCES = ["stock_rank7", "stock_qconv3d_relu", "stock_qconv_linear"]
MUTATIONS_PER_SOURCE = 400  # 1,200 in all


def test_an_empty_file_is_named_and_called_empty(tmp_path: Path) -> None:
    path = tmp_path / "empty.pte"
    path.write_bytes(b"")
    with pytest.raises(PteReadError, match=f"^{path}: empty file$"):
        verify_pte(path)


def test_a_missing_file_cannot_be_opened(tmp_path: Path) -> None:
    with pytest.raises(PteReadError, match=r"missing\.pte: cannot open: No such file"):
        verify_pte(tmp_path / "missing.pte")


def test_a_directory_is_not_a_pte(tmp_path: Path) -> None:
    with pytest.raises(PteReadError, match="is a directory"):
        verify_pte(tmp_path)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.pte"
    os.mkfifo(fifo)
    with time_limit(seconds=5, what="opening a FIFO"), pytest.raises(PteReadError, match="not a regular file"):
        verify_pte(fifo)


def test_a_source_of_another_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"a \.pte source is a path, bytes or a memoryview, not list"):
        verify_pte([1, 2, 3])


def test_random_bytes_are_not_an_executorch_program() -> None:
    with pytest.raises(PteReadError, match="not an ExecuTorch program"):
        verify_pte(random.Random(0).randbytes(4096))


def test_another_flatbuffer_is_not_an_executorch_program() -> None:
    data = program("stock_float_conv_linear")
    blob = data[data.index(b"XH00") - 4 :]  # the XNNPACK blob on its own: a flatbuffer, but not a Program
    with pytest.raises(PteReadError, match="no ET12 identifier"):
        verify_pte(blob)


def test_a_truncated_file_says_how_long_the_program_should_be() -> None:
    data = program("stock_qconv_linear")
    with pytest.raises(PteReadError, match=r"the program has \d+ bytes, file has 100"):
        verify_pte(data[:100])


def test_a_segment_past_the_end_of_the_file_is_named() -> None:
    data = program("stock_qconv_linear")
    segments_end = len(data) - 1  # weights are in segments; cutting one byte leaves the last segment short
    with pytest.raises(PteReadError, match=r"segment .* past the end of the file .* the file is cut off"):
        verify_pte(data[:segments_end])


def test_a_corrupted_xnnpack_blob_is_a_blob_format_problem() -> None:
    data = bytearray(program("stock_float_conv_linear"))
    header = data.index(b"XH00")
    struct.pack_into("<I", data, header + 6, 10**6)  # flatbuffer offset past the blob
    (problem,) = verify_pte(bytes(data)).problems
    assert (problem.kind, problem.method, problem.delegate) == ("blob_format", "forward", 0)
    assert "XNNPACK header puts the graph at bytes 1000000" in problem.message


def test_another_backends_blob_under_the_xnnpack_id_is_a_blob_format_problem() -> None:
    data = bytearray(program("stock_float_conv_linear"))
    header = data.index(b"XH00")
    data[header : header + 4] = b"QNN0"
    (problem,) = verify_pte(bytes(data)).problems
    assert problem.kind == "blob_format" and "not an XNNPACK graph" in problem.message


def test_a_delegate_of_another_backend_is_listed_as_not_checked() -> None:
    data = program("stock_rank7").replace(b"XnnpackBackend", b"OtherBackend00")
    report = verify_pte(data)
    assert report.ok and report.delegates == 0 and report.other_delegates == ("OtherBackend00",)


@contextmanager
def time_limit(seconds: float, what: str) -> Iterator[None]:
    """Fail instead of hanging: a hang detector, not a speed target (one ~4 KB file is milliseconds of work)."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"{what} still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _mutate(data: bytes, rng: random.Random, other: bytes) -> bytes:
    """One seeded mutation: bit flips (often inside the Program flatbuffer or the blob), a truncation,
    a spliced segment of this or another program, or an offset-sized field set to an extreme."""
    out = bytearray(data)
    choice = rng.randrange(6)
    if choice == 0:  # bit flips anywhere
        for _ in range(rng.randint(1, 8)):
            position = rng.randrange(len(out))
            out[position] ^= 1 << rng.randrange(8)
    elif choice == 1:  # bit flips in the first 2 KiB: headers, Program tables and vtables
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(min(len(out), 2048))
            out[position] ^= 1 << rng.randrange(8)
    elif choice == 2:  # bit flips in the XNNPACK blob
        start = data.find(b"XH00")
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(max(start, 0), len(out))
            out[position] ^= 1 << rng.randrange(8)
    elif choice == 3:  # truncation
        del out[rng.randrange(len(out)) :]
    elif choice == 4:  # a segment of this or another program spliced over a random place
        source = other if rng.random() < 0.5 else data
        start = rng.randrange(len(source))
        chunk = source[start : start + rng.randint(4, 256)]
        position = rng.randrange(len(out))
        out[position : position + len(chunk)] = chunk
    else:  # an aligned u32 (an offset, a length, a count) set to an extreme
        position = rng.randrange(0, len(out) - 4, 4)
        struct.pack_into("<I", out, position, rng.choice([0, 1, 0x7FFFFFFF, 0xFFFFFFFF, len(out), rng.getrandbits(32)]))
    return bytes(out)


@pytest.mark.parametrize("source", FUZZ_SOURCES)
def test_seeded_mutations_give_a_report_or_a_clean_error(source: str) -> None:
    data, other = program(source), program("stock_maxpool3d")
    rng = random.Random(f"xnnguard-fuzz-{source}")
    outcomes = {"report": 0, "error": 0}
    for case in range(MUTATIONS_PER_SOURCE):
        mutated = _mutate(data, rng, other)
        try:
            with time_limit(seconds=5, what=f"mutation {case}"):
                report = verify_pte(mutated)
        except PteReadError as error:
            assert str(error).startswith(f"<{len(mutated)} bytes>: "), (case, error)
            outcomes["error"] += 1
        else:
            assert isinstance(report, Report)
            assert report.kinds() <= KNOWN_KINDS, (case, report)
            assert all(problem.message for problem in report.problems)
            outcomes["report"] += 1
    assert outcomes["report"] and outcomes["error"], outcomes  # the mutations reach both outcomes


def test_a_path_to_a_mutated_file_names_the_path(tmp_path: Path) -> None:
    path = write_program(tmp_path, "stock_rank7")
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(PteReadError, match=f"^{path}: "):
        verify_pte(path)


def test_importing_the_checker_imports_neither_torch_nor_the_runtime() -> None:
    """``xnnguard verify`` reads flatbuffers: a CI job checking one file must not wait for torch."""
    import subprocess
    import sys

    probe = (
        "import sys, xnnguard.runtime_check.verify, xnnguard.cli\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('executorch.')))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout
