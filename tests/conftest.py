"""Shared fixtures; the helpers they use live in ``tests/helpers.py``."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# pytest-xdist's workers start with COLUMNS=80 and LINES=24 in their environment; labswarm's rich consoles are made
# at import and would keep that width for good, while the CLI tests set COLUMNS per call (wide tables)
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

from helpers import write_dataset  # noqa: E402

#: Tests that run after the rest, alone (marked ``serial``; the README's test command runs ``pytest -n 2 -m "not
#: serial"`` with ``--dist=loadfile``, then ``pytest -m serial``): files whose assertions are rates, shares or the
#: dynamics of the health controller (on a machine whose other core is busy with another test they would measure
#: that test), and the test that restarts RabbitMQ (the other worker's RabbitMQ tests would lose their broker).
#: A file's path under tests/, or a test's ``path::name``.
SERIAL = {"queue/test_health_control.py", "queue/test_fair_share.py", "queue/test_flood.py",
          "queue/test_memory.py", "health/test_loop.py", "queue/test_no_loss.py::test_broker_restarted"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The :data:`SERIAL` tests get the ``serial`` mark. (Grouping by ``xdist_group`` is not used: pytest-xdist
    3.8's ``--dist loadgroup`` rewrites ``item._nodeid``, which pytest 9 no longer reads, so its groups are
    ignored; ``loadfile`` keeps each file on one worker.)"""
    tests = Path(__file__).parent
    for item in items:
        name = item.path.relative_to(tests).as_posix()
        if name in SERIAL or f"{name}::{item.name}" in SERIAL:
            item.add_marker(pytest.mark.serial)


@pytest.fixture(autouse=True, scope="session")
def data_roots() -> Iterator[None]:
    """Managers built by the tests accept the temporary folders their datasets and stores live in (besides the
    current directory, the default; ``LABSWARM_DATA_ROOTS``, see labswarm.paths); workers inherit it."""
    import json
    import tempfile

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LABSWARM_DATA_ROOTS", json.dumps([os.getcwd(), os.path.realpath(tempfile.gettempdir())]))
        yield


@pytest.fixture
def tone_dataset(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "data")


#: Clips per class and seed of the demo set the tests share (see :func:`demo_set`).
DEMO_PER_CLASS, DEMO_SEED = 3, 0


@pytest.fixture(scope="session")
def demo_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo set of :data:`DEMO_PER_CLASS` clips per class (seed :data:`DEMO_SEED`), built once for the whole
    run through the console script (``labswarm demo-data --jobs 2``) and shared by tests/datasets/test_demo.py
    and tests/cli/test_cli.py: a build is costly (each worker process first loads the soundfonts, ~12 s here).
    Tests only read it. Skips when Debian's packages are missing, and fails in CI (``CI=true``).
    """
    from labswarm.datasets.demo import missing_packages

    if missing := missing_packages():
        message = f"demo-set packages missing: {' '.join(missing)}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    out = tmp_path_factory.mktemp("demo")
    result = subprocess.run([sys.executable, "-m", "labswarm.cli", "demo-data", str(out), "--per-class",
                             str(DEMO_PER_CLASS), "--seed", str(DEMO_SEED), "--jobs", "2"],
                            cwd=out, env={**os.environ, "COLUMNS": "200"}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


#: The PostgreSQL server of the database contract tests (.ci/postgres starts it); env LABSWARM_TEST_POSTGRES.
POSTGRES_URL = "postgresql+psycopg://labswarm:labswarm@127.0.0.1:5432/labswarm_test"


def _postgres_admin():
    """An engine on the test server, or the reason it cannot be reached (cached for the session)."""
    from sqlalchemy import create_engine, text

    if not hasattr(_postgres_admin, "result"):
        url = os.environ.get("LABSWARM_TEST_POSTGRES", POSTGRES_URL)
        try:
            engine = create_engine(url, connect_args={"connect_timeout": 5})
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            _postgres_admin.result = (engine, None)
        except Exception as exc:  # psycopg missing, server down, bad password: all mean "no server"
            _postgres_admin.result = (None, f"no PostgreSQL at {url.split('@')[-1]}: {type(exc).__name__}: {exc}")
    return _postgres_admin.result


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A SQLAlchemy URL of an empty database: a SQLite file, or a fresh schema on the PostgreSQL test server
    (env ``LABSWARM_TEST_POSTGRES``, default :data:`POSTGRES_URL`; the schema is the URL's search path and is
    dropped afterwards). Without a server the PostgreSQL case skips, and fails when env ``CI`` is ``true``.
    """
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'manager.sqlite'}"
        return
    from sqlalchemy import text

    admin, reason = _postgres_admin()
    if admin is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: run .ci/postgres)")
        pytest.skip(reason)
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    yield admin.url.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
    with admin.begin() as conn:
        conn.execute(text("SET LOCAL lock_timeout = '20s'"))
        conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
