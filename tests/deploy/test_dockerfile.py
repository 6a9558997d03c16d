"""docker/Dockerfile: hadolint-clean, non-root, a health check, and the same Debian install step as CI."""

from __future__ import annotations

import re
from pathlib import Path

from deploy_tools import DOCKER, ROOT, run, tool

DOCKERFILE = DOCKER / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
            for line in (raw.strip() for raw in text.splitlines()) if line and not line.startswith("#")]


def test_hadolint_passes() -> None:
    result = run(tool("hadolint"), DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_fail_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\n")
    result = run(tool("hadolint"), bad)
    assert result.returncode != 0 and "DL3007" in result.stdout


def test_slim_python_base_non_root_healthcheck_entrypoint() -> None:
    instructions = _instructions()
    # the requirements stage (docker/requirements.py) and the image: both on the slim Python base
    bases = [arg.split()[0] for op, arg in instructions if op == "FROM"]
    assert len(bases) == 2 and ("FROM", f"{bases[0]} AS requirements") in instructions, bases
    for base in bases:
        assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", base), base
    users = [arg for op, arg in instructions if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    (health,) = [arg for op, arg in instructions if op == "HEALTHCHECK"]
    assert "labswarm.deploy.healthcheck" in health
    assert ("ENTRYPOINT", '["labswarm"]') in instructions


def test_one_install_script_for_ci_and_image() -> None:
    dockerfile = DOCKERFILE.read_text()
    setup = (ROOT / ".ci" / "setup").read_text()
    assert re.search(r"apt-install runtime\b", dockerfile)
    assert re.search(r"apt-install runtime demo test\b", setup)
    assert "apt-get install" not in dockerfile and "apt-get install" not in setup
    # what the image copies is in the build context (.dockerignore keeps only that)
    ignore = (ROOT / ".dockerignore").read_text().split()
    for op, arg in _instructions():
        if op == "COPY" and not arg.startswith("--from="):  # --from: a file of an earlier stage
            for source in arg.split()[:-1]:
                assert (ROOT / source).exists(), source
                assert f"!{source}" in ignore or f"!{source}/" in ignore, source


def test_apt_groups() -> None:
    def group(*names: str) -> list[str]:
        result = run("bash", ROOT / ".ci" / "apt-install", "--list", *names)
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    runtime, demo, test = group("runtime"), group("demo"), group("test")
    assert "libsndfile1" in runtime
    assert "rabbitmq-server" in test and "rabbitmq-server" not in runtime
    assert "espeak-ng" in demo and not set(demo) & set(runtime)
    assert group("runtime", "demo", "test") == runtime + demo + test
    unknown = run("bash", ROOT / ".ci" / "apt-install", "--list", "nosuchgroup")
    assert unknown.returncode == 2 and "no group [nosuchgroup]" in unknown.stderr
