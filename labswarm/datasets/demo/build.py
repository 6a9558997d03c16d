"""Build the offline demo set: plan in the parent, render in a process pool, write wavs and ``labels.csv``."""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from labswarm.datasets.demo import dsp, music, noise, speech
from labswarm.datasets.demo.plan import LABELS, Catalog, Recipe, plan_clips
from labswarm.datasets.demo.sources import discover_sources
from labswarm.errors import DatasetError

#: Renderer name -> function(params, generator) -> float32 clip of ``CLIP_SAMPLES`` at ``SAMPLE_RATE``.
RENDERERS: dict[str, Callable[[dict[str, Any], np.random.Generator], np.ndarray]] = {
    **speech.RENDERERS,
    **music.RENDERERS,
    **noise.RENDERERS,
}

_thread_limits: Any = None  # kept alive in each worker so the BLAS/OpenMP limit holds

#: Bumped whenever the builder's output for a seed changes; a set built by another version is rebuilt.
BUILDER_VERSION = 1
#: Written last into the output folder: what was built, so an identical request reuses the set.
MANIFEST = "demo.json"


@dataclass(frozen=True)
class DemoSummary:
    """What :func:`build_demo_set` wrote.

    Attributes:
        out_dir: the output folder (``<label>/<clip_id>.wav`` and ``labels.csv``).
        counts: label -> number of clips.
        n_sources: label -> number of distinct source recordings, voices, MIDI files or pools.
        seconds: wall-clock time of the build, seconds.
        reused: the folder already held this exact set (same builder version, per_class and seed): nothing
            was rewritten, so file identities, and the feature-store keys derived from them, are unchanged.
    """

    out_dir: Path
    counts: dict[str, int]
    n_sources: dict[str, int]
    seconds: float
    reused: bool = False


def build_demo_set(
    out_dir: str | Path,
    per_class: int = 100,
    seed: int = 0,
    jobs: int = 2,
    progress: Callable[[int, int], None] | None = None,
    force: bool = False,
) -> DemoSummary:
    """Build a music / speech / noise set of 10-second clips from Debian packages, offline.

    Writes ``out_dir/<label>/<clip_id>.wav`` (mono, 22050 Hz, PCM_16, exactly 10.0 s, peak -12..-1 dBFS) and
    ``out_dir/labels.csv`` (``path,label,source``, sorted by path; ``path`` relative to ``out_dir``). Clips
    with the same ``source`` come from the same recording, voice, MIDI file or pool of short effects: split
    by source to keep train and test apart. The same seed gives byte-identical files whatever ``jobs`` is;
    clips of an earlier build that this plan does not contain are removed. Workers are started with
    ``spawn`` (safe beside threads): a script that calls this needs the ``if __name__ == "__main__":`` guard.

    Args:
        out_dir: output folder, created if needed.
        per_class: clips per label (``music``, ``speech``, ``noise``).
        seed: seeds the plan; every clip's recipe carries its own seed drawn from it.
        jobs: worker processes; 1 renders in this process.
        progress: called as ``progress(done, total)`` after each clip.
        force: rebuild even when the folder already holds this exact set (see :attr:`DemoSummary.reused`).

    Returns:
        Counts per label and the build time.

    Raises:
        ValueError: ``per_class`` or ``jobs`` is below 1.
        DatasetError: Debian packages are missing (the message gives the ``apt-get`` command), or a clip
            cannot be rendered.
    """
    if per_class < 1 or jobs < 1:
        raise ValueError(f"per_class and jobs must be >= 1, got per_class={per_class}, jobs={jobs}")
    started = time.perf_counter()
    out = Path(out_dir)
    manifest = {"builder": BUILDER_VERSION, "per_class": per_class, "seed": seed}
    if not force and (existing := _reuse(out, manifest)) is not None:
        return existing
    (out / MANIFEST).unlink(missing_ok=True)
    catalog = Catalog.from_sources(discover_sources())
    recipes = plan_clips(catalog, per_class, seed)
    _prepare(out, recipes)
    _render_all(recipes, out, jobs, [str(p) for p in catalog.sources.soundfonts], progress)
    _write_labels(out / "labels.csv", recipes)
    (out / MANIFEST).write_text(json.dumps(manifest) + "\n")
    return DemoSummary(
        out_dir=out,
        counts={label: sum(r.label == label for r in recipes) for label in LABELS},
        n_sources={label: len({r.source for r in recipes if r.label == label}) for label in LABELS},
        seconds=time.perf_counter() - started,
    )


