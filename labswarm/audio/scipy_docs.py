"""SciPy imported without rewriting its functions' docstrings, in a worker (issue 27: a worker's start).

SciPy 1.17 decorates some 650 public functions (``scipy.signal``, ``scipy.ndimage``, ``scipy.stats``, ...) with
``xp_capabilities`` (``scipy/_lib/_array_api.py``), which at import parses each function's docstring with SciPy's
copy of numpydoc (``FunctionDoc``) to append a table of the array-API backends it supports. librosa imports
``scipy.signal`` (so ``scipy.stats`` and ``scipy.ndimage`` with it), and every worker pays that parsing at its
start, before its first task: ``import scipy.signal`` 0.66-0.68 s of CPU, 0.34-0.36 s without it (3 alternating
pairs on the 2-core benchmark machine, load ~14). A worker never shows a docstring, so :func:`skip_doc_notes`
makes that decorator leave them as they are; what it records of each function (SciPy's capabilities table, used by
SciPy's own tests) is unchanged, and so is every computation.

It replaces a private name of SciPy's (``scipy._lib._array_api.FunctionDoc``): with a SciPy that has no such name
it does nothing, and the imports cost what they cost. Only for worker processes (``labswarm.queue.worker``), never
for a process whose user may read SciPy's documentation.
"""

from __future__ import annotations

import sys
from typing import Any


class _Unchanged:
    """In place of SciPy's ``FunctionDoc(func)`` inside ``xp_capabilities``: ``doc["Notes"]`` takes the note and
    drops it; ``str(doc)`` is a signature line (which the decorator strips) and then ``func``'s docstring."""

    def __init__(self, func: Any) -> None:
        self._doc = getattr(func, "__doc__", None) or ""

    def __getitem__(self, section: str) -> list[str]:
        return []

    def __str__(self) -> str:
        return "\n" + self._doc


def skip_doc_notes() -> bool:
    """Make SciPy's ``xp_capabilities`` leave docstrings as they are in this process, if it is not too late.

    Returns:
        Whether it is done: ``False`` when ``scipy.signal`` is already imported (its functions are decorated:
        nothing left to save), SciPy is missing, or its decorator has no ``FunctionDoc`` (another SciPy).
    """
    if "scipy.signal" in sys.modules:
        return False
    try:
        from scipy._lib import _array_api
    except ImportError:
        return False
    if not isinstance(getattr(_array_api, "FunctionDoc", None), type):
        return False
    _array_api.FunctionDoc = _Unchanged
    return True
