"""The warm parent's preload (:mod:`labswarm.deploy.warm`): imported once, in the forkserver process only, it imports
what a ``labswarm worker`` imports and runs the audio libraries once, so that every worker forked from it starts
warm. Importing it anywhere else does that work there: only :mod:`labswarm.deploy.warm` names it.

Fork-safety: the maths libraries are limited to one thread each before numpy is first imported (no BLAS/OpenMP
thread pool is started), nothing here opens a connection or starts a thread, and the collector's objects of this
work are frozen (``gc.freeze``: no copy-on-write of them by collections in the workers).
"""

from __future__ import annotations

import gc
import importlib
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy's first import: no thread pool of any maths library in this process

#: What a worker imports (the command line's entry included), by name: the queue and command-line layers sit above
#: this one, and the worker reaches them the same way, through ``python -m labswarm.cli worker``.
MODULES = ("labswarm.cli.main", "labswarm.queue.worker", "labswarm.pipeline.features")

#: Transformations and features run once here: those of the demo experiment (examples/music_speech_noise.yml) and
#: the common features, each on 1 s of noise; a worker's own experiment is warmed again in the worker (cheap then:
#: the libraries are loaded, numba's functions compiled or read from its cache).
TRANSFORMATIONS = ({"name": "identity"}, {"name": "pitch_shift", "semitones": 2}, {"name": "gain", "gain_db": -6.0},
                   {"name": "eq", "bands": [{"freq_hz": 150, "gain_db": -9, "q": 0.7}]},
                   {"name": "add_noise", "snr_db": 20, "color": "pink"}, {"name": "time_stretch", "rate": 1.1})
FEATURES = ({"name": "mel", "n_mels": 128}, {"name": "mfcc", "n_mfcc": 20}, {"name": "stft"})


def warm() -> None:
    """Import :data:`MODULES` and run each of :data:`TRANSFORMATIONS` once with :data:`FEATURES` (one this
    installation does not know is skipped)."""
    gc.disable()
    for name in MODULES:
        importlib.import_module(name)
    from labswarm.config.experiment import parse_experiment
    from labswarm.errors import LabswarmError
    from labswarm.pipeline.features import FeaturesBlock

    for transformation in TRANSFORMATIONS:  # one block each: one this installation does not know skips itself only
        try:
            config = parse_experiment({"name": "warm", "dataset": {"root": "/"}, "transformations": [transformation],
                                       "features": list(FEATURES), "store": {"root": "/nonexistent-labswarm-warm"}})
            FeaturesBlock(config).warm_up()
        except (LabswarmError, ValueError):
            continue
    gc.collect()
    gc.freeze()
    gc.enable()


warm()
