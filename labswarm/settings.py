"""Runtime settings of the manager, workers and CLI (pydantic-settings, environment prefix ``LABSWARM_``).

Precedence: an explicit argument (CLI option), then the ``LABSWARM_*`` environment variable, then the default
documented here. Settings are built once at start-up (:func:`load_settings`), never read at import time.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """labswarm's runtime settings.

    Attributes:
        home: folder for embedded state (SQLite database, embedded broker); ``LABSWARM_HOME``.
        database_url: SQLAlchemy URL of the manager's state; default SQLite in ``home``
            (``postgresql+psycopg://...`` for PostgreSQL).
        broker_url: Celery broker URL; default: the embedded SQLite broker in ``home``
            (``amqp://guest:guest@localhost:5672//`` for RabbitMQ).
        api_token: when set, mutating manager endpoints require ``Authorization: Bearer <token>``.
        max_attempts: deliveries of one sample (broker redeliveries and republishes) before it is recorded
            as failed: a poison sample cannot loop forever.
        default_rate: publish rate of a new session in tasks/s until someone sets another.
        report_interval: seconds a worker batches outcomes before sending them to the manager.
        max_queue_length: hard bound on the messages waiting in each experiment queue (RabbitMQ ``x-max-length``
            with reject-publish; the publisher backs off when it is reached). ``None`` or 0: unbounded.
        reconcile_after: seconds without any outcome, with the queue empty, before a session looks for samples
            that lost their message or their report (at least 4x the slowest task seen).
    """

    model_config = SettingsConfigDict(env_prefix="LABSWARM_", extra="ignore")

    home: Path = Path(".labswarm")
    database_url: str | None = None
    broker_url: str | None = None
    api_token: str | None = None
    max_attempts: int = Field(5, ge=1)
    default_rate: float = Field(200.0, gt=0)
    report_interval: float = Field(0.25, gt=0)
    reconcile_after: float = Field(10.0, gt=0)
    max_queue_length: int | None = Field(10_000, ge=0)

    def resolved_database_url(self) -> str:
        """``database_url``, or the SQLite file ``home/manager.sqlite``."""
        return self.database_url or f"sqlite:///{(self.home / 'manager.sqlite').resolve()}"

    def resolved_broker_url(self) -> str:
        """``broker_url``, or the embedded SQLite broker ``sqla+sqlite:///home/broker.sqlite``."""
        return self.broker_url or f"sqla+sqlite:///{(self.home / 'broker.sqlite').resolve()}"


def load_settings(**overrides) -> Settings:
    """Settings from the environment, with explicit non-``None`` ``overrides`` taking precedence."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
