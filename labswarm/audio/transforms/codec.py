"""Lossy codec round trip (MP3, Ogg Vorbis, Ogg Opus), in memory, time-aligned with the input."""

from __future__ import annotations

import io
from typing import Any, Literal

import lameenc
import numpy as np
import soundfile as sf
import soxr
from pydantic import Field, ValidationInfo, field_validator, model_validator

from labswarm.audio.transforms.base import Transformation, TransformationConfig, register_transformation

#: Bitrates (kbps) of MPEG-1 Layer III (32, 44.1, 48 kHz), ISO/IEC 11172-3.
MP3_BITRATES_MPEG1 = (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320)
#: Bitrates (kbps) of MPEG-2 Layer III (16, 22.05, 24 kHz, ISO/IEC 13818-3) and of MPEG-2.5 (8, 11.025, 12 kHz).
MP3_BITRATES_MPEG2 = (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)
#: Sample rates (Hz) MP3 can code, with the bitrates each allows.
MP3_RATES: dict[int, tuple[int, ...]] = {
    **dict.fromkeys((8000, 11025, 12000, 16000, 22050, 24000), MP3_BITRATES_MPEG2),
    **dict.fromkeys((32000, 44100, 48000), MP3_BITRATES_MPEG1),
}
#: Samples by which a LAME-encoded, mpg123-decoded stream lags its input when the stream carries no LAME
#: "Info" tag (lameenc writes none, so libsndfile's mpg123 cannot trim gaplessly): LAME's encoder delay of
#: 576 samples plus the 529-sample delay of the Layer III decoder's synthesis filter bank (LAME's
#: documentation, "gapless encoding", and its ENCDELAY constant). Checked by cross-correlation in the tests at
#: every MP3 sample rate.
MP3_DELAY_SAMPLES = 576 + 529
#: LAME's algorithm quality (0 best and slowest ... 9 worst and fastest). 7 is audiomentations' default for
#: ``Mp3Compression``: encoding a 10-s clip takes ~9 ms instead of ~40 ms at 2, with the same bitrate.
LAME_QUALITY = 7
#: Sample rates (Hz) Opus codes (RFC 6716); other rates are resampled to the next one up (at most 48 kHz).
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
#: Opus bitrates libsndfile can set, kbps per channel (libsndfile ``ogg_opus.c``: 6 to 256 kbps).
OPUS_MIN_KBPS, OPUS_MAX_KBPS = 6, 256
#: Defaults filled in per format, so that a config always names the effective setting (and the store key).
DEFAULT_MP3_KBPS = 64
DEFAULT_OPUS_KBPS = 32
#: libsndfile's own default Vorbis quality (``ogg_vorbis.c``), about 50 kbps for mono 22.05 kHz audio.
DEFAULT_VORBIS_QUALITY = 0.4


