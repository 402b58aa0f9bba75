"""The README's examples (and those of the pages under ``docs/``) run as written and print what they show.

A document's ``python`` blocks run in order in one namespace, in one folder; a ``text`` block right after a python
block is what that block prints. Its ``console`` blocks are ``$ command`` lines (``xnnguard`` commands,
run in the same folder, on the files the python blocks wrote) each followed by what the command prints.
In a shown output a line ``...`` stands for any number of lines.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```(\w+)\n(.*?)```", flags=re.DOTALL)


def _blocks(document: Path = README) -> list[tuple[str, str]]:
    return BLOCK.findall(document.read_text())


def _matches(shown: str, printed: str) -> bool:
    """``printed`` is ``shown``, where a shown line ``...`` may stand for any lines."""
    lines = shown.strip().splitlines()
    pattern = "\n".join(".*?" if line.strip() == "..." else re.escape(line.rstrip()) for line in lines)
    printed = "\n".join(line.rstrip() for line in printed.strip().splitlines())
    return re.fullmatch(pattern, printed, flags=re.DOTALL) is not None


def _commands(block: str) -> list[tuple[str, str]]:
    """``(command, what it prints)`` for each ``$ command`` of a console block."""
    found: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            found.append((line[2:], []))
        elif found:
            found[-1][1].append(line)
    return [(command, "\n".join(lines)) for command, lines in found]


def test_the_readme_has_examples_with_their_output() -> None:
    kinds = [kind for kind, _ in _blocks()]
    assert "python" in kinds and "text" in kinds and "console" in kinds


def test_the_first_example_is_within_the_first_forty_lines() -> None:
    assert README.read_text().index("```python") < len("\n".join(README.read_text().splitlines()[:40]))


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_a_documents_examples_run_and_print_what_it_shows(
    document: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # examples write files
    namespace: dict[str, object] = {"__name__": "__readme__"}
    blocks = _blocks(document)
    for index, (kind, block) in enumerate(blocks):
        following = blocks[index + 1] if index + 1 < len(blocks) else ("", "")
        if kind == "python":
            printed = StringIO()
            try:
                with redirect_stdout(printed):
                    exec(compile(block, f"README.md block {index}", "exec"), namespace)
            except Exception as error:  # name the block that broke
                raise AssertionError(f"{document.name} block {index} failed: {error!r}\n{block}") from error
            if following[0] == "text":
                assert _matches(following[1], printed.getvalue()), (block, printed.getvalue())
        elif kind == "console":
            for command, shown in _commands(block):
                argv = shlex.split(command)
                assert argv[0] == "xnnguard", f"the README runs {argv[0]}: only xnnguard commands are tested"
                done = subprocess.run([sys.executable, "-m", "xnnguard", *argv[1:]], capture_output=True,
                                      text=True, check=False, timeout=600)
                assert _matches(shown, done.stdout), (command, done.stdout, done.stderr)
    assert os.getcwd() == str(tmp_path)
