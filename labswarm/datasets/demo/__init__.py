"""An offline demo set (music / speech / noise, 10-second clips) built from Debian packages.

::

    from labswarm.datasets.demo import build_demo_set, missing_packages

    if missing_packages():          # e.g. ["openttd-opensfx"]; raise or install
        ...
    summary = build_demo_set("data/demo", per_class=100, seed=0, jobs=2)

See DESIGN.md, "Real data offline", and RUNBOOK.md for the packages.
"""

from labswarm.datasets.demo.build import DemoSummary, build_demo_set, render_clip
from labswarm.datasets.demo.dsp import CLIP_SAMPLES, CLIP_SECONDS, SAMPLE_RATE
from labswarm.datasets.demo.opensfx import OpenSfxEntry, parse_cat, read_cat
from labswarm.datasets.demo.plan import LABELS, Catalog, Recipe, plan_clips
from labswarm.datasets.demo.sources import (
    REQUIRED_PACKAGES,
    DemoSources,
    discover_sources,
    missing_packages,
    require_packages,
)

__all__ = [
    "CLIP_SAMPLES",
    "CLIP_SECONDS",
    "LABELS",
    "REQUIRED_PACKAGES",
    "SAMPLE_RATE",
    "Catalog",
    "DemoSources",
    "DemoSummary",
    "OpenSfxEntry",
    "Recipe",
    "build_demo_set",
    "discover_sources",
    "missing_packages",
    "parse_cat",
    "plan_clips",
    "read_cat",
    "render_clip",
    "require_packages",
]
