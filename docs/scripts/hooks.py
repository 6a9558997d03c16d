"""MkDocs hooks: the hand-written pages and the README must name only code and files that exist.

The guides name modules (``labswarm.jobs.states``), files (``labswarm/ui/seen.py``, ``tests/...``, ``bench/...``)
and the README links into ``docs/``. Modules move; a page that names one that is gone would mislead quietly.
So every such name in a hand-written page (everything but the generated ``reference/`` pages) is checked
against the working tree at build time, and every relative link of README.md must resolve: each miss is a
warning, which ``mkdocs build --strict`` turns into a failure naming the page and the name. Set
``extra.check_code_references: false`` in mkdocs.yml to turn the check off.

Docstrings: griffe's warnings about a malformed docstring under labswarm/ (a Google section it cannot parse)
are shown at INFO level and summed up at the end of the build, not counted as warnings: the docstrings are the
code owners' to fix, and one of them should not stop the site. ``extra.strict_docstrings: true`` in mkdocs.yml
makes them warnings again (and so failures under ``--strict``).
"""

from __future__ import annotations

import logging
import re
from functools import cache
from pathlib import Path

import griffe

log = logging.getLogger("mkdocs.hooks.code_references")
ROOT = Path(__file__).resolve().parents[2]
#: a file or folder of the repository named in prose or code (``labswarm/jobs/states.py``, ``tests/ui/``).
PATH = re.compile(r"(?<![\w/.<>-])((?:labswarm|tests|bench|docker|examples|\.ci)/[\w.*/-]*[\w*/])")
#: a dotted Python name under labswarm (``labswarm.store``, ``labswarm.deploy.swarm.WORKERS_TTL``).
DOTTED = re.compile(r"(?<![\w/.<-])(labswarm(?:\.[A-Za-z_]\w*)+)")
#: names that are not code: files the tools create (ignored by git), the CI's own files.
IGNORE = ("docker/secrets", "bench/results")
LINK = re.compile(r"\]\(([^)\s]+)\)")
_docstring_problems: list[str] = []
#: a griffe warning about a file under labswarm/ (a relative path, or absolute when built from elsewhere).
_PROBLEM = re.compile(rf"(griffe: )?({re.escape(str(ROOT))}/)?labswarm/")


class _DocstringWarnings(logging.Filter):
    """Demote griffe's warnings about labswarm's docstrings to INFO, and remember them."""

    strict = False

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not self.strict and record.levelno == logging.WARNING and _PROBLEM.match(message):
            _docstring_problems.append(message)
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


_filter = _DocstringWarnings()
logging.getLogger("mkdocs.plugins.griffe").addFilter(_filter)


def on_config(config):
    _filter.strict = bool(config.extra.get("strict_docstrings", False))
    _docstring_problems.clear()
    return config


@cache
def package() -> griffe.Module:
    return griffe.load("labswarm", search_paths=[str(ROOT)], resolve_aliases=False)


@cache
def code_strings() -> frozenset[str]:
    """Dotted ``labswarm.*`` names that the code itself uses as strings: labels, task names, entry-point groups."""
    names: set[str] = set()
    for path in (ROOT / "labswarm").rglob("*.py"):
        names.update(re.findall(r"[\"'](labswarm(?:\.[a-z_]+)+)[\"'=]", path.read_text(encoding="utf-8")))
    return frozenset(names)


def path_exists(name: str) -> bool:
    name = name.rstrip("/")
    if name.startswith(IGNORE):
        return True
    if "*" in name:
        return any(ROOT.glob(name))
    return (ROOT / name).exists()


def dotted_exists(name: str) -> bool:
    if name in code_strings():
        return True
    parts = name.split(".")[1:]
    obj: griffe.Object | griffe.Alias = package()
    for part in parts:
        try:
            obj = obj.members[part] if not obj.is_alias else obj.target.members[part]
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            return _module_file(parts)
    return True


def _module_file(parts: list[str]) -> bool:
    """A module griffe did not list (e.g. ``__main__``): the file itself."""
    base = ROOT / "labswarm" / Path(*parts)
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()



def on_page_markdown(markdown: str, page, config, files) -> str:
    if not config.extra.get("check_code_references", True) or page.file.src_uri.startswith("reference/"):
        return markdown
    text = re.sub(r"\]\([^)]*\)", "]()", markdown)  # link targets are checked by MkDocs itself
    for name in sorted(set(PATH.findall(text))):
        if not path_exists(name):
            log.warning("%s names %s, which does not exist", page.file.src_uri, name)
    for name in sorted(set(DOTTED.findall(text))):
        if not dotted_exists(name.rstrip(".")):
            log.warning("%s names %s, which is not in the package", page.file.src_uri, name)
    return markdown


def on_post_build(config) -> None:
    if _docstring_problems:
        log.info("%d docstring problem(s) under labswarm/ (not failing the build; extra.strict_docstrings: "
                 "true makes them fail):\n  %s", len(_docstring_problems), "\n  ".join(_docstring_problems))
    if not config.extra.get("check_code_references", True):
        return
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for target in LINK.findall(readme):
        if "://" in target or target.startswith("#"):
            continue
        file = target.split("#", 1)[0]
        if not (ROOT / file).exists():
            log.warning("README.md links to %s, which does not exist", target)
    for name in sorted(set(PATH.findall(readme))):
        if not path_exists(name):
            log.warning("README.md names %s, which does not exist", name)
    for name in sorted(set(DOTTED.findall(readme))):
        if not dotted_exists(name.rstrip(".")):
            log.warning("README.md names %s, which is not in the package", name)