class CodecConfig(TransformationConfig):
    """Parameters of :class:`Codec`.

    Attributes:
        format: the codec: ``mp3`` (LAME via lameenc, constant bitrate), ``vorbis`` (Ogg Vorbis, variable
            bitrate) or ``opus`` (Ogg Opus).
        bitrate_kbps: target bitrate in kbps, for mp3 and opus only. MP3: one of the Layer III bitrates, 8 to
            320 (:data:`MP3_BITRATES_MPEG1`, :data:`MP3_BITRATES_MPEG2`), default 64. Opus: 6 to 256, default 32.
        quality: Vorbis VBR quality in [0, 1] (1 best), for vorbis only; default 0.4.
    """

    format: Literal["mp3", "vorbis", "opus"] = "mp3"
    bitrate_kbps: int | None = Field(default=None, ge=OPUS_MIN_KBPS, le=320)
    quality: float | None = Field(default=None, ge=0.0, le=1.0)

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fmt = data.get("format", "mp3")
        if fmt in ("mp3", "opus") and data.get("bitrate_kbps") is None:
            data = {**data, "bitrate_kbps": DEFAULT_MP3_KBPS if fmt == "mp3" else DEFAULT_OPUS_KBPS}
        elif fmt == "vorbis" and data.get("quality") is None:
            data = {**data, "quality": DEFAULT_VORBIS_QUALITY}
        return data

    @field_validator("bitrate_kbps")
    @classmethod
    def _bitrate_fits_format(cls, value: int | None, info: ValidationInfo) -> int | None:
        fmt = info.data.get("format")
        if value is None:
            return value
        if fmt == "vorbis":
            raise ValueError("vorbis takes `quality` (0..1), not a bitrate")
        if fmt == "mp3" and value not in {*MP3_BITRATES_MPEG1, *MP3_BITRATES_MPEG2}:
            allowed = sorted({*MP3_BITRATES_MPEG1, *MP3_BITRATES_MPEG2})
            raise ValueError(f"{value} is not an MP3 bitrate; use one of {allowed}")
        if fmt == "opus" and value > OPUS_MAX_KBPS:
            raise ValueError(f"opus bitrate must be at most {OPUS_MAX_KBPS} kbps")
        return value

    @field_validator("quality")
    @classmethod
    def _quality_fits_format(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and info.data.get("format") in ("mp3", "opus"):
            raise ValueError(f"{info.data['format']} takes `bitrate_kbps`, not `quality` (vorbis only)")
        return value


@register_transformation
class Codec(Transformation):
    """Encode and decode with a lossy codec, in memory; the output is aligned with the input, same length.

    - MP3: encoded by LAME (lameenc, algorithm quality :data:`LAME_QUALITY`), decoded by libsndfile (mpg123);
      the known codec delay :data:`MP3_DELAY_SAMPLES` is cut from the front. Audio at a rate MP3 cannot code
      at that bitrate is resampled (soxr) to the nearest rate that can and back.
    - Vorbis and Opus: libsndfile (soundfile) in an Ogg container; Ogg's granule positions and Opus' pre-skip
      make both gapless, so nothing needs trimming. Opus codes only at :data:`OPUS_RATES`: other rates are
      resampled (soxr) to the next one up and back.

    The output is trimmed or zero-padded to the input's length. Peaks above full scale are scaled down before
    MP3's 16-bit encoding and back up after, so loud input is not clipped. Deterministic: the seed is not used.
    """

    name = "codec"
    config_model = CodecConfig
    random = False
    config: CodecConfig

    def apply(self, y: np.ndarray, sr: int, rng: np.random.Generator) -> np.ndarray:
        """Round-trip ``y`` (float32 ``(n,)`` at ``sr`` Hz) through the codec; returns float32 ``(n,)``."""
        fmt = self.config.format
        if fmt == "mp3":
            out = self._mp3(y, sr)
        elif fmt == "vorbis":
            quality = self.config.quality
            assert quality is not None, "CodecConfig gives vorbis a default quality"
            level = 1.0 - float(quality)  # libsndfile: Vorbis quality = 1 - compression level
            out = _ogg_round_trip(y, sr, "VORBIS", level)
        else:
            out = self._opus(y, sr)
        return _fix_length(out, y.size)

    def _mp3(self, y: np.ndarray, sr: int) -> np.ndarray:
        kbps = int(self.config.bitrate_kbps or DEFAULT_MP3_KBPS)
        rate = mp3_rate(sr, kbps)
        x = y if rate == sr else soxr.resample(y, sr, rate)
        peak = max(float(x.max()), -float(x.min()))
        gain = 1.0 / peak if peak > 1.0 else 1.0
        pcm = (np.clip(x * np.float32(gain), -1.0, 1.0) * 32767.0).astype(np.int16)
        encoder = lameenc.Encoder()
        encoder.set_bit_rate(kbps)
        encoder.set_in_sample_rate(rate)
        encoder.set_out_sample_rate(rate)
        encoder.set_channels(1)
        encoder.set_quality(LAME_QUALITY)
        encoder.silence()
        data = encoder.encode(pcm.tobytes()) + encoder.flush()
        decoded, _ = sf.read(io.BytesIO(data), dtype="float32")
        decoded = _fix_length(decoded[MP3_DELAY_SAMPLES:], x.size)
        if gain != 1.0:
            decoded *= np.float32(1.0 / gain)
        return decoded if rate == sr else soxr.resample(decoded, rate, sr)

    def _opus(self, y: np.ndarray, sr: int) -> np.ndarray:
        rate = next((r for r in OPUS_RATES if r >= sr), OPUS_RATES[-1])
        kbps = int(self.config.bitrate_kbps or DEFAULT_OPUS_KBPS)
        # libsndfile (ogg_opus.c) maps a compression level c to (1 - c) * 250 + 6 kbps per channel.
        level = 1.0 - (kbps - OPUS_MIN_KBPS) / (OPUS_MAX_KBPS - OPUS_MIN_KBPS)
        x = y if rate == sr else soxr.resample(y, sr, rate)
        out = _ogg_round_trip(x, rate, "OPUS", level)
        return out if rate == sr else soxr.resample(_fix_length(out, x.size), rate, sr)


def mp3_rate(sr: int, kbps: int) -> int:
    """The MP3 sample rate to code ``sr`` Hz audio at ``kbps``: ``sr`` itself when MP3 allows it, else the
    lowest allowed rate above ``sr``, else the highest allowed one (e.g. 44.1 kHz at 8 kbps codes at 24 kHz)."""
    allowed = [rate for rate, bitrates in MP3_RATES.items() if kbps in bitrates]
    above = [rate for rate in allowed if rate >= sr]
    return min(above) if above else max(allowed)


def _ogg_round_trip(y: np.ndarray, sr: int, subtype: str, compression_level: float) -> np.ndarray:
    buffer = io.BytesIO()
    sf.write(buffer, y, sr, format="OGG", subtype=subtype, compression_level=compression_level)
    buffer.seek(0)
    out, _ = sf.read(buffer, dtype="float32")
    return out


def _fix_length(x: np.ndarray, n: int) -> np.ndarray:
    if x.size >= n:
        return x[:n]
    return np.concatenate([x, np.zeros(n - x.size, dtype=x.dtype)])
