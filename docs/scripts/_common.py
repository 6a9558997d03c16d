"""Helpers shared by the reference generators (docs/scripts/gen_*.py): Markdown escaping, the repository root."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the generators import labswarm from the working tree, like mkdocstrings reads it
    sys.path.insert(0, str(ROOT))

_CODE = re.compile(r"(``?[^`]+``?)")
_SPECIAL = re.compile(r"([\\*_<>|\[\]])")


def escape(text: str) -> str:
    """``text`` as inline Markdown: code spans kept (RST double backticks made single), everything else literal."""
    out = []
    for i, part in enumerate(_CODE.split(text)):
        if i % 2:
            inner = part.strip("`")
            out.append(f"`{inner}`".replace("|", "\\|"))
        else:
            out.append(_SPECIAL.sub(r"\\\1", part).replace("&", "&amp;"))
    return "".join(out)


def cell(text: str | None) -> str:
    """``text`` for one cell of a Markdown table: escaped, on one line."""
    return escape(" ".join((text or "").split()))


def paragraphs(text: str | None) -> str:
    """A help or docstring text as escaped Markdown paragraphs (blank lines kept, lines of a paragraph joined)."""
    blocks = [" ".join(b.split()) for b in re.split(r"\n\s*\n", text or "") if b.strip() and b.strip() != "\b"]
    return "\n\n".join(escape(b.replace("\b", "").strip()) for b in blocks)
