"""Plan a demo set: one :class:`Recipe` per clip, drawn in the parent from a single seeded generator.

A recipe names everything a worker needs (kind, files, voice, text) and carries its own seed for the rest,
so rendering can run in any process and in any order and still give the same bytes.

Two things keep the classes honest:

* **Bandwidth.** Every class is passed through a telephone (8 kHz) or wideband (16 kHz) sample rate with the
  same probabilities (:data:`BAND_WEIGHTS`); native 8 kHz material (asterisk prompts, music on hold) is only
  drawn for telephone-band clips, so "narrow band" says nothing about the label.
* **Sources.** A clip's ``source`` names the recording, voice or MIDI file it comes from; clips mixed from
  several short files (asterisk prompts, loops, effects) draw them from one fixed pool (by file name,
  :func:`~.sources.pool_of`; opensfx effects by table index) and name the pool, so a split by source never
  puts one recording on both sides.
* **Nuisances.** Room reverberation, a background bed (coloured noise or hum) and the peak level are drawn
  the same way for every class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from labswarm.datasets.demo.sources import DemoSources, espeak_voices, flite_voices, pool_of, prose_sentences

#: The class labels, in plan order.
LABELS: tuple[str, ...] = ("music", "speech", "noise")
#: Sample rate (Hz) a clip is band-limited through -> probability; None keeps the full band. Same for all classes.
BAND_WEIGHTS: dict[int | None, float] = {8000: 0.25, 16000: 0.08, None: 0.67}
#: Pools per asterisk language, for the short sound effects, for the samples and for the music loops.
ASTERISK_POOLS = 8
SFX_POOLS = 12
SAMPLE_POOLS = 6
LOOP_POOLS = 6

_FESTIVAL_RATES = {"kal_diphone": 16000, "cmu_us_slt_arctic_hts": 32000}
_FLITE_RATES = {"kal": 8000}  # the other built-in voices speak at 16 kHz


@dataclass(frozen=True)
class Recipe:
    """How to render one clip.

    Attributes:
        clip_id: file stem, e.g. ``music_0003``.
        label: one of :data:`LABELS`.
        kind: the renderer, e.g. ``espeak``, ``midi``, ``opensfx``.
        source: id of the underlying recording, voice, MIDI file or pool (see the module docstring).
        seed: seeds the renderer's own generator (window offsets, transposition, ...).
        params: renderer arguments (paths as strings, voice, text); JSON-able.
        band_hz: sample rate (Hz) to band-limit through, or None for the full band.
        peak_dbfs: peak level of the written clip, dBFS.
        bed: ``"noise"`` or ``"hum"`` mixed under the clip, or None.
        bed_snr_db: level of the bed below the clip, dB.
        rt60: reverberation time of a synthetic room, seconds, or None for a dry clip.
    """

    clip_id: str
    label: str
    kind: str
    source: str
    seed: int
    params: dict[str, Any] = field(default_factory=dict)
    band_hz: int | None = None
    peak_dbfs: float = -3.0
    bed: str | None = None
    bed_snr_db: float = 20.0
    rt60: float | None = None

    @property
    def path(self) -> str:
        """The clip's path relative to the output folder, ``<label>/<clip_id>.wav``."""
        return f"{self.label}/{self.clip_id}.wav"


@dataclass(frozen=True)
class Catalog:
    """The material a plan draws from: discovered files plus what the synthesizers offer.

    Attributes:
        sources: files and programs (:func:`~.sources.discover_sources`).
        espeak_languages, espeak_variants: espeak-ng voices are ``language+variant``.
        flite_voices: voices built into flite.
        sentences: prose the synthesizers read.
    """

    sources: DemoSources
    espeak_languages: Sequence[str]
    espeak_variants: Sequence[str]
    flite_voices: Sequence[str]
    sentences: Sequence[str]

    @classmethod
    def from_sources(cls, sources: DemoSources) -> Catalog:
        """Ask the synthesizers for their voices and read the prose.

        Raises:
            DatasetError: a synthesizer cannot be run.
        """
        languages, variants = espeak_voices(sources.espeak)
        return cls(sources, languages, variants, flite_voices(sources.flite), prose_sentences(sources.prose))


def plan_clips(catalog: Catalog, per_class: int, seed: int) -> list[Recipe]:
    """Draw ``per_class`` recipes for each label from ``numpy.random.default_rng(seed)``.

    Returns:
        ``len(LABELS) * per_class`` recipes, grouped by label, numbered from 0 within a label.
    """
    rng = np.random.default_rng(seed)
    planners = {"music": _plan_music, "speech": _plan_speech, "noise": _plan_noise}
    recipes = []
    bands = list(BAND_WEIGHTS)
    band_p = list(BAND_WEIGHTS.values())
    for label in LABELS:
        for i in range(per_class):
            band = bands[int(rng.choice(len(bands), p=band_p))]
            kind, source, params = planners[label](catalog, rng, band)
            bed = str(rng.choice(["noise", "hum"], p=[0.75, 0.25])) if rng.random() < 0.2 else None
            recipes.append(
                Recipe(
                    clip_id=f"{label}_{i:04d}",
                    label=label,
                    kind=kind,
                    source=source,
                    seed=int(rng.integers(2**62)),
                    params=params,
                    band_hz=band,
                    peak_dbfs=round(float(rng.uniform(-12.0, -1.0)), 2),
                    bed=bed,
                    bed_snr_db=round(float(rng.uniform(12.0, 35.0)), 1),
                    rt60=round(float(rng.uniform(0.2, 1.2)), 2) if rng.random() < 0.2 else None,
                )
            )
    return recipes


