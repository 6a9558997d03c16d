"""docker/compose*.yml: valid against the compose specification (check-jsonschema's vendored copy, offline),
and wired the way the swarm launcher and the docs expect."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from deploy_tools import DOCKER, run, tool

from labswarm.settings import Settings

COMPOSE_FILES = sorted(DOCKER.glob("compose*.yml"))
#: Top-level keys of compose file format 3, the one `docker stack deploy` reads (it rejects others, e.g. `name`).
STACK_TOP_LEVEL = {"version", "services", "networks", "volumes", "secrets", "configs"}


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_there_are_compose_files() -> None:
    assert DOCKER / "compose.yml" in COMPOSE_FILES and len(COMPOSE_FILES) >= 3


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_file_validates_against_the_compose_spec(path: Path) -> None:
    result = run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_validator_rejects_an_invalid_file(tmp_path: Path) -> None:
    broken = _load(DOCKER / "compose.yml")
    broken["services"]["manager"]["healthcheck"]["retries"] = "three"
    broken["services"]["worker"]["deploy"]["replikas"] = 2
    path = tmp_path / "compose.yml"
    path.write_text(yaml.safe_dump(broken))
    result = run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", path)
    assert result.returncode != 0 and "replikas" in result.stdout + result.stderr


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_only_keys_docker_stack_deploy_reads(path: Path) -> None:
    keys = {k for k in _load(path) if not k.startswith("x-")}
    assert keys <= STACK_TOP_LEVEL, keys - STACK_TOP_LEVEL


def test_services_network_and_volumes() -> None:
    compose = _load(DOCKER / "compose.yml")
    services = compose["services"]
    assert {"rabbitmq", "manager", "health", "worker"} <= set(services)
    image = services["rabbitmq"]["image"]
    assert image.startswith("rabbitmq:") and image.endswith("-management")
    assert "rabbitmq:/var/lib/rabbitmq" in services["rabbitmq"]["volumes"]

    network = compose["networks"]["labswarm"]
    assert network["driver"] == "overlay" and network["attachable"] is True
    for name, service in services.items():
        assert service["networks"] == ["labswarm"], name
        assert "healthcheck" in service, name
    for name in ("manager", "health", "worker"):
        assert services[name]["image"].startswith("${LABSWARM_IMAGE:-labswarm:"), name
        assert services[name]["command"][0] == name  # one image; the command picks the role

    health = services["health"]["command"]
    assert health[health.index("--manager") + 1] == "http://manager:8000"
    assert "--rabbitmq-api" not in health  # its password: in the environment, not on the command line
    assert "@rabbitmq:15672" in services["health"]["environment"]["LABSWARM_RABBITMQ_API"]
    assert services["manager"]["environment"]["LABSWARM_API_TOKEN"].startswith("${LABSWARM_API_TOKEN:?")
    assert "@rabbitmq:5672" in services["manager"]["environment"]["LABSWARM_BROKER_URL"]
    assert "/var/run/docker.sock:/var/run/docker.sock" in services["manager"]["volumes"]
    assert any(v.startswith("state:") for v in services["manager"]["volumes"])


def test_manager_settings_match_the_stack() -> None:
    """The names the manager's swarm launcher uses are those the stack creates."""
    compose = _load(DOCKER / "compose.yml")
    env = compose["services"]["manager"]["environment"]
    settings = Settings(**{k.removeprefix("LABSWARM_").lower(): v for k, v in env.items()
                           if k.startswith("LABSWARM_SWARM_")})
    assert settings.swarm_network == compose["networks"]["labswarm"]["name"]
    assert settings.swarm_data_volume == compose["volumes"]["data"]["name"]
    data_mounts = {v.split(":")[1] for s in ("manager", "worker") for v in compose["services"][s]["volumes"]
                   if v.startswith("data:")}
    assert data_mounts == {settings.swarm_data_target}
    assert settings.swarm_manager_url == "http://manager:8000"


def test_nfs_and_postgres_options() -> None:
    nfs = _load(DOCKER / "compose.nfs.yml")
    volume = nfs["volumes"]["data"]
    assert volume["name"] == _load(DOCKER / "compose.yml")["volumes"]["data"]["name"]
    assert volume["driver_opts"]["type"] == "nfs" and volume["driver_opts"]["device"].startswith(":")
    assert "LABSWARM_SWARM_DATA_NFS" in nfs["services"]["manager"]["environment"]
    postgres = _load(DOCKER / "compose.postgres.yml")
    assert postgres["services"]["manager"]["environment"]["LABSWARM_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "postgres" in postgres["services"]
