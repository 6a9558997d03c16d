"""Fill numba's cache ($NUMBA_CACHE_DIR) in the image with librosa's compiled functions (docker/Dockerfile).

librosa compiles its numba functions on their first call (``cache=True``: into NUMBA_CACHE_DIR). Without a cache,
every new worker container paid that compilation while warming up: measured 2026-11-26 in labswarm:ci on this
machine at load ~29, pitch shift, time stretch, mel and MFCC of 1 s of noise took 489 s in a fresh container and
20 s with the cache the first run left. A worker that slow to start failed the image's healthcheck (start period
120 s, then 3 checks 30 s apart) and swarm replaced it, again and again. This script calls each librosa function
labswarm's transformations and features use (labswarm/pipeline) once, at build time, in a layer that only the
dependencies' layer invalidates. A function labswarm adds later compiles on first use, as before; a cache built
for another CPU is ignored by numba and compiled again.
"""

import librosa
import numpy as np

SR = 22050


def main() -> None:
    y = (0.1 * np.random.default_rng(0).standard_normal(SR)).astype(np.float32)
    librosa.effects.pitch_shift(y, sr=SR, n_steps=2)
    librosa.effects.time_stretch(y, rate=1.25)
    librosa.resample(y, orig_sr=SR, target_sr=16000)
    power = np.abs(librosa.stft(y)) ** 2
    mel = librosa.feature.melspectrogram(S=power, sr=SR, n_mels=64)
    librosa.power_to_db(mel)
    librosa.amplitude_to_db(np.sqrt(power))
    librosa.feature.mfcc(y=y, sr=SR, n_mfcc=20)
    librosa.cqt(y, sr=SR, fmin=librosa.note_to_hz("C2"), n_bins=36)
    librosa.util.fix_length(y, size=SR + 100)


if __name__ == "__main__":
    main()
