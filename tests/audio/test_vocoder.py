"""labswarm's time stretch and pitch shift compute what librosa.effects computes, sample for sample, without
importing scikit-learn (librosa.effects imports librosa.decompose, and with it sklearn.decomposition: issue 27, a
worker's start)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from labswarm.audio.transforms import vocoder


def test_the_same_samples_as_librosa_effects() -> None:
    import librosa.effects

    y = (0.1 * np.random.default_rng(1).standard_normal(22050 + 123)).astype(np.float32)
    for rate in (0.8, 1.3):
        out = vocoder.time_stretch(y, rate)
        assert out.dtype == np.float32 and out.shape == (round(y.size / rate),)
        assert np.array_equal(out, librosa.effects.time_stretch(y, rate=rate))
    for steps, per_octave in ((3.0, 12), (-2.5, 24)):
        out = vocoder.pitch_shift(y, 22050, steps, per_octave, "soxr_hq")
        assert out.dtype == np.float32 and out.shape == y.shape
        assert np.array_equal(out, librosa.effects.pitch_shift(y, sr=22050, n_steps=steps,
                                                               bins_per_octave=per_octave, res_type="soxr_hq"))
    with pytest.raises(ValueError, match="rate"):
        vocoder.time_stretch(y, 0.0)
    with pytest.raises(ValueError, match="bins_per_octave"):
        vocoder.pitch_shift(y, 22050, 1.0, 0)


SCRIPT = """
import json, sys
import numpy as np
from labswarm.audio.transforms.base import Transformation
y = np.zeros(4096, dtype=np.float32)
Transformation.from_spec({"name": "pitch_shift", "semitones": 2})(y, 22050, 0)
Transformation.from_spec({"name": "time_stretch", "rate": 1.5})(y, 22050, 0)
print(json.dumps(sorted(m for m in ("sklearn", "librosa.effects", "librosa.decompose") if m in sys.modules)))
"""


def test_the_transformations_import_no_scikit_learn() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                         check=True).stdout
    assert json.loads(out.splitlines()[-1]) == []
