"""Generate the plugin registries' reference (mkdocs-gen-files) from ``labswarm.registry``, at build time.

Every :class:`~labswarm.registry.Registry` instance of that module is one row: the kind of plugin, the module of
its built-ins, the entry-point group installed packages add to, the base class its docstring comment names, and
the names registered once the built-ins are loaded (each with its class and config model). A built-in that
cannot be imported here (an optional dependency missing) is reported in its row instead of failing the build.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).parent))
from _common import ROOT, cell

MODULE = "labswarm.registry"


def registries() -> list[tuple[str, object, str]]:
    """``(constant name, registry, comment)`` for each registry of :data:`MODULE`, in source order."""
    module = importlib.import_module(MODULE)
    source = (ROOT / Path(*MODULE.split("."))).with_suffix(".py").read_text(encoding="utf-8")
    comments = dict((m[1], m[0]) for m in re.findall(r"#: (.+)\n(\w+): Registry", source))
    out = []
    for name, value in vars(module).items():
        if isinstance(value, module.Registry):
            out.append((name, value, comments.get(name, "")))
    return out


def main() -> None:
    out = [
        "# Plugin registries\n",
        f"Generated at build time from `{MODULE}` (`docs/scripts/gen_plugins.py`): every kind of pluggable "
        "part, where its built-ins live, the entry-point group an installed package adds to, and the names "
        "registered here. How to write one: [Writing a plugin](../guides/plugins.md).\n",
        "| registry | kind | built-ins | entry-point group | what |\n|---|---|---|---|---|",
    ]
    details = []
    for const, registry, comment in registries():
        builtins = getattr(registry, "builtins", None)
        group = getattr(registry, "group", None)
        out.append(f"| `{const}` | {cell(registry.kind)} | {f'`{builtins}`' if builtins else ''} | "
                   f"{f'`{group}`' if group else ''} | {cell(comment)} |")
        details.append(f"## {registry.kind} (`{const}`)\n")
        try:
            names = registry.names()
        except Exception as exc:
            details.append(f"The built-ins could not be imported here: `{type(exc).__name__}: {exc}`.\n")
            continue
        details.append("| name | class | config model |\n|---|---|---|")
        for name in names:
            cls = registry.get(name)
            config = getattr(cls, "config_model", None)
            config_name = f"`{config.__module__}.{config.__qualname__}`" if isinstance(config, type) else ""
            details.append(f"| `{name}` | `{cls.__module__}.{cls.__qualname__}` | {config_name} |")
        details.append("")
    with mkdocs_gen_files.open("reference/plugins.md", "w") as f:
        f.write("\n".join([*out, "", *details]) + "\n")
    mkdocs_gen_files.set_edit_path("reference/plugins.md", "docs/scripts/gen_plugins.py")


main()
