"""The docker secrets of the swarm launcher's worker services: the API token and a broker URL with a password
travel as secrets (files under ``/run/secrets`` that ``LABSWARM_<NAME>_FILE`` names), never in a service's
``Env`` or command line, which ``docker service inspect`` shows to anyone with access to the engine."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from labswarm.redact import has_password

if TYPE_CHECKING:
    from labswarm.settings import Settings

#: Label of what the launcher created (services, secrets): what it may remove; anything else is never touched.
LABEL_MANAGED = "labswarm.managed"


@dataclass(frozen=True)
class SecretSpec:
    """A docker secret the worker containers read as the file ``/run/secrets/<target>``; their environment names
    it in ``<variable>_FILE``. The value is not part of the spec (:func:`secret_values` holds it).

    Attributes:
        name: the swarm secret's name (:func:`secret_name`).
        target: the file name under ``/run/secrets``.
        variable: the setting it holds, e.g. ``LABSWARM_API_TOKEN``.
    """

    name: str
    target: str
    variable: str


def secret_name(kind: str, value: str) -> str:
    """The name of the docker secret holding ``value``: ``labswarm-<kind>-<12 hex digits of a keyed hash>``, so
    a restarted manager with the same settings finds it, and a changed value gets a new secret (secrets are
    immutable). Whoever can read the name can read the secret itself (both need the Docker engine)."""
    digest = hashlib.blake2b(value.encode(), digest_size=6, person=b"labswarm-secret").hexdigest()
    return f"labswarm-{kind}-{digest}"


def worker_secrets(settings: Settings) -> list[tuple[SecretSpec, str]]:
    """The secrets of the worker containers with their values: the API token, and the broker URL when it
    carries a password (``swarm_broker_url``, else the manager's own ``broker_url``)."""
    found: list[tuple[SecretSpec, str]] = []
    if settings.api_token:
        found.append((SecretSpec(secret_name("api-token", settings.api_token), "labswarm_api_token",
                                 "LABSWARM_API_TOKEN"), settings.api_token))
    broker = settings.swarm_broker_url or settings.broker_url
    if broker is not None and has_password(broker):
        found.append((SecretSpec(secret_name("broker-url", broker), "labswarm_broker_url", "LABSWARM_BROKER_URL"),
                      broker))
    return found


def secret_values(settings: Settings) -> dict[str, str]:
    """Secret name -> value, for :class:`SwarmLauncher` to create the secrets its service's spec references."""
    return {spec.name: value for spec, value in worker_secrets(settings)}
