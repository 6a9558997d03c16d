"""The package's size limits (issue 20): no module of labswarm/ over 400 lines, no function over 80. A module
past them is asking to be split (the project's standards); this test names each one that is."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "labswarm"
#: The most lines a module may have.
MODULE_LINES = 400
#: The most lines a function (or method) may have, its docstring included.
FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_package_has_modules_to_check() -> None:
    assert len(_modules()) > 100


def test_no_module_is_longer_than_400_lines() -> None:
    long = {str(p.relative_to(PACKAGE.parent)): n for p in _modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MODULE_LINES}
    assert long == {}


def test_no_function_is_longer_than_80_lines() -> None:
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    long[f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"] = length
    assert long == {}


def test_test_modules_outside_packages_have_unique_names() -> None:
    """pytest imports a test file of a folder without ``__init__.py`` by its bare name (rootdir-relative
    ``prepend`` import mode), so two such files of one name break the whole run's collection ("import file
    mismatch"); a folder with ``__init__.py`` qualifies its modules. Two such clashes were committed in one day."""
    tests = Path(__file__).resolve().parent
    seen: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        if not (path.parent / "__init__.py").is_file():
            seen.setdefault(path.stem, []).append(str(path.relative_to(tests)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
