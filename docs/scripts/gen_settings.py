"""Generate the settings reference (mkdocs-gen-files): every ``LABSWARM_*`` setting, from the code, at build time.

The settings are the fields of the pydantic-settings model(s) in ``labswarm.settings``: for each, the variable
(the model's ``env_prefix`` plus the field name), its type, its default and bounds (from the field), and its
description (the model docstring's ``Attributes:`` section, Google style, parsed with griffe). A second table
lists the other ``LABSWARM_*`` variables that labswarm's code names in its strings (those the CLI or a learner
reads itself), each with the modules that name it, found by tokenizing the package's sources.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import tokenize
import typing
from pathlib import Path

import griffe
import mkdocs_gen_files
from pydantic_core import PydanticUndefined

sys.path.insert(0, str(Path(__file__).parent))
from _common import ROOT, cell, escape

MODULE = "labswarm.settings"
VARIABLE = re.compile(r"\bLABSWARM_[A-Z0-9_]*[A-Z0-9]\b")
BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))


def settings_models():
    from pydantic_settings import BaseSettings

    module = importlib.import_module(MODULE)
    return [obj for _, obj in inspect.getmembers(module, inspect.isclass)
            if issubclass(obj, BaseSettings) and obj is not BaseSettings and obj.__module__ == MODULE]


def descriptions(model) -> dict[str, str]:
    """The ``Attributes:`` section of the model's docstring: field name -> description."""
    parsed = griffe.Docstring(inspect.getdoc(model) or "").parse("google")
    out: dict[str, str] = {}
    for section in parsed:
        if section.kind is griffe.DocstringSectionKind.attributes:
            for item in section.value:
                out[item.name] = item.description
    return out


def type_name(annotation) -> str:
    text = repr(annotation) if not isinstance(annotation, type) else annotation.__name__
    if typing.get_origin(annotation) is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    text = re.sub(r"\b(typing|pathlib|collections\.abc)\.", "", text)
    return text.replace("NoneType", "None")


def default_of(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    return "`" + (str(value) if not isinstance(value, str) else repr(value)) + "`" if value is not None else "`None`"


def bounds_of(field) -> str:
    parts = []
    for meta in field.metadata:
        for attr, sign in BOUNDS:
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign} {value}")
    return ", ".join(parts)


def other_variables(known: set[str]) -> dict[str, list[str]]:
    """``LABSWARM_*`` names in the string literals of labswarm's modules that are not settings fields."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "labswarm").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        with tokenize.open(path) as f:
            for token in tokenize.generate_tokens(f.readline):
                if token.type == tokenize.STRING:
                    for name in VARIABLE.findall(token.string):
                        if name not in known:
                            found.setdefault(name, set()).add(module)
    return {name: sorted(mods) for name, mods in sorted(found.items())}


def main() -> None:
    module = importlib.import_module(MODULE)
    secret = set(getattr(module, "SECRET_FIELDS", ()))
    out = [
        "# Settings (`LABSWARM_*`)\n",
        f"Generated at build time from the settings model in `{MODULE}` (`docs/scripts/gen_settings.py`). "
        "Precedence: an explicit argument (a CLI option), then the `LABSWARM_*` environment variable, then "
        "the default below. A secret setting may instead come from the file that `LABSWARM_<NAME>_FILE` names "
        "(docker secrets; marked *secret* below). Settings are read once, at start-up.\n",
    ]
    known: set[str] = set()
    for model in settings_models():
        prefix = model.model_config.get("env_prefix", "")
        docs = descriptions(model)
        out.append(f"## `{model.__name__}`\n")
        out.append("| variable | type | default | bounds | description |\n|---|---|---|---|---|")
        for name, field in model.model_fields.items():
            variable = f"{prefix}{name}".upper()
            known.add(variable)
            if name in secret:
                known.add(f"{variable}_FILE")
            flag = " (*secret*: or `" + variable + "_FILE`)" if name in secret else ""
            out.append(f"| `{variable}`{flag} | `{type_name(field.annotation)}` | {default_of(field)} | "
                       f"{escape(bounds_of(field))} | {cell(docs.get(name) or field.description)} |")
        out.append("")
    others = other_variables(known)
    out.append("## Other variables\n")
    out.append("Named in labswarm's code but not settings fields: variables the CLI reads for its client "
               "options, and those the lifecycle hands a learner or a parameter-server shard (its place in the "
               "job, its folders). Found by scanning the package's string literals at build time; see the "
               "modules named for their meaning.\n")
    out.append("| variable | named in |\n|---|---|")
    for name, modules in others.items():
        out.append(f"| `{name}` | {', '.join(f'`{m}`' for m in modules)} |")
    with mkdocs_gen_files.open("reference/settings.md", "w") as f:
        f.write("\n".join(out) + "\n")
    mkdocs_gen_files.set_edit_path("reference/settings.md", "docs/scripts/gen_settings.py")


main()
