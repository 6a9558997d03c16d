"""Find the Debian files a demo set is built from, and name the packages that are missing.

Every package has a *probe*: glob patterns relative to a root directory (``/`` on a real system) of which at
least one must match a file. Discovery takes the root as an argument, so tests can point it at an empty or
fake tree instead of the real ``/usr/share``.
"""

from __future__ import annotations

import re
import subprocess
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from labswarm.errors import DatasetError

#: Debian package -> glob patterns (relative to the root) of which one must match for the package to count.
PROBES: dict[str, tuple[str, ...]] = {
    "espeak-ng": ("usr/bin/espeak-ng",),
    "flite": ("usr/bin/flite",),
    "festival": ("usr/bin/text2wave",),
    "festvox-kallpc16k": ("usr/share/festival/voices/english/kal_diphone/festvox/kal_diphone.scm",),
    "festvox-us-slt-hts": ("usr/share/festival/voices/us/cmu_us_slt_arctic_hts/hts/*.htsvoice",),
    "libfluidsynth3": ("usr/lib/*/libfluidsynth.so.3*", "usr/lib/libfluidsynth.so.3*"),
    "timgm6mb-soundfont": ("usr/share/sounds/sf2/TimGM6mb.sf2",),
    "musescore-general-soundfont-small": ("usr/share/sounds/sf3/MuseScore_General_Lite.sf3",),
    "asterisk-core-sounds-en-wav": ("usr/share/asterisk/sounds/en_*/*.wav",),
    "asterisk-core-sounds-es-wav": ("usr/share/asterisk/sounds/es_*/*.wav",),
    "asterisk-core-sounds-fr-wav": ("usr/share/asterisk/sounds/fr_*/*.wav",),
    "asterisk-core-sounds-it-wav": ("usr/share/asterisk/sounds/it_*/*.wav",),
    "asterisk-core-sounds-ru-wav": ("usr/share/asterisk/sounds/ru_*/*.wav",),
    "asterisk-moh-opsound-wav": ("usr/share/asterisk/moh/*.wav",),
    "openttd-openmsx": ("usr/share/games/openttd/baseset/openmsx/*.mid",),
    "openttd-opensfx": ("usr/share/games/openttd/baseset/opensfx/opensfx.cat",),
    "planetblupi-music-midi": ("usr/share/planetblupi/music/*.mid",),
    "sonic-pi-samples": ("usr/share/sonic-pi/samples/*.flac",),
    "lmms-common": ("usr/share/lmms/samples/*/*.ogg",),
    "alsa-utils": ("usr/share/sounds/alsa/Noise.wav",),
    "base-files": ("usr/share/common-licenses/*",),
}

#: The Debian packages a demo set needs, in install order.
REQUIRED_PACKAGES: tuple[str, ...] = tuple(PROBES)

#: espeak-ng languages written in Latin script, so that they can read the English prose we feed them.
_LATIN = (
    "af an az bs ca cs cy da de en-029 en-gb en-gb-scotland en-gb-x-gbclan en-gb-x-gbcwmd en-gb-x-rp "
    "en-us en-us-nyc eo es es-419 et eu fi fr-be fr-ch fr-fr ga gd hr ht hu ia id io is it lb lt lv ms mt "
    "nb nl pap pl pt pt-br ro sk sl sq sv sw tn tr uz vi"
)
LATIN_LANGUAGES = frozenset(_LATIN.split())

#: Sonic Pi samples (stem prefixes) that are sound effects rather than music.
_SONIC_NOISE = (
    "ambi_dark_woosh",
    "ambi_drone",
    "ambi_glass",
    "ambi_haunted",
    "ambi_lunar",
    "ambi_sauna",
    "ambi_soft_buzz",
    "ambi_swoosh",
    "vinyl_",
    "misc_",
    "perc_door",
    "perc_impact",
    "perc_snap",
    "perc_swash",
    "perc_swoosh",
    "perc_till",
    "glitch_",
    "mehackit_",
    "loop_3d_printer",
)
_SONIC_MUSIC = ("loop_", "guit_", "ambi_piano", "ambi_choir")
_LMMS_MUSIC = ("beats", "bassloops", "latin", "stringsnpads")
_LMMS_SINGLE_DRUM = ("rave_hihat", "rave_kick", "rave_snare")  # one drum, not a groove
_LMMS_NOISE = ("effects", "misc")


