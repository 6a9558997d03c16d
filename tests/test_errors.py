"""labswarm/errors.py: an AudioError crosses a pickle and a process boundary whole (path, reason, message)."""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from labswarm.errors import AudioError, SampleError


def _raise_audio_error(path: str) -> None:
    raise AudioError(path, "cannot decode audio (Format not recognised)")


def test_an_audio_error_pickles_and_crosses_a_process_pool_with_its_path_and_reason() -> None:
    """~1 s: one spawned worker (before, unpickling failed on the missing reason and broke the pool)."""
    error = AudioError("clips/a.wav", "no audio frames")
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is AudioError and isinstance(back, SampleError)
    assert (back.path, back.reason, str(back)) == ("clips/a.wav", "no audio frames", "clips/a.wav: no audio frames")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        with pytest.raises(AudioError) as raised:
            pool.submit(_raise_audio_error, "x.wav").result(120)
        assert pool.submit(len, "ok").result(120) == 2  # the pool still works
    assert (raised.value.path, raised.value.reason) == ("x.wav", "cannot decode audio (Format not recognised)")
