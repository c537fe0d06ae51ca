"""The TTS engine interface every backend implements (onnxruntime on CPU, PyTorch VITS on GPU).

Units: ``AudioChunk.pcm`` is mono int16 at ``AudioChunk.sample_rate`` Hz; lengths
in samples unless a name says ``_s`` (seconds) or ``_ms``.
"""

from __future__ import annotations

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
