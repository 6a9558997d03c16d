"""The worked model plugin of examples/labswarm-example-net, installed into this interpreter's environment for the
tests that train it (``pip install -e``, once: ~3 s; a no-op where it is installed, as after .ci/setup)."""

from __future__ import annotations

import fcntl
import importlib
import site
import subprocess
import sys
import sysconfig
import tempfile
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from labswarm.registry import MODELS

#: The example package's folder.
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "labswarm-example-net"
#: Its model's name.
MODEL = "conv_gru"


def ensure_example_net() -> None:
    """Install the example package editable (under a lock: xdist workers may race), make this process see it
    (its ``.pth``, the entry points), and have :data:`labswarm.registry.MODELS` load again."""
    with open(Path(tempfile.gettempdir()) / "labswarm-example-net.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            distribution("labswarm-example-net")
        except PackageNotFoundError:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                            "-e", str(EXAMPLE)], check=True, capture_output=True)
    site.addsitedir(sysconfig.get_paths()["purelib"])  # the editable install's .pth, in this running process
    importlib.invalidate_caches()
    if MODEL not in MODELS.names():
        MODELS.refresh()
