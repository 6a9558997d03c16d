"""Feature extractor base class and registry.

A feature extractor maps a mono float32 waveform to a 2-D float32 array ``(n_bins, n_frames)``. Its config
model and ``version`` are part of the feature-store key, so changing either never serves stale features.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from labswarm.audio.features.shared import Spectra
from labswarm.errors import FeatureError
from labswarm.plugin import PluginConfig, build_plugin
from labswarm.registry import EXTRACTORS


class FeatureConfig(PluginConfig):
    """Base config of a feature extractor.

    Attributes:
        output: the name the features are stored and read under; defaults to ``name``. Set it to use one
            extractor twice with different parameters (``{name: mel, n_mels: 64, output: mel64}``).
    """

    output: str | None = None

    @property
    def output_name(self) -> str:
        """``output`` or, when unset, ``name``."""
        return self.output or self.name


class FeatureExtractor(ABC):
    """Base of every feature extractor; owns the invariants, subclasses implement :meth:`compute`.

    Class attributes:
        name: the registry name used in YAML.
        config_model: the pydantic model of the parameters.
        version: bumped when the output for the same parameters changes; part of the feature-store key.
    """

    name: ClassVar[str]
    config_model: ClassVar[type[FeatureConfig]] = FeatureConfig
    version: ClassVar[int] = 1

    def __init__(self, config: FeatureConfig | None = None) -> None:
        self.config = config if config is not None else self.config_model(name=self.name)

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | FeatureConfig) -> FeatureExtractor:
        """Build the registered extractor a spec (``{name: ..., **params}`` or a config) names.

        Raises:
            ConfigError: unknown name or invalid parameters.
        """
        return build_plugin(EXTRACTORS, spec)

    @property
    def output_name(self) -> str:
        """The name these features are stored and read under."""
        return self.config.output_name

    def spec(self) -> dict[str, Any]:
        """The JSON-serializable spec ``{name, **params}`` (``output`` excluded: it does not change values)."""
        return self.config.model_dump(mode="json", exclude={"output"})

    def __call__(self, y: np.ndarray, sr: int, spectra: Spectra | None = None) -> np.ndarray:
        """Compute the features.

        Args:
            y: mono waveform, float32 array ``(n_samples,)``.
            sr: sample rate of ``y`` in Hz.
            spectra: intermediate results shared with the other extractors of the same waveform (one STFT
                for mel + MFCC); ``None`` makes a private one.

        Returns:
            C-contiguous float32 array ``(n_bins, n_frames)``; see each extractor for bins and units.

        Raises:
            FeatureError: empty input, or the underlying library failed.
        """
        y = np.asarray(y)
        if y.ndim != 1 or y.size == 0:
            raise FeatureError(f"{self.name}: expected a non-empty mono waveform, got shape {y.shape}")
        try:
            y = y.astype(np.float32, copy=False)
            if spectra is None or spectra.y is not y or spectra.sr != int(sr):
                spectra = Spectra(y, int(sr))
            out = self.compute(y, int(sr), spectra)
        except FeatureError:
            raise
        except Exception as exc:
            raise FeatureError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        out = np.ascontiguousarray(out, dtype=np.float32)
        if out.ndim != 2:
            raise FeatureError(f"{self.name}: expected a 2-D output, got shape {out.shape}")
        return out

    def bins(self, sr: int) -> int | None:
        """The rows of :meth:`__call__`'s output for audio at ``sr`` Hz where the parameters alone fix them
        (``n_mels``, ``n_mfcc``), with the checks that depend on ``sr`` done as :meth:`compute` does them;
        ``None`` (the default): only computing tells.

        Raises:
            FeatureError: the parameters do not fit ``sr`` (as :meth:`__call__` would raise).
        """
        return None

    @abstractmethod
    def compute(self, y: np.ndarray, sr: int, spectra: Spectra) -> np.ndarray:
        """Compute features of ``y`` (float32 ``(n_samples,)`` at ``sr`` Hz) as a 2-D array; take STFTs and mel
        spectra from ``spectra`` (memoized for the waveform) where they fit."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec()})"


def register_extractor(cls: type[FeatureExtractor]) -> type[FeatureExtractor]:
    """Class decorator: register a :class:`FeatureExtractor` under its ``name``."""
    return EXTRACTORS.register(cls)