Plan = tuple[str, str, dict[str, Any]]


def _pick(rng: np.random.Generator, items: Sequence[Any]) -> Any:
    return items[int(rng.integers(len(items)))]


def _choose(rng: np.random.Generator, weights: dict[str, float]) -> str:
    names = list(weights)
    p = np.array(list(weights.values()))
    return names[int(rng.choice(len(names), p=p / p.sum()))]


def _pools(paths: Sequence[Path], n_pools: int) -> list[tuple[int, list[str]]]:
    """The non-empty pools of ``paths``, as ``(pool, paths)`` in pool order."""
    pools: dict[int, list[str]] = {}
    for path in paths:
        pools.setdefault(pool_of(path.name, n_pools), []).append(str(path))
    return sorted(pools.items())


def _text(catalog: Catalog, rng: np.random.Generator, words: int) -> str:
    sentences = catalog.sentences
    start = int(rng.integers(len(sentences)))
    picked: list[str] = []
    while sum(len(s.split()) for s in picked) < words:
        picked.append(sentences[(start + len(picked)) % len(sentences)])
    return " ".join(picked)


def _plan_speech(catalog: Catalog, rng: np.random.Generator, band: int | None) -> Plan:
    src = catalog.sources
    if band == 8000:
        kind = _choose(rng, {"asterisk": 0.7, "espeak": 0.15, "flite": 0.08, "festival": 0.07})
    elif band == 16000:
        kind = _choose(rng, {"espeak": 0.4, "flite": 0.4, "festival": 0.2})
    else:
        kind = _choose(rng, {"espeak": 0.8, "festival": 0.2})
    if kind == "asterisk":
        language = _pick(rng, sorted(src.asterisk))
        pool, prompts = _pick(rng, _pools(src.asterisk[language], ASTERISK_POOLS))
        return kind, f"asterisk/{language}/pool{pool}", {"prompts": prompts}
    if kind == "espeak":
        voice = f"{_pick(rng, catalog.espeak_languages)}+{_pick(rng, catalog.espeak_variants)}"
        speed = int(rng.integers(110, 230))
        params = {
            "program": str(src.espeak),
            "voice": voice,
            "speed": speed,
            "pitch": int(rng.integers(10, 90)),
            "word_gap": int(rng.choice([0, 0, 1, 3, 6])),
            "text": _text(catalog, rng, int(speed / 60 * 12) + 6),
        }
        return kind, f"espeak/{voice}", params
    stretch = round(float(rng.uniform(0.8, 1.3)), 2)
    text = _text(catalog, rng, int(40 / stretch) + 6)
    if kind == "flite":
        voice = _pick(rng, [v for v in catalog.flite_voices if band == 8000 or _FLITE_RATES.get(v, 16000) > 8000])
        params = {
            "program": str(src.flite),
            "voice": voice,
            "stretch": stretch,
            "f0": int(rng.integers(80, 220)),
            "text": text,
        }
        return kind, f"flite/{voice}", params
    voices = [v for v, rate in _FESTIVAL_RATES.items() if band is not None or rate > 16000]
    voice = _pick(rng, voices)
    return kind, f"festival/{voice}", {"program": str(src.text2wave), "voice": voice, "stretch": stretch, "text": text}


def _plan_music(catalog: Catalog, rng: np.random.Generator, band: int | None) -> Plan:
    src = catalog.sources
    weights = {"moh": 0.45, "midi": 0.45, "loops": 0.1} if band == 8000 else {"midi": 0.82, "loops": 0.18}
    kind = _choose(rng, weights)
    if kind == "moh":
        path = _pick(rng, src.moh)
        return kind, f"moh/{path.stem}", {"path": str(path)}
    if kind == "loops":
        pool, paths = _pick(rng, _pools(src.music_loops, LOOP_POOLS))
        return kind, f"loops/pool{pool}", {"paths": paths}
    path = _pick(rng, src.midi)
    params = {
        "path": str(path),
        "soundfont": str(_pick(rng, src.soundfonts)),
        "soundfonts": [str(p) for p in src.soundfonts],
    }
    return kind, f"midi/{path.parent.name}/{path.stem}", params


def _plan_noise(catalog: Catalog, rng: np.random.Generator, band: int | None) -> Plan:
    src = catalog.sources
    kind = _choose(rng, {"opensfx": 0.36, "samples": 0.27, "coloured": 0.25, "hum": 0.07, "alsa": 0.05})
    if kind == "opensfx":
        pool = int(rng.integers(SFX_POOLS))
        return kind, f"opensfx/pool{pool:02d}", {"cat": str(src.opensfx_cat), "pool": pool, "n_pools": SFX_POOLS}
    if kind == "samples":
        pool, paths = _pick(rng, _pools(src.noise_samples, SAMPLE_POOLS))
        return kind, f"samples/pool{pool}", {"paths": paths}
    if kind == "alsa":
        return kind, "alsa/Noise", {"path": str(src.alsa_noise)}
    return kind, f"generated/{kind}/{int(rng.integers(2**31)):08x}", {}
