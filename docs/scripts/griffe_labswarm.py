"""A griffe extension for the Python API reference: labswarm's docstring habits, rendered as Markdown.

- Sphinx roles (``:class:`~labswarm.x.Y```, ``:func:`f```, ``:mod:`m```, ...) become code spans (the short name
  where the role has ``~``), instead of showing their raw markup.
- ``#:`` comments above a module or class attribute (the project's way to document constants, STYLE.md rule
  10) become that attribute's docstring, so the constants appear in the reference with their meaning.

Loaded by mkdocstrings (``extensions`` in mkdocs.yml); nothing under labswarm/ is changed.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|attr|data|exc|obj|const|type):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


@cache
def _lines(path: str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines()


class LabswarmDocstrings(griffe.Extension):
    """Rewrite Sphinx roles into code spans; take ``#:`` comments as attribute docstrings."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = ROLE.sub(_code, obj.docstring.value)

    def on_attribute_instance(self, *, attr: griffe.Attribute, **kwargs: Any) -> None:
        if attr.docstring is not None or attr.lineno is None or not isinstance(attr.filepath, Path):
            return
        lines = _lines(str(attr.filepath))
        comment: list[str] = []
        i = attr.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#:"):
            comment.insert(0, lines[i].strip()[2:].strip())
            i -= 1
        if comment:
            text = ROLE.sub(_code, " ".join(comment))
            attr.docstring = griffe.Docstring(text, lineno=i + 2, parent=attr)
