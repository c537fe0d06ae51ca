"""The TTS engine interface every backend implements (onnxruntime on CPU, PyTorch VITS on GPU).

Units: ``AudioChunk.pcm`` is mono int16 at ``AudioChunk.sample_rate`` Hz; lengths
in samples unless a name says ``_s`` (seconds) or ``_ms``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class SynthesisOptions:
    """Per-request settings; ``None`` means the voice's own default."""

    #: >1 speaks slower.
    length_scale: float | None = None
    #: Variance of the prior (expressiveness); 0 is deterministic.
    noise_scale: float | None = None
    #: Variance of the stochastic duration predictor; 0 is deterministic.
    noise_w: float | None = None
    #: Speaker of a multi-speaker voice.
    speaker_id: int | None = None
    #: Output rate, Hz; None is the voice's native rate (resampled with soxr otherwise).
    sample_rate: int | None = None
    #: Speaking rate multiple (a session's ``audio.output.speed``): the length scale, this request's
    #: or the defaults', is made that much shorter (``speed_length_scale``). None is 1.
    speed: float | None = None

    @classmethod
    def from_config(cls, tts) -> SynthesisOptions:  # noqa: ANN001 - base.config.TtsConfig
        """An engine's defaults from ``cfg.tts`` (scales and speaker; None keeps the voice's own)."""
        return cls(length_scale=tts.length_scale, noise_scale=tts.noise_scale, noise_w=tts.noise_w,
                   speaker_id=tts.speaker_id)


@dataclass(frozen=True)
class AudioChunk:
    """One piece of synthesized speech."""

    #: Mono int16 samples.
    pcm: np.ndarray
    #: Samples per second of ``pcm``.
    sample_rate: int
    #: Index of the clause/sentence this chunk belongs to (0-based).
    clause_index: int = 0
    #: True for the last chunk of its clause.
    final: bool = False

    @property
    def num_samples(self) -> int:
        return int(self.pcm.shape[0])

    @property
    def duration_s(self) -> float:
        return self.num_samples / self.sample_rate


class TtsEngine(Protocol):
    """Text in, audio out, one clause at a time."""

    #: Native sample rate of the voice, Hz.
    sample_rate: int

    def synthesize(self, text: str, options: SynthesisOptions | None = None) -> Iterator[AudioChunk]:
        """Normalize, phonemize and speak ``text``; yields chunks as soon as each is ready."""
        ...

    def synthesize_ids(
        self, phoneme_ids: list[int], options: SynthesisOptions | None = None
    ) -> Iterator[AudioChunk]:
        """Speak an already-phonemized id sequence (one clause)."""
        ...


#: Output rates accepted in ``SynthesisOptions.sample_rate``, Hz.
MIN_RATE, MAX_RATE = 8_000, 192_000


@dataclass(frozen=True)
class ResolvedOptions:
    """Per-request settings after defaults are applied and values checked (every backend)."""

    noise_scale: float
    length_scale: float
    noise_w: float
    #: Speaker id for the model (None for single-speaker voices).
    speaker_id: int | None
    #: Output rate, Hz.
    sample_rate: int


def engine_defaults(defaults: SynthesisOptions, output_rate: int) -> SynthesisOptions:
    """``defaults`` with an engine's output rate (``tts.output_rate``, 0: none) as the rate of
    requests that name none, unless the defaults name one."""
    if output_rate and defaults.sample_rate is None:
        return dataclasses.replace(defaults, sample_rate=output_rate)
    return defaults


#: VITS rounds each phoneme id's frame count up, so a sentence lasts about ``a * length_scale + b`` with
#: ``b`` (the rounding, ~half a frame per id, blanks included) not scaling: ``b / a`` at length scale 1,
#: fitted on 20 sentences of bench/sentences_en.txt with the bundled voice (0.12-0.35, mean 0.19).
#: With it, speed 1.5 made 12 other sentences 1.51x shorter (1.48-1.55) where length scale 1/1.5 gave
#: 1.39x; speed 0.5 2x longer within 6 %.
ROUNDING_SHARE = 0.19


def speed_length_scale(length_scale: float, speed: float) -> float:
    """The length scale that makes speech ``speed`` times faster than at ``length_scale``: the scaled
    part of a sentence's length (``ROUNDING_SHARE``) is divided by ``speed``, the rounding is not."""
    if speed == 1.0:
        return length_scale
    k = ROUNDING_SHARE / length_scale  # the share at this length scale
    return max(0.05, length_scale * ((1 + k) / speed - k))


def resolve_options(options: SynthesisOptions | None, defaults: SynthesisOptions, voice) -> ResolvedOptions:
    """Request options over engine ``defaults`` over the ``voice``'s own (``tts_engine.voice.Voice``).

    Raises ``InvalidInput`` for non-finite or out-of-range values and unknown speakers.
    """
    import math

    from base.errors import InvalidInput

    req, cfg = options or SynthesisOptions(), voice.config

    def pick(name: str, voice_value: float) -> float:
        for value in (getattr(req, name), getattr(defaults, name)):
            if value is not None:
                return float(value)
        return float(voice_value)

    noise_scale = pick("noise_scale", cfg.noise_scale)
    length_scale = speed_length_scale(pick("length_scale", cfg.length_scale), float(req.speed or 1.0))
    noise_w = pick("noise_w", cfg.noise_w)
    if not all(math.isfinite(v) for v in (noise_scale, length_scale, noise_w)):
        raise InvalidInput(f"synthesis scales must be finite numbers, got {noise_scale}, {length_scale}, {noise_w}")
    if not 0.05 <= length_scale <= 20:
        raise InvalidInput(f"length_scale must be in [0.05, 20], got {length_scale}")
    if noise_scale < 0 or noise_w < 0:
        raise InvalidInput(f"noise_scale and noise_w must be >= 0, got {noise_scale}, {noise_w}")
    speaker = req.speaker_id if req.speaker_id is not None else defaults.speaker_id
    rate = int(req.sample_rate or defaults.sample_rate or voice.sample_rate)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise InvalidInput(f"sample_rate must be in [{MIN_RATE}, {MAX_RATE}] Hz, got {rate}")
    return ResolvedOptions(noise_scale, length_scale, noise_w, voice.speaker_id(speaker), rate)


def phoneme_id_array(phoneme_ids, num_symbols: int) -> np.ndarray:
    """``phoneme_ids`` as a one-dimensional int64 array of ids in ``[0, num_symbols)``; ``InvalidInput``
    when they are empty, not integers (floats, strings and booleans included) or out of range.
    Vectorized: a sentence's ids are checked in a few microseconds (the GPU engine does it per
    sentence, on the path its scheduler serves)."""
    from base.errors import InvalidInput

    try:
        ids = np.asarray(phoneme_ids)
    except (TypeError, ValueError):
        raise InvalidInput("phoneme_ids must be integers") from None
    if ids.ndim == 1 and ids.size == 0:
        raise InvalidInput("phoneme_ids is empty")
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise InvalidInput("phoneme_ids must be integers")
    bad = (ids < 0) | (ids >= num_symbols)
    if bad.any():
        raise InvalidInput(f"phoneme id {ids[bad][0]} out of range: the voice has {num_symbols} symbols")
    return ids.astype(np.int64, copy=False)


def check_phoneme_ids(phoneme_ids, num_symbols: int) -> list[int]:
    """``phoneme_ids`` as a list of ints in ``[0, num_symbols)``; ``InvalidInput`` otherwise
    (``phoneme_id_array``'s checks)."""
    return phoneme_id_array(phoneme_ids, num_symbols).tolist()
