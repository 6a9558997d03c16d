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
    assert "--rabbitmq-api" not in health  # its password: in a secret file, not on the command line
    assert health[health.index("--metrics-host") + 1] == "0.0.0.0"  # guarded by the scrape token:
    assert "LABSWARM_METRICS_TOKEN_FILE" in services["health"]["environment"]
    assert services["health"]["environment"]["LABSWARM_RABBITMQ_API_FILE"] == "/run/secrets/labswarm_rabbitmq_api"
    assert compose["secrets"]["labswarm_api_token"]["file"].startswith("${LABSWARM_API_TOKEN_FILE:?")  # required
    assert services["manager"]["environment"]["LABSWARM_BROKER_URL_FILE"] == "/run/secrets/labswarm_broker_url"
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
    assert postgres["services"]["manager"]["environment"]["LABSWARM_DATABASE_URL_FILE"] == (
        "/run/secrets/labswarm_database_url")
    assert postgres["services"]["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres_password"
    # the override's list of the manager's secrets replaces the base one: it keeps the base's
    base = set(_load(DOCKER / "compose.yml")["services"]["manager"]["secrets"])
    assert base < set(postgres["services"]["manager"]["secrets"])


#: Names of environment variables that hold a secret unless they name a file (``..._FILE``).
SECRET_WORDS = ("PASS", "PASSWORD", "TOKEN", "SECRET", "BROKER_URL", "DATABASE_URL", "RABBITMQ_API", "KEY")


def _stacks() -> list[tuple[str, dict]]:
    """Each deployment the docs describe, as one merged mapping: the base file, and the base with each option."""
    base = _load(DOCKER / "compose.yml")
    stacks = [("compose.yml", base)]
    for option in ("compose.postgres.yml", "compose.nfs.yml"):
        merged = yaml.safe_load(yaml.safe_dump(base))
        for key, value in _load(DOCKER / option).items():
            if key == "services":
                for name, service in value.items():
                    target = merged["services"].setdefault(name, {})
                    for field, setting in service.items():
                        if isinstance(setting, dict) and isinstance(target.get(field), dict):
                            target[field] = {**target[field], **setting}
                        else:
                            target[field] = setting  # a list replaces the base's: not relied on
            else:
                merged.setdefault(key, {}).update(value or {})
        stacks.append((option, merged))
    return stacks


@pytest.mark.parametrize("stack", _stacks(), ids=lambda s: s[0])
def test_no_service_environment_holds_a_secret(stack: tuple[str, dict]) -> None:
    """Passwords and tokens reach the containers as docker secrets: no environment value carries one (a URL with
    a password, a ${...PASSWORD} interpolation), and a variable named for a secret names a file instead."""
    from labswarm.redact import has_password

    for name, service in stack[1]["services"].items():
        for variable, value in (service.get("environment") or {}).items():
            text = str(value)
            assert not has_password(text) and "@" not in text, (name, variable)
            assert not any(word in text.upper() for word in ("${RABBITMQ_PASSWORD", "${POSTGRES_PASSWORD",
                                                             "${LABSWARM_API_TOKEN}")), (name, variable)
            if any(word in variable.upper() for word in SECRET_WORDS) and variable != "POSTGRES_USER":
                assert variable.endswith("_FILE") and text.startswith("/run/secrets/"), (name, variable, text)
        assert "password" not in " ".join(map(str, service.get("command") or [])).lower(), name


@pytest.mark.parametrize("stack", _stacks(), ids=lambda s: s[0])
def test_every_secret_is_declared_mounted_where_named_and_used(stack: tuple[str, dict]) -> None:
    compose = stack[1]
    declared = compose.get("secrets") or {}
    assert declared, "no secrets"
    used = set()
    for name, service in compose["services"].items():
        mounted = {}
        for entry in service.get("secrets") or []:
            source = entry if isinstance(entry, str) else entry["source"]
            target = source if isinstance(entry, str) else entry.get("target", source)
            assert source in declared, (name, source)  # docker refuses an undeclared secret
            mounted[target if target.startswith("/") else f"/run/secrets/{target}"] = source
            used.add(source)
        for variable, value in (service.get("environment") or {}).items():
            if variable.endswith("_FILE"):
                assert value in mounted, (name, variable, value)  # the file it names is mounted in that service
    assert used == set(declared), set(declared) - used
    for secret in declared.values():
        assert set(secret) == {"file"}, secret  # a file: `docker stack deploy` and `docker compose` both read it


def test_rabbitmq_management_is_not_published_beyond_the_host() -> None:
    for _name, compose in _stacks():
        for name, service in compose["services"].items():
            for port in service.get("ports") or []:
                text = str(port)
                if "15672" in text or name == "rabbitmq":
                    assert text.startswith("127.0.0.1:"), (name, text)
        conf = [s for s in compose["services"]["rabbitmq"]["secrets"] if isinstance(s, dict)]
        assert conf and conf[0]["target"].startswith("/etc/rabbitmq/conf.d/"), conf


def test_make_secrets_writes_one_consistent_set_and_never_overwrites_it(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """docker/make-secrets.sh: every file a compose file names, one broker and one PostgreSQL password each used
    consistently, a folder only its owner can enter; the settings read them as LABSWARM_<NAME>_FILE."""
    import re
    import stat

    folder = tmp_path / "secrets"
    result = run("bash", DOCKER / "make-secrets.sh", folder)
    assert result.returncode == 0, result.stdout + result.stderr
    names = {Path(s["file"]).name for _n, compose in _stacks() for s in compose["secrets"].values()
             if s["file"].startswith("${LABSWARM_SECRETS:-./secrets}/")} | {"api_token"}  # (its own variable)
    assert len(names) == 7 and names == {p.name for p in folder.iterdir()}, names
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    text = {p.name: p.read_text() for p in folder.iterdir()}
    broker = re.fullmatch(r"amqp://labswarm:([0-9a-f]{48})@rabbitmq:5672//", text["broker_url"])[1]
    assert text["rabbitmq_api"] == f"http://labswarm:{broker}@rabbitmq:15672"
    assert f"default_user = labswarm\ndefault_pass = {broker}\n" == text["rabbitmq.conf"]
    assert text["database_url"].endswith(f":{text['postgres_password']}@postgres:5432/labswarm")
    assert len(text["api_token"]) == 64 and text["api_token"] != text["metrics_token"]
    for variable, name in (("LABSWARM_API_TOKEN", "api_token"), ("LABSWARM_BROKER_URL", "broker_url"),
                           ("LABSWARM_DATABASE_URL", "database_url")):
        monkeypatch.delenv(variable, raising=False)
        monkeypatch.setenv(f"{variable}_FILE", str(folder / name))
    settings = Settings()
    assert settings.api_token == text["api_token"] and settings.broker_url == text["broker_url"]
    assert settings.database_url == text["database_url"]
    again = run("bash", DOCKER / "make-secrets.sh", folder)
    assert again.returncode != 0 and "exists" in again.stderr
    assert {p.name: p.read_text() for p in folder.iterdir()} == text