def _render_all(
    recipes: Sequence[Recipe],
    out: Path,
    jobs: int,
    soundfonts: list[str],
    progress: Callable[[int, int], None] | None,
) -> None:
    """Write every clip, in this process (``jobs == 1``) or in a pool; the first error stops the build."""
    total = len(recipes)
    if jobs == 1:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1):  # restored on exit: this is the caller's process
            music.preload_soundfonts(soundfonts)
            try:
                for done, recipe in enumerate(recipes, 1):
                    write_clip(recipe, out)
                    if progress is not None:
                        progress(done, total)
            finally:
                music.release_soundfonts()
        return
    ctx = multiprocessing.get_context("spawn")
    done = 0
    with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker, initargs=(soundfonts,)) as pool:
        pending: set[Future[str]] = {pool.submit(write_clip, r, out) for r in recipes}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                error = future.exception()
                if error is not None:
                    pool.shutdown(wait=True, cancel_futures=True)
                    if isinstance(error, BrokenProcessPool):
                        raise DatasetError(f"a demo-set worker process died: {error}") from error
                    raise error
                done += 1
                if progress is not None:
                    progress(done, total)


def render_clip(recipe: Recipe) -> np.ndarray:
    """Render one clip: content, then room, background bed, band limit and level, all from the recipe seed.

    Returns:
        int16 array ``(CLIP_SAMPLES,)`` at ``SAMPLE_RATE`` Hz.

    Raises:
        DatasetError: the kind is unknown or the clip cannot be rendered.
    """
    try:
        renderer = RENDERERS[recipe.kind]
    except KeyError:
        raise DatasetError(f"{recipe.clip_id}: unknown kind {recipe.kind!r}; known: {sorted(RENDERERS)}") from None
    rng = np.random.default_rng(recipe.seed)
    try:
        x = renderer(recipe.params, rng)
        if x.shape != (dsp.CLIP_SAMPLES,):
            raise DatasetError(f"renderer returned shape {x.shape}, not ({dsp.CLIP_SAMPLES},)")
        if recipe.rt60 is not None:
            x = dsp.reverb(x, recipe.rt60, rng)
        if recipe.bed == "hum":
            x = dsp.mix(x, dsp.hum(x.size, float(rng.choice([50.0, 60.0])), rng), recipe.bed_snr_db)
        elif recipe.bed == "noise":
            x = dsp.mix(x, dsp.coloured_noise(x.size, float(rng.uniform(0.0, 2.0)), rng), recipe.bed_snr_db)
        return dsp.to_pcm16(dsp.band_limit(x, recipe.band_hz), recipe.peak_dbfs)
    except (DatasetError, ValueError, RuntimeError, OSError) as exc:
        raise DatasetError(f"{recipe.clip_id} ({recipe.kind}, {recipe.source}): {exc}") from exc


def write_clip(recipe: Recipe, out_dir: Path) -> str:
    """Render ``recipe`` and write it atomically to ``out_dir / recipe.path``; returns that relative path.

    Raises:
        DatasetError: the clip cannot be rendered or written.
    """
    pcm = render_clip(recipe)
    path = out_dir / recipe.path
    part = path.with_name(path.name + ".part")
    try:
        soundfile.write(str(part), pcm, dsp.SAMPLE_RATE, subtype="PCM_16", format="WAV")
        os.replace(part, path)
    except (soundfile.LibsndfileError, RuntimeError, OSError) as exc:
        raise DatasetError(f"cannot write {path}: {exc}") from exc
    return recipe.path


def _init_worker(soundfonts: Sequence[str]) -> None:
    """Per worker process, for its lifetime: one BLAS/OpenMP thread, soundfonts loaded once."""
    global _thread_limits
    from threadpoolctl import threadpool_limits

    _thread_limits = threadpool_limits(1)
    music.preload_soundfonts(soundfonts)


def _reuse(out: Path, manifest: dict[str, int]) -> DemoSummary | None:
    """The summary of the set already in ``out`` if it was built with ``manifest`` and is complete, else None."""
    try:
        if json.loads((out / MANIFEST).read_text()) != manifest:
            return None
        with (out / "labels.csv").open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, ValueError):
        return None
    if len(rows) != manifest["per_class"] * len(LABELS) or not all((out / r["path"]).is_file() for r in rows):
        return None
    return DemoSummary(
        out_dir=out,
        counts={label: sum(r["label"] == label for r in rows) for label in LABELS},
        n_sources={label: len({r["source"] for r in rows if r["label"] == label}) for label in LABELS},
        seconds=0.0,
        reused=True,
    )


def _prepare(out: Path, recipes: Sequence[Recipe]) -> None:
    """Create the label folders and remove clips of an earlier build that are not in this plan."""
    wanted = {r.path for r in recipes}
    for label in LABELS:
        folder = out / label
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            stale = re.fullmatch(rf"{label}_\d+\.wav(\.part)?", old.name) and f"{label}/{old.name}" not in wanted
            if stale:
                old.unlink()


def _write_labels(path: Path, recipes: Sequence[Recipe]) -> None:
    part = path.with_name(path.name + ".part")
    with part.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["path", "label", "source"])
        for recipe in sorted(recipes, key=lambda r: r.path):
            writer.writerow([recipe.path, recipe.label, recipe.source])
    os.replace(part, path)