def missing_packages(root: str | Path = "/") -> list[str]:
    """The packages of :data:`REQUIRED_PACKAGES` whose files are not found under ``root``.

    Args:
        root: the file-system root to look under; ``/`` on a real system.

    Returns:
        Package names in :data:`REQUIRED_PACKAGES` order; empty when everything is there.
    """
    base = Path(root)
    return [name for name, patterns in PROBES.items() if not any(_glob(base, p) for p in patterns)]


def require_packages(root: str | Path = "/") -> None:
    """Check that every required package is installed.

    Raises:
        DatasetError: some are missing; the message names them and gives the ``apt-get`` command.
    """
    missing = missing_packages(root)
    if missing:
        raise DatasetError(
            f"the demo set needs Debian packages that are not installed: {', '.join(missing)}\n"
            f"install them with:\n  sudo apt-get install -y {' '.join(missing)}"
        )


@dataclass(frozen=True)
class DemoSources:
    """Every file and program a demo set is built from; paths are absolute and lists sorted.

    Attributes:
        espeak, flite, text2wave: the synthesizer programs.
        asterisk: language folder name (``en_US_f_Allison``) -> its prompt wavs (8 kHz speech).
        moh: music-on-hold recordings (8 kHz music).
        midi: MIDI files (openttd-openmsx, planetblupi).
        soundfonts: General MIDI soundfonts (``.sf2``, ``.sf3``).
        music_loops: looped music samples (Sonic Pi ``loop_*``, lmms beats and bass loops).
        noise_samples: sound-effect samples (Sonic Pi, lmms effects).
        opensfx_cat: the openttd-opensfx ``.cat`` bank of recorded effects.
        alsa_noise: alsa-utils' ``Noise.wav``.
        prose: text files (licences) whose sentences the synthesizers read.
    """

    espeak: Path
    flite: Path
    text2wave: Path
    asterisk: dict[str, tuple[Path, ...]]
    moh: tuple[Path, ...]
    midi: tuple[Path, ...]
    soundfonts: tuple[Path, ...]
    music_loops: tuple[Path, ...]
    noise_samples: tuple[Path, ...]
    opensfx_cat: Path
    alsa_noise: Path
    prose: tuple[Path, ...]


def discover_sources(root: str | Path = "/") -> DemoSources:
    """Find the demo-set material under ``root``.

    Args:
        root: the file-system root to look under; ``/`` on a real system.

    Raises:
        DatasetError: a required package is missing (see :func:`require_packages`).
    """
    base = Path(root)
    require_packages(base)
    asterisk: dict[str, tuple[Path, ...]] = {}
    for folder in sorted((base / "usr/share/asterisk/sounds").iterdir()):
        if folder.is_symlink() or not folder.is_dir():
            continue  # en, en_US -> alternatives of the real speaker folders
        prompts = tuple(p for p in sorted(folder.rglob("*.wav")) if "silence" not in p.parts)
        if prompts:
            asterisk[folder.name] = prompts
    sonic = _files(base, "usr/share/sonic-pi/samples/*.flac")
    lmms = tuple(p for p in _files(base, "usr/share/lmms/samples/*/*.ogg") if _readable(p))
    return DemoSources(
        espeak=base / "usr/bin/espeak-ng",
        flite=base / "usr/bin/flite",
        text2wave=base / "usr/bin/text2wave",
        asterisk=asterisk,
        moh=_files(base, "usr/share/asterisk/moh/*.wav"),
        midi=_files(base, "usr/share/games/openttd/baseset/openmsx/*.mid", "usr/share/planetblupi/music/*.mid"),
        soundfonts=_files(base, "usr/share/sounds/sf2/TimGM6mb.sf2", "usr/share/sounds/sf3/MuseScore_General_Lite.sf3"),
        music_loops=tuple(p for p in sonic if _is_sonic_music(p.stem))
        + tuple(p for p in lmms if p.parent.name in _LMMS_MUSIC and not p.stem.startswith(_LMMS_SINGLE_DRUM)),
        noise_samples=tuple(p for p in sonic if p.stem.startswith(_SONIC_NOISE))
        + tuple(p for p in lmms if p.parent.name in _LMMS_NOISE),
        opensfx_cat=base / "usr/share/games/openttd/baseset/opensfx/opensfx.cat",
        alsa_noise=base / "usr/share/sounds/alsa/Noise.wav",
        prose=tuple(dict.fromkeys(p.resolve() for p in _files(base, "usr/share/common-licenses/*"))),
    )


