"""Print the requirements of labswarm's image, one a line, from pyproject.toml (docker/Dockerfile's first stage).

Usage: python requirements.py PYPROJECT EXTRAS, EXTRAS comma-separated (e.g. ``swarm,postgres,train``).
The lines are the build system's requires (the image installs labswarm without build isolation), the project's
dependencies and those of each extra named, in pyproject's order. The image installs them in a layer of their own,
before it copies the package: a change to labswarm's code, or to a part of pyproject.toml other than these
lists, leaves the printed text, and so that layer's cache, as it was.

Raises KeyError naming an extra pyproject.toml does not define (the build stops there).
"""

import sys
import tomllib


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    """The build requires, dependencies and the named extras' dependencies of a parsed pyproject.toml."""
    project = pyproject["project"]
    lines = list(pyproject["build-system"]["requires"]) + list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return lines


if __name__ == "__main__":
    with open(sys.argv[1], "rb") as file:
        parsed = tomllib.load(file)
    print("\n".join(requirements(parsed, [e for e in sys.argv[2].split(",") if e])))
