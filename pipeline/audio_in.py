"""Input audio of one session: resampling to the ASR rate and the push-to-talk buffer.

Units: int16 mono samples; rates in Hz. The buffer holds at most ``max_s`` seconds at
16 kHz (``limits.max_utterance_s``); audio beyond it is dropped and reported once.
"""

from __future__ import annotations

import numpy as np
import soxr

from realtime.wire import ErrorCode
from base.errors import InvalidInput

ASR_RATE = 16000


class InputAudio:
    def __init__(self, max_s: float) -> None:
        self.max_samples = int(max_s * ASR_RATE)
        self._resampler: soxr.ResampleStream | None = None
        self._rate = 0
        self._chunks: list[np.ndarray] = []
        self._samples = 0
        self._overflow = False

    def to_asr_rate(self, pcm: np.ndarray, rate: int) -> np.ndarray:
        """``pcm`` at ``rate`` Hz resampled to 16 kHz by a streaming resampler (no clicks between chunks)."""
        if rate == ASR_RATE:
            return pcm
        if self._resampler is None or self._rate != rate:
            self._resampler = soxr.ResampleStream(rate, ASR_RATE, 1, dtype="int16", quality="HQ")
            self._rate = rate
        return self._resampler.resample_chunk(pcm)

    def buffer(self, pcm16k: np.ndarray) -> InvalidInput | None:
        """Add to the push-to-talk buffer; returns an error the first time audio is dropped."""
        room = self.max_samples - self._samples
        error = None
        if len(pcm16k) > room:
            if not self._overflow:
                self._overflow = True
                error = InvalidInput(
                    f"input audio buffer is full ({self.max_samples / ASR_RATE:g} s); later audio is "
                    "dropped until commit or clear", code=ErrorCode.INPUT_AUDIO_BUFFER_FULL)
            pcm16k = pcm16k[:max(room, 0)]
        if len(pcm16k):
            self._chunks.append(pcm16k)
            self._samples += len(pcm16k)
        return error

    def take(self) -> np.ndarray:
        """The buffered audio (16 kHz), including what the resampler still held back; empties the buffer."""
        if self._resampler is not None:
            self.buffer(self._resampler.resample_chunk(np.zeros(0, np.int16), last=True))
            self._resampler = None
        audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
        self.clear()
        return audio

    def clear(self) -> None:
        self._chunks, self._samples, self._overflow = [], 0, False
