"""Every ExecuTorch name xnnguard uses is listed in ``xnnguard.boundary``, and private ones are reached only there."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from xnnguard.boundary import REACHED, Reached
from xnnguard.boundary.package_files import executorch_dir
from xnnguard.boundary.releases import executorch_version

PACKAGE = Path(__file__).resolve().parents[1] / "xnnguard"
BOUNDARY = PACKAGE / "boundary"
LISTED = {reached.name for reached in REACHED}
# Text that means "a file inside the installed ExecuTorch is read here".
FILE_MARKERS = ("submodule_search_locations", ".fbs", "xnnpack_constants.py", "data/bin")


def _modules(*, outside_boundary: bool) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if outside_boundary and BOUNDARY in path.parents:
            continue
        yield path, ast.parse(path.read_text(), str(path))


def _executorch_imports(tree: ast.Module) -> Iterator[tuple[str, str]]:
    """(dotted name imported, the local name it is bound to) for every import of an ExecuTorch name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "executorch":
            for alias in node.names:
                yield f"{node.module}.{alias.name}", alias.asname or alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "executorch":
                    yield alias.name, alias.asname or alias.name.split(".")[0]


def _is_private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split("."))


def test_every_executorch_name_xnnguard_imports_is_listed_in_the_boundary() -> None:
    unlisted = {
        f"{path.relative_to(PACKAGE.parent)}: {name}"
        for path, tree in _modules(outside_boundary=False)
        for name, _ in _executorch_imports(tree)
        if not any(listed == name or listed.startswith(f"{name}.") for listed in LISTED)
    }
    assert not unlisted, f"add these to xnnguard.boundary.REACHED (why, since when): {sorted(unlisted)}"


def test_no_module_outside_the_boundary_imports_a_private_executorch_name() -> None:
    private = [
        f"{path.relative_to(PACKAGE.parent)}: {name}"
        for path, tree in _modules(outside_boundary=True)
        for name, _ in _executorch_imports(tree)
        if _is_private(name)
    ]
    assert not private, f"reach these through xnnguard.boundary: {private}"


# The last part of each private name listed (``_get_operator_names``, ``SUPPORTED_PATTERNS``, ...): used
# under that name anywhere outside the boundary (called, overridden, or spelled in a string), it is reached.
PRIVATE_LEAVES = {reached.name.rsplit(".", 1)[-1] for reached in REACHED if reached.private and not reached.is_file}


def test_no_module_outside_the_boundary_uses_a_private_attribute_of_an_executorch_name() -> None:
    found = []
    for path, tree in _modules(outside_boundary=True):
        bound = {local for _, local in _executorch_imports(tree)}
        for node in ast.walk(tree):
            where = f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', '?')}"
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in bound):
                found.append(f"{where}: {node.value.id}.{node.attr}")
            name = (node.attr if isinstance(node, ast.Attribute) else node.name if isinstance(node, ast.FunctionDef)
                    else node.value if isinstance(node, ast.Constant) else None)
            if name in PRIVATE_LEAVES:
                found.append(f"{where}: {name}")
    assert not found, f"reach these through xnnguard.boundary: {found}"


def test_no_module_outside_the_boundary_reads_a_file_inside_the_executorch_package() -> None:
    found = []
    for path, tree in _modules(outside_boundary=True):
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
            if isinstance(node, ast.Attribute) and node.attr == "submodule_search_locations":
                text = node.attr
            is_docstring_like = text is not None and "\n" in text
            if text is not None and not is_docstring_like and any(marker in text for marker in FILE_MARKERS):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {text!r}")
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("find_spec", "import_module")
                    and node.args and isinstance(node.args[0], ast.Constant)
                    and str(node.args[0].value).split(".")[0] == "executorch"):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, f"read ExecuTorch's files through xnnguard.boundary.package_files: {found}"


def test_each_listed_name_says_why_it_is_needed() -> None:
    assert all(reached.why.strip() for reached in REACHED)
    assert len(LISTED) == len(REACHED), "a name is listed twice"


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("+")[0].split(".")[:3])


def _resolve(reached: Reached) -> object:
    if reached.is_file:
        root = executorch_dir()
        assert root is not None
        path = root / reached.name.removeprefix("file:")
        assert path.exists(), path
        return path
    parts = reached.name.split(".")
    for split in range(len(parts), 0, -1):  # the longest prefix that imports, then attributes
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(reached.name)


@pytest.mark.release_sensitive
@pytest.mark.parametrize("reached", REACHED, ids=lambda reached: reached.name)
def test_each_listed_name_exists_in_the_installed_release_from_its_first_release(reached: Reached) -> None:
    version = executorch_version()
    assert version is not None
    if _release(version) < _release(reached.since):
        pytest.skip(f"{reached.name} is used from ExecuTorch {reached.since} on; {version} is installed")
    _resolve(reached)
