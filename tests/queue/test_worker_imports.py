"""What a worker's interpreter imports before its first task (issue 27: the CPU of a worker's start, which comes
before a short run's first task). A worker over RabbitMQ imports no SQLAlchemy: only the embedded broker's
transport (and the SQLite file it prepares) needs it; its warm-up imports no scikit-learn and skips SciPy's docstring
notes. Run in fresh interpreters: this test process has imported everything already."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import experiment_dict, write_dataset

from labswarm.config.experiment import parse_experiment

SCRIPT = """
import json, sys
import labswarm.cli.main, labswarm.queue.worker
from labswarm.queue.app import make_celery
make_celery("amqp://guest:guest@127.0.0.1:5672//", role="worker", experiment="x")
seen = {"rabbitmq": sorted(m for m in ("sqlalchemy", "labswarm.queue.embedded", "labswarm.db") if m in sys.modules)}
app = make_celery("sqla+sqlite:///" + sys.argv[1], role="worker", experiment="x")
from labswarm.queue import app as app_module, embedded
seen["embedded"] = sorted(m for m in ("sqlalchemy", "labswarm.queue.embedded") if m in sys.modules)
seen["interval"] = [app_module.EMBEDDED_POLLING_INTERVAL, embedded.POLL_FAST]
print(json.dumps(seen))
"""


def test_a_worker_over_rabbitmq_imports_no_sqlalchemy(tmp_path: Path) -> None:
    broker = tmp_path / "broker.sqlite"
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(broker)], capture_output=True, text=True, timeout=300,
                         check=True).stdout
    seen = json.loads(out.splitlines()[-1])
    assert seen["rabbitmq"] == []
    # the embedded broker still gets its transport and its file, in WAL mode
    assert seen["embedded"] == ["labswarm.queue.embedded", "sqlalchemy"]
    assert broker.read_bytes()[18:20] == b"\x02\x02"  # SQLite's header: WAL read and write versions
    assert seen["interval"][0] == seen["interval"][1]


WARM = """
import json, sys
from labswarm.cli.standby import _warm
_warm(json.loads(sys.argv[1]))
import scipy.signal
print(json.dumps({"modules": sorted(m for m in ("sqlalchemy", "sklearn", "librosa.effects") if m in sys.modules),
                  "librosa": "librosa.core.spectrum" in sys.modules,
                  "note": "Array API Standard Support" in scipy.signal.sosfilt.__doc__}))
"""


def test_a_standby_workers_warm_up_skips_what_no_task_uses(tmp_path: Path) -> None:
    """The standby's imports and warm-up (``labswarm worker``'s too: run_worker calls the same warm_up) of an
    experiment with a pitch shift: the audio libraries imported, SciPy's docstring notes skipped
    (labswarm.audio.scipy_docs), no scikit-learn (labswarm.audio.transforms.vocoder), no SQLAlchemy."""
    config = experiment_dict(write_dataset(tmp_path / "data", n_per_label=1), tmp_path / "store",
                             transformations=[{"name": "identity"}, {"name": "pitch_shift", "semitones": 2}])
    out = subprocess.run([sys.executable, "-c", WARM, json.dumps(parse_experiment(config).model_dump(mode="json"))],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert json.loads(out.splitlines()[-1]) == {"modules": [], "librosa": True, "note": False}


def test_the_log_level_is_read_as_celerys_command_line_reads_it() -> None:
    """run_worker starts Celery's worker without Celery's command line (whose import came before a standby
    worker's first task): the level it gave --loglevel is checked here, before anything starts."""
    from labswarm.errors import ConfigError
    from labswarm.queue.worker import _log_level

    assert (_log_level("WARNING"), _log_level("info"), _log_level("Debug")) == (30, 20, 10)
    with pytest.raises(ConfigError, match="loglevel"):
        _log_level("verbose")
