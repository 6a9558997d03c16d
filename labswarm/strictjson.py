"""Strict JSON (RFC 8259) out of labswarm: no ``NaN`` nor ``Infinity``, which Python's :func:`json.dumps` writes by
default and strict parsers (browsers' ``JSON.parse``, Go, Rust's serde, ``jq`` alike) reject.

A float that is not finite (a diverging loss, a rate measured over fewer than two points, an F1 score with no
class defined) becomes ``null``: the value is unknown, which is what ``NaN`` meant. Used by the event streams
(:mod:`labswarm.sse`), the learners' reports and the health controller's decision log.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every float that is not finite (NaN, +inf, -inf) replaced by ``None``, in nested dicts,
    lists and tuples (a tuple comes back as a list); other values are returned as they are."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`finite` ``(value)``, with ``allow_nan=False``: strict JSON or :class:`ValueError`
    (for a non-finite value :func:`finite` cannot reach, such as a numpy scalar)."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)
