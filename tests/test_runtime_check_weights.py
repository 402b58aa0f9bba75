"""``verify_pte(weights=True)`` / ``--weights``: every XNNPACK constant's bytes against its sha256 name."""

from __future__ import annotations

from functools import cache

import torch

from testbed.lowered import lower, run_pte
from tests.runtime_check_corpus import ON_ONE_WORKER, program
from xnnguard.cli import main
from xnnguard.runtime_check import verify_pte
from xnnguard.runtime_check.pte_reader import read_program

pytestmark = ON_ONE_WORKER


def _flip_a_weight_byte(data: bytes) -> bytes:
    """One bit of the largest named constant (a weight, in a segment after the program) flipped."""
    weight = max(read_program(data, "program").named_data.values(), key=lambda entry: entry.size)
    out = bytearray(data)
    out[weight.offset + weight.size // 2] ^= 0x01
    return bytes(out)


def test_an_intact_program_passes_with_and_without_the_weights_check() -> None:
    data = program("stock_qconv_linear")
    assert verify_pte(data).ok
    report = verify_pte(data, weights=True)
    assert report.ok and report.weights_checked == 8 and report.notes == ()


def test_a_flipped_weight_byte_is_flagged_with_the_option_and_ok_without() -> None:
    flipped = _flip_a_weight_byte(program("stock_qconv_linear"))
    assert verify_pte(flipped, run=True).ok  # loads and runs: the runtime never notices
    (problem,) = verify_pte(flipped, weights=True).problems
    assert (problem.kind, problem.method, problem.delegate) == ("weights", "forward", 0)
    assert "the weights were changed after export" in problem.message


def test_the_command_line_option_flags_it(tmp_path, capsys) -> None:
    path = tmp_path / "flipped.pte"
    path.write_bytes(_flip_a_weight_byte(program("stock_float_conv_linear")))
    assert main(["verify", str(path)]) == 0
    assert main(["verify", str(path), "--weights"]) == 1
    assert "[weights] forward/delegate 0/value " in capsys.readouterr().out


@cache
def _external_weights() -> tuple[bytes, bytes]:
    """A linear whose XNNPACK constants ExecuTorch writes to a .ptd file instead of the program."""
    from executorch.exir.passes.external_constants_pass import delegate_external_constants_pass_unlifted

    import xnnguard

    torch.manual_seed(0)
    x = (torch.randn(1, 32),)
    module = torch.export.export(torch.nn.Linear(32, 2).eval(), x).module()
    delegate_external_constants_pass_unlifted(module=module, gen_tag_fn=lambda node: "model")
    lowered = lower(torch.export.export(module, x), x, xnnguard.XnnpackPartitioner())
    return lowered.buffer, bytes(lowered.edge.to_executorch()._tensor_data["model"])


def test_constants_in_external_data_are_said_to_be_unchecked(tmp_path) -> None:
    """Given the .ptd they are in (without it, their keys resolve nowhere: a named_data problem, issue 30)."""
    program_bytes, data = _external_weights()
    (tmp_path / "model.ptd").write_bytes(data)
    report = verify_pte(program_bytes, weights=True, data=tmp_path / "model.ptd")
    assert report.ok and report.weights_checked == 0
    assert report.notes == ("2 constants in external data (a .ptd file), not in the program: not checked",)


def test_constants_not_named_by_hash_are_said_to_be_unchecked() -> None:
    data = program("stock_float_conv_linear")
    key = next(iter(read_program(data, "program").named_data))
    renamed = data.replace(key.encode(), b"w" * len(key))  # in the blob and the program alike: still loads
    assert run_pte(renamed, (torch.randn(1, 3, 8, 8),))
    report = verify_pte(renamed, weights=True)
    assert report.ok and any("not named by the hash of their bytes: not checked" in note for note in report.notes)
