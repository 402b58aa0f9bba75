"""``xnnguard verify``: exit codes, text and JSON output, directories, the runtime in workers, progress."""

from __future__ import annotations

import json
import logging
import os
import pty
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime_check_corpus import ON_ONE_WORKER, program, write_program
from xnnguard.cli import main

pytestmark = ON_ONE_WORKER

GOOD, BAD = "stock_float_conv_linear", "stock_rank7"
XNNGUARD = [sys.executable, "-m", "xnnguard.cli"]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("ptes")
    write_program(directory, GOOD)
    (directory / "nested").mkdir()
    write_program(directory / "nested", BAD)
    return directory


def verify(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
    code = main(["verify", *argv])
    return code, capsys.readouterr().out


def test_exit_code_is_0_when_every_file_passes(corpus_dir: Path, capsys) -> None:
    code, out = verify(capsys, str(corpus_dir / f"{GOOD}.pte"))
    assert code == 0
    assert out.startswith(f"ok    {corpus_dir / GOOD}.pte (1 method, 1 XNNPACK delegate")


def test_exit_code_is_1_when_a_file_has_problems(corpus_dir: Path, capsys) -> None:
    code, _ = verify(capsys, str(corpus_dir))
    assert code == 1


def test_exit_code_is_2_when_an_input_cannot_be_read_even_beside_problems(corpus_dir: Path, tmp_path, capsys) -> None:
    noise = tmp_path / "noise.pte"
    noise.write_bytes(random.Random(1).randbytes(512))
    code, out = verify(capsys, str(corpus_dir), str(noise))
    assert code == 2
    assert f"ERROR {noise}: not an ExecuTorch program" in out


def test_every_message_names_the_file_once(tmp_path, capsys) -> None:
    """A damaged program and a damaged blob: the path is in the line once, never inside the message again."""
    damaged_program = tmp_path / "damaged_prog.pte"
    data = bytearray(program(GOOD))
    data[40:44] = b"\xff\xff\xff\x7f"  # an offset in the Program tables
    damaged_program.write_bytes(bytes(data))
    damaged_blob = tmp_path / "damaged_blob.pte"
    blob = bytearray(program(GOOD))
    header = blob.index(b"XH00")
    blob[header : header + 4] = b"QNN0"
    damaged_blob.write_bytes(bytes(blob))
    _, out = verify(capsys, str(damaged_program), str(damaged_blob))
    lines = out.split("\n\n")[0].splitlines()
    (error,) = [line for line in lines if "damaged_prog" in line]
    assert error.startswith(f"ERROR {damaged_program}: damaged program: ") and error.count("damaged_prog") == 1
    (fail,) = [line for line in lines if "damaged_blob" in line]
    assert fail.startswith(f"FAIL  {damaged_blob}: 1 problem") and fail.count("damaged_blob") == 1
    assert sum(str(tmp_path) in line for line in lines) == 2  # the problem lines do not repeat the path


def test_a_missing_path_is_an_unreadable_input(tmp_path, capsys) -> None:
    code, out = verify(capsys, str(tmp_path / "gone.pte"))
    assert (code, out.splitlines()[0]) == (2, f"ERROR {tmp_path / 'gone.pte'}: no such file or directory")


def test_a_directory_without_pte_files_is_an_unreadable_input(tmp_path, capsys) -> None:
    code, out = verify(capsys, str(tmp_path))
    assert code == 2 and "no .pte file in this directory" in out


def test_a_directory_is_searched_recursively(corpus_dir: Path, capsys) -> None:
    _, out = verify(capsys, str(corpus_dir))
    assert f"ok    {corpus_dir / GOOD}.pte" in out
    assert f"FAIL  {corpus_dir / 'nested' / BAD}.pte: 3 problems" in out
    assert out.rstrip().endswith("2 files: 1 ok, 1 with problems, 0 unreadable")


def test_text_output_lists_each_problem_with_its_kind_and_place(corpus_dir: Path, capsys) -> None:
    _, out = verify(capsys, str(corpus_dir / "nested"))
    problems = [line for line in out.splitlines() if line.startswith("  [")]
    assert len(problems) == 3
    assert problems[0].startswith("  [rank] forward/delegate 0/node 0 (XNNStaticTranspose)/value 0 [")


def test_json_output_has_the_same_content(corpus_dir: Path, capsys) -> None:
    code, out = verify(capsys, str(corpus_dir), "--json")
    document = json.loads(out)
    assert document["exit_code"] == code == 1
    assert document["summary"] == {"files": 2, "ok": 1, "with_problems": 1, "unreadable": 0}
    by_name = {Path(f["source"]).stem: f for f in document["files"]}
    assert by_name[GOOD]["ok"] and by_name[GOOD]["problems"] == []
    assert [p["kind"] for p in by_name[BAD]["problems"]] == ["rank"] * 3
    assert len(by_name[BAD]["problems"][0]["dims"]) == 7


def test_json_gives_an_unreadable_file_the_shape_of_a_report(corpus_dir: Path, tmp_path, capsys) -> None:
    code, out = verify(capsys, str(corpus_dir / f"{GOOD}.pte"), str(tmp_path / "gone.pte"), "--json")
    readable, unreadable = sorted(json.loads(out)["files"], key=lambda entry: entry["ok"])[::-1]
    assert code == 2 and set(readable) == set(unreadable)
    assert [p["kind"] for p in unreadable["problems"]] == ["unreadable"]
    assert unreadable["problems"][0]["message"] == "no such file or directory"


@pytest.mark.parametrize("argv", [["-v", "verify"], ["verify", "-v"]], ids=["before", "after"])
def test_verbose_works_before_and_after_the_subcommand(argv: list[str], corpus_dir: Path, capsys) -> None:
    assert main([*argv, str(corpus_dir / f"{GOOD}.pte")]) == 0
    err = capsys.readouterr().err
    assert "checking 1 file in this process" in err and f"ok    {corpus_dir / GOOD}.pte" in err


@pytest.mark.parametrize("jobs", ["-3", "two"])
def test_a_bad_jobs_value_is_a_usage_error(jobs: str, corpus_dir: Path, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["verify", "--jobs", jobs, str(corpus_dir)])
    assert done.value.code == 2 and "argument --jobs" in capsys.readouterr().err


def test_quiet_prints_only_files_with_problems(corpus_dir: Path, capsys) -> None:
    code, out = verify(capsys, str(corpus_dir), "--quiet")
    assert code == 1
    assert out.splitlines()[0].startswith("FAIL  ") and GOOD not in out and "files:" not in out


def test_help_shows_examples_and_exit_codes(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["verify", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert "xnnguard verify exported/ --load" in out and "2 an input cannot be read" in out


def verify_in_a_process(*argv: str) -> subprocess.CompletedProcess[str]:
    """``xnnguard verify ARGV`` as its own process: what loads the runtime may crash or hang it."""
    return subprocess.run([*XNNGUARD, "verify", *argv], capture_output=True, text=True, timeout=300, check=False)


def runtime_breaking_program() -> bytes:
    """A FullyConnected whose bias is its own output: 1.5's runtime crashes loading it, 1.4's hangs."""
    from tests.mutation import edit

    return edit(program("stock_int4_linear"), r"XNNFullyConnected/bias_id$", 4)


def test_the_runtime_runs_in_workers_and_its_failure_is_reported(corpus_dir: Path) -> None:
    result = verify_in_a_process(str(corpus_dir), "--load", "--jobs", "2")
    assert result.returncode == 1
    assert "[load] forward: the runtime cannot load the method" in result.stdout
    assert "Failed to define tensor" in result.stdout
    assert "Traceback" not in result.stderr and "XNNCompiler" not in result.stderr


def _read_available(fd: int) -> str:
    """What the terminal received so far (without waiting when it received nothing)."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 1 << 16).decode()
    except BlockingIOError:
        return ""


def test_progress_is_drawn_on_a_terminal(corpus_dir: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    controller, terminal = pty.openpty()
    try:
        with open(terminal, "w", closefd=False) as tty:
            monkeypatch.setattr(sys, "stderr", tty)  # a real terminal, as a user's shell gives one
            code, _ = verify(capsys, str(corpus_dir))
        drawn = _read_available(controller)
    finally:
        os.close(controller)
        os.close(terminal)
    assert code == 1
    assert "[############............] 1/2" in drawn and "2/2" in drawn
    assert "\r\x1b[K" in drawn  # the bar is cleared before the summary


def test_no_progress_is_drawn_when_stderr_is_not_a_terminal(corpus_dir: Path, capsys) -> None:
    main(["verify", str(corpus_dir)])
    captured = capsys.readouterr()
    assert captured.out and captured.err == ""


def test_running_the_command_in_process_leaves_logging_as_it_was(corpus_dir: Path, capsys) -> None:
    names = ("torch", "torchao", "executorch", "xnnguard")
    before = {name: (logging.getLogger(name).level, list(logging.getLogger(name).handlers)) for name in names}
    verify(capsys, str(corpus_dir / f"{GOOD}.pte"))
    assert {name: (logging.getLogger(name).level, list(logging.getLogger(name).handlers)) for name in names} == before


def test_jobs_2_and_serial_give_the_same_json(tmp_path, capsys) -> None:
    for index, name in enumerate(["stock_float_conv_linear", "stock_rank7", "stock_qconv_linear", "stock_zoo"] * 5):
        (tmp_path / f"{index:02d}_{name}.pte").write_bytes(program(name))
    (tmp_path / "noise.pte").write_bytes(random.Random(2).randbytes(256))
    serial = json.loads(verify(capsys, str(tmp_path), "--json", "--jobs", "1")[1])
    parallel = json.loads(verify(capsys, str(tmp_path), "--json", "--jobs", "2")[1])
    assert parallel == serial and serial["summary"]["files"] == 21


def test_the_automatic_mode_moves_a_long_check_to_workers_with_the_same_result(
    tmp_path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xnnguard.runtime_check import verify_schedule

    for index, name in enumerate(["stock_float_conv_linear", "stock_rank7", "stock_qconv_linear", "stock_zoo"] * 5):
        (tmp_path / f"{index:02d}_{name}.pte").write_bytes(program(name))
    serial = json.loads(verify(capsys, str(tmp_path), "--json", "--jobs", "1")[1])
    monkeypatch.setattr(verify_schedule, "_ADAPTIVE_AFTER", 0.0)  # "long" from the first file on
    assert main(["-v", "verify", str(tmp_path), "--json"]) == 1
    captured = capsys.readouterr()
    assert "moving the last 20 files to" in captured.err
    assert json.loads(captured.out) == serial


def test_a_static_check_imports_neither_torch_nor_the_runtime(corpus_dir: Path, tmp_path) -> None:
    """The kernel registry comes from a cache made once (in a child process) per installed runtime."""
    probe = (
        "import sys\n"
        "from xnnguard.cli import main\n"
        f"code = main(['verify', {str(corpus_dir / 'nested' / BAD) + '.pte'!r}])\n"
        "heavy = sorted(m for m in sys.modules if m == 'torch' or m.startswith('executorch.extension'))\n"
        "print('HEAVY', heavy, code)\n"
    )
    env = {**os.environ, "XNNGUARD_CACHE_DIR": str(tmp_path / "cache")}
    for _ in range(2):  # the first run fills the cache, the second finds it
        result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
        assert "HEAVY [] 1" in result.stdout, result.stdout + result.stderr
        assert "[rank] forward/delegate 0/node 0 (XNNStaticTranspose)" in result.stdout
    assert len(list((tmp_path / "cache").glob("kernels-*.json"))) == 1


def test_the_cached_kernel_registry_is_the_runtimes(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from xnnguard.runtime_check import missing_kernels

    monkeypatch.setenv("XNNGUARD_CACHE_DIR", str(tmp_path))
    assert missing_kernels._registry_from_child() == missing_kernels._live_registry()


def test_a_file_that_crashes_the_runtime_is_reported_alone(tmp_path) -> None:
    """A FullyConnected whose bias is its own output breaks the native runtime at load: 1.5 crashes, 1.4
    hangs (then --timeout stops it). That file gets the failure and its static problems; the files that
    shared the workers are checked as usual."""
    (tmp_path / "crash.pte").write_bytes(runtime_breaking_program())
    for name in ("stock_float_conv_linear", "stock_qconv_linear", "stock_move_values"):
        write_program(tmp_path, name)
    result = verify_in_a_process(str(tmp_path), "--load", "--jobs", "2", "--timeout", "60", "--json")
    reports = {Path(entry["source"]).stem: entry for entry in json.loads(result.stdout)["files"]}
    assert result.returncode == 1
    assert [name for name, report in reports.items() if not report["ok"]] == ["crash"]
    kinds = [problem["kind"] for problem in reports["crash"]["problems"]]
    assert kinds[-1] == "load" and "unwritten_value" in kinds
    message = reports["crash"]["problems"][-1]["message"]
    assert "the runtime crashed loading it" in message or "the runtime did not finish loading it in 60 s" in message


def test_a_file_still_loading_after_the_timeout_is_reported_as_hung_with_its_static_problems(tmp_path) -> None:
    """No load takes a millisecond: the child is stopped mid-load, the command ends, the file fails."""
    path = tmp_path / "slow.pte"
    path.write_bytes(runtime_breaking_program())
    result = verify_in_a_process(str(path), "--load", "--timeout", "0.001", "--json")
    (report,) = json.loads(result.stdout)["files"]
    assert result.returncode == 1
    kinds = [problem["kind"] for problem in report["problems"]]
    assert kinds[-1] == "load" and "unwritten_value" in kinds
    assert "the runtime did not finish loading it in 0.001 s" in report["problems"][-1]["message"]


def test_a_timeout_that_is_not_a_number_of_seconds_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["verify", "x.pte", "--timeout", "-1"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "--timeout" in err and "give 0 (no limit)" in err


def test_each_report_says_what_each_method_needs_in_text_and_json(corpus_dir: Path, capsys) -> None:
    _, out = verify(capsys, str(corpus_dir / f"{GOOD}.pte"))
    assert "  forward: needs at least " in out and " of memory (planned " in out
    (entry,) = json.loads(verify(capsys, str(corpus_dir / f"{GOOD}.pte"), "--json")[1])["files"]
    (memory,) = entry["memory"]
    assert memory["method"] == "forward" and memory["peak_bytes"] >= memory["largest_buffer_bytes"] > 0


def test_max_memory_makes_a_method_that_needs_more_a_problem(corpus_dir: Path, capsys) -> None:
    code, out = verify(capsys, str(corpus_dir / f"{GOOD}.pte"), "--max-memory", "1KiB")
    assert code == 1 and "[allocation] forward: needs at least" in out and "more than --max-memory 1 KiB" in out
    assert verify(capsys, str(corpus_dir / f"{GOOD}.pte"), "--max-memory", "2GiB")[0] == 0


@pytest.mark.parametrize("size", ["lots", "-1GiB", "2XB"])
def test_a_max_memory_that_is_not_an_amount_of_memory_is_a_usage_error(size: str, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["verify", "x.pte", "--max-memory", size])
    assert done.value.code == 2 and "argument --max-memory" in capsys.readouterr().err


def test_a_data_file_that_is_not_a_ptd_is_a_usage_error_naming_it(corpus_dir: Path, capsys) -> None:
    not_data = corpus_dir / f"{GOOD}.pte"
    with pytest.raises(SystemExit) as done:
        main(["verify", str(not_data), "--data", str(not_data)])
    err = capsys.readouterr().err
    assert done.value.code == 2 and f"argument --data: {not_data}: not an ExecuTorch data file" in err
