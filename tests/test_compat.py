"""The supported ExecuTorch releases: stated once, refused outside them at import."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from xnnguard import compat

pytestmark = pytest.mark.release_sensitive

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("version", ["1.4.0", "1.4.1", "1.5.0", "1.5.1", "1.5.1+cpu", "1.5.2"])
def test_a_release_in_the_range_is_supported(version: str) -> None:
    assert compat.is_supported(version)


@pytest.mark.parametrize("version", ["1.3.1", "1.6.0", "1.6.0.dev20261101", "2.0.0", "nightly"])
def test_a_release_outside_the_range_is_not(version: str) -> None:
    assert not compat.is_supported(version)


def test_pyproject_asks_for_the_range_the_import_check_accepts() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"executorch{compat.SUPPORTED_EXECUTORCH}" in dependencies


def test_the_installed_release_is_supported() -> None:
    version = compat.executorch_version()
    assert version is not None and compat.is_supported(version)


def _import_with_executorch_metadata(tmp_path: Path, version: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``import xnnguard`` in a fresh interpreter that finds a distribution record of ``executorch==version`` first.

    The record is the metadata pip writes (``executorch-<version>.dist-info/METADATA``), on ``PYTHONPATH``
    ahead of the installed one: what ``importlib.metadata`` reads to tell the installed version.
    """
    record = tmp_path / f"executorch-{version}.dist-info"
    record.mkdir()
    (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: executorch\nVersion: {version}\n")
    inherited = {key: value for key, value in os.environ.items() if key != compat.ALLOW_UNSUPPORTED_ENV}
    environment = {**inherited, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), **env}
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", "import xnnguard; print('imported')"],
        capture_output=True, text=True, env=environment, timeout=120,
    )


def test_import_refuses_an_unsupported_release_naming_it_and_the_range(tmp_path: Path) -> None:
    result = _import_with_executorch_metadata(tmp_path, "1.3.1")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("xnnguard.compat.UnsupportedExecuTorchError: xnnguard supports ExecuTorch >=1.4.0,<1.6")
    assert "ExecuTorch 1.3.1 is installed" in last


def test_an_unsupported_release_only_warns_when_the_user_allows_it(tmp_path: Path) -> None:
    result = _import_with_executorch_metadata(tmp_path, "1.6.0", **{compat.ALLOW_UNSUPPORTED_ENV: "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported"
    assert "ExecuTorch 1.6.0 is installed" in result.stderr and "going on untested" in result.stderr


def test_the_runtime_verify_loads_has_the_quantized_kernels_whatever_was_imported_first() -> None:
    """1.4.0's quantized kernel library registers nothing when imported before the runtime, and a second
    import does nothing: a program with q/dq outside XNNPACK then failed to load in that process."""
    script = (
        "import json, sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "import executorch.kernels.quantized\n"  # before the runtime: what 1.4.0 cannot take
        "from xnnguard.runtime_check.runtime_load import import_runtime\n"
        "names = import_runtime()._get_operator_names()\n"
        "json.dump([n for n in names if n.startswith('quantized_decomposed::')], sys.stdout)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "quantized_decomposed::dequantize_per_tensor.out" in result.stdout