def pool_of(name: str, n_pools: int) -> int:
    """A stable pool index in ``[0, n_pools)`` for a file name (CRC-32, the same on every machine)."""
    return zlib.crc32(name.encode()) % n_pools


def espeak_voices(espeak: str | Path) -> tuple[list[str], list[str]]:
    """The Latin-script languages and the voice variants that espeak-ng offers.

    Returns:
        ``(languages, variants)``, each sorted; a voice is ``f"{language}+{variant}"``.

    Raises:
        DatasetError: espeak-ng cannot be run or lists nothing usable.
    """
    langs = {line.split()[1] for line in _run_lines([str(espeak), "--voices"])[1:] if len(line.split()) > 1}
    variants = {
        line.split()[4].removeprefix("!v/")
        for line in _run_lines([str(espeak), "--voices=variant"])[1:]
        if len(line.split()) > 4
    }
    languages = sorted(langs & LATIN_LANGUAGES)
    if not languages or not variants:
        raise DatasetError(f"{espeak} lists no usable voices (languages {sorted(langs)[:5]}...)")
    return languages, sorted(variants)


def flite_voices(flite: str | Path) -> list[str]:
    """The general-purpose voices built into flite (``awb_time`` speaks only the time and is left out).

    Raises:
        DatasetError: flite cannot be run or lists no voice.
    """
    text = " ".join(_run_lines([str(flite), "-lv"]))
    voices = sorted(v for v in text.split(":", 1)[-1].split() if not v.endswith("_time"))
    if not voices:
        raise DatasetError(f"{flite} -lv lists no voice: {text!r}")
    return voices


def prose_sentences(paths: Iterable[Path], min_words: int = 5) -> list[str]:
    """Sentences of running prose from text files, whitespace collapsed, in file order.

    Args:
        paths: text files (licences, READMEs).
        min_words: shorter sentences (headings, list markers) are dropped.
    """
    sentences: list[str] = []
    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace")
        text = re.sub(r"[^\w\s.,;:!?'()-]", " ", text)
        text = re.sub(r"\s+", " ", text)
        for sentence in re.split(r"(?<=[.!?])\s+", text):
            words = sentence.split()
            if len(words) >= min_words and sum(w.isalpha() for w in words) >= 0.7 * len(words):
                sentences.append(sentence.strip())
    return sentences


def _is_sonic_music(stem: str) -> bool:
    return stem.startswith(_SONIC_MUSIC) and not stem.startswith(_SONIC_NOISE)


def _readable(path: Path) -> bool:
    """Whether libsndfile can open ``path`` (a few lmms ``.ogg`` files are malformed WAVs)."""
    import soundfile

    try:
        soundfile.info(str(path))
    except (soundfile.LibsndfileError, RuntimeError, OSError):
        return False
    return True


def _glob(base: Path, pattern: str) -> list[Path]:
    return [p for p in base.glob(pattern) if p.is_file()]


def _files(base: Path, *patterns: str) -> tuple[Path, ...]:
    return tuple(sorted({p for pattern in patterns for p in _glob(base, pattern)}))


def _run_lines(argv: Sequence[str]) -> list[str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise DatasetError(f"cannot run {' '.join(argv)}: {exc}") from exc
    return done.stdout.splitlines()
