"""The README's Python examples run as written, in order, in one namespace."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_the_readme_has_python_examples() -> None:
    assert len(_python_blocks()) >= 2


def test_the_readme_examples_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)  # examples may write files
    namespace: dict[str, object] = {"__name__": "__readme__"}
    for index, block in enumerate(_python_blocks()):
        try:
            exec(compile(block, f"README.md python block {index}", "exec"), namespace)
        except Exception as error:  # name the block that broke
            raise AssertionError(f"README python block {index} failed: {error!r}\n{block}") from error
    assert os.getcwd() == str(tmp_path)
