"""Issue 29, item 9: the command line's help and wording. ``--version``; a top-level help that speaks of the whole
tool; help texts reflowed to the terminal (no hard line breaks from the docstrings); one placeholder style; nouns
that agree with their counts; and ``demo-data`` on an existing set says so without drawing a bar first."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from labswarm.cli.helpfmt import reflow
from labswarm.cli.main import app
from labswarm.cli.output import plural


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("COLUMNS", "400")  # wide: a line break in the help is then one of the text's own
    return CliRunner()


def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out = [(path, command)]
    for name, sub in (getattr(command, "commands", None) or {}).items():
        out += _commands(sub, (*path, name))
    return out


def test_version_prints_the_installed_version(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"labswarm {importlib.metadata.version('labswarm')}"


def test_the_top_level_help_speaks_of_the_whole_tool(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    intro = result.stdout.split("Options")[0]
    for part in ("features", "session", "training job", "compare", "predict", "Exit status"):
        assert part in intro, part


def test_no_help_text_keeps_the_docstrings_line_breaks(runner: CliRunner) -> None:
    tree = _commands(typer.main.get_command(app))
    assert len(tree) > 30
    for path, command in tree:
        for text in (command.help or "", *(getattr(p, "help", None) or "" for p in command.params)):
            for paragraph in text.split("\n\n"):
                assert "\n" not in paragraph or paragraph.startswith("\b"), (path, paragraph)
    listing = runner.invoke(app, ["--help"]).stdout
    [run_line] = [line for line in listing.splitlines() if re.match(r"^│ run\s", line)]
    assert "Exit status 1" in run_line  # the whole description on the command's line


def test_every_argument_placeholder_is_in_capitals(runner: CliRunner) -> None:
    arguments = [(path, p) for path, command in _commands(typer.main.get_command(app)) for p in command.params
                 if p.param_type_name == "argument"]
    assert arguments
    for path, param in arguments:
        assert param.metavar and param.metavar == param.metavar.upper(), (path, param.name, param.metavar)
    usage = runner.invoke(app, ["predict", "--help"]).stdout
    assert "{MODEL_OR_JOB} {AUDIO...}" in usage
    assert "{EXPERIMENT}" in runner.invoke(app, ["run", "--help"]).stdout


def test_reflow_keeps_paragraphs_lists_and_marked_blocks() -> None:
    text = """First line
    goes on.

    - a list item
    - another

    \bkept
    as written"""
    assert reflow(text) == "First line goes on.\n\n- a list item\n- another\n\n\bkept\nas written"


@pytest.mark.parametrize(("n", "expected"), [(0, "0 files"), (1, "1 file"), (2, "2 files")])
def test_plural_agrees_with_the_count(n: int, expected: str) -> None:
    assert plural(n, "file") == expected
    assert plural(1, "entry", "entries") == "1 entry" and plural(3, "entry", "entries") == "3 entries"


@pytest.mark.slow  # the shared demo set (tests/conftest.py)
def test_demo_data_on_an_existing_set_says_kept_without_a_bar(demo_set: Path) -> None:
    env = {**os.environ, "COLUMNS": "200", "TTY_COMPATIBLE": "1"}  # as on a terminal: a bar would be drawn
    result = subprocess.run([sys.executable, "-m", "labswarm.cli", "demo-data", str(demo_set), "--per-class", "3"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "already built, kept" in result.stdout
    assert "━" not in result.stdout and "clips/s" not in result.stdout  # no bar, not even an empty one
    assert "(1 sources)" not in result.stdout
