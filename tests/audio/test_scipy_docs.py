"""A worker imports SciPy without its docstring rewriting (labswarm.audio.scipy_docs; issue 27, a worker's start):
each check in a fresh interpreter, since this test process has imported scipy.signal already."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, sys
from labswarm.audio.scipy_docs import skip_doc_notes
skipped = skip_doc_notes() if sys.argv[1] == "skip" else None
import numpy as np
import scipy.signal
from scipy._lib._array_api import xp_capabilities_table
sos = scipy.signal.butter(2, 0.1, output="sos")
print(json.dumps({"skipped": skipped, "again": skip_doc_notes(), "doc": scipy.signal.sosfilt.__doc__,
                  "recorded": scipy.signal.sosfilt in xp_capabilities_table,
                  "out": scipy.signal.sosfilt(sos, np.arange(8.0)).tolist()}))
"""


def _run(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=300,
                         check=True).stdout
    return json.loads(out.splitlines()[-1])


def test_scipy_signal_keeps_its_docstrings_and_computes_the_same() -> None:
    skipped, stock = _run("skip"), _run("stock")
    assert stock["skipped"] is None and "Array API Standard Support" in stock["doc"]  # what SciPy 1.17 does
    assert skipped["skipped"] is True and "Array API Standard Support" not in skipped["doc"]
    assert skipped["doc"].startswith("Filter data along one dimension using cascaded second-order sections")
    assert skipped["recorded"] and stock["recorded"]  # SciPy's capabilities table as before
    assert skipped["out"] == stock["out"]
    assert skipped["again"] is False and stock["again"] is False  # scipy.signal imported: too late, nothing done
