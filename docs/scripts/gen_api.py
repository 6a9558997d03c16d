"""Generate the Python API reference (mkdocs-gen-files): one page per public module of labswarm.

The modules are discovered at build time by walking the package with griffe (static analysis: nothing is
imported), so modules that move or appear need no change here. Public means: no part of the dotted name starts
with an underscore, and not in :data:`SKIP` (Alembic revisions, ``__main__`` entry points). Each page holds one
``::: module`` directive that mkdocstrings renders from the docstrings (Google style); the navigation tree is
written as ``reference/api/SUMMARY.md`` for mkdocs-literate-nav.
"""

from __future__ import annotations

import sys
from pathlib import Path

import griffe
import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).parent))
from _common import ROOT

PACKAGE = "labswarm"
OUT = Path("reference/api")
#: dotted-name prefixes left out of the reference: database migrations are not an API.
SKIP = ("labswarm.db.migrations",)


def public_modules(package: griffe.Module) -> list[griffe.Module]:
    """Every public module under ``package`` (itself included), sorted by dotted name."""
    found: list[griffe.Module] = []

    def walk(module: griffe.Module) -> None:
        path = module.path
        if any(part.startswith("_") for part in path.split(".")) or path.startswith(SKIP):
            return
        found.append(module)
        for member in module.modules.values():
            walk(member)

    walk(package)
    return sorted(found, key=lambda m: m.path)


def main() -> None:
    package = griffe.load(PACKAGE, search_paths=[str(ROOT)], docstring_parser="google", resolve_aliases=False)
    nav = mkdocs_gen_files.Nav()
    for module in public_modules(package):
        parts = tuple(module.path.split("."))
        if module.is_package:
            page = OUT.joinpath(*parts[1:], "index.md")
        else:
            page = OUT.joinpath(*parts[1:-1], f"{parts[-1]}.md")
        nav[parts] = page.relative_to(OUT).as_posix()
        with mkdocs_gen_files.open(page, "w") as f:
            f.write(f"# `{module.path}`\n\n::: {module.path}\n    options:\n      show_root_heading: false\n")
    with mkdocs_gen_files.open(OUT / "SUMMARY.md", "w") as f:
        f.writelines(nav.build_literate_nav())


main()
