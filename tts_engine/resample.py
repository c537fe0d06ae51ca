"""Streaming resampling of one request's audio (soxr), so the joins between clauses carry no
discontinuity. Its own module so that processes that only serve audio (a front end, the LLM
process) do not load onnxruntime: a CUDA build of llama.cpp crashed when onnxruntime loaded
after it in one process (on a CUDA 13 host).
"""

from __future__ import annotations

import numpy as np
import soxr

from tts_engine.engine import AudioChunk


class StreamResampler:
    """Resamples one request's float32 audio, chunk after chunk, with soxr (HQ).

    Pass-through when the rates are equal. Call ``process(audio, last=True)`` with the
    final chunk to flush the filter's delay; the output then has
    ``round(total_in * out_rate / in_rate)`` samples.
    """

    def __init__(self, in_rate: int, out_rate: int, dtype: str = "float32") -> None:
        """``dtype``: "float32" for ``process``, "int16" for ``process_chunk`` (no float round trip)."""
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = (
            None if in_rate == out_rate else soxr.ResampleStream(in_rate, out_rate, 1, dtype=dtype, quality="HQ")
        )

    def process(self, audio: np.ndarray, last: bool = False) -> np.ndarray:
        """Float32 samples at ``in_rate`` -> float32 samples at ``out_rate``."""
        audio = np.asarray(audio, dtype=np.float32)
        if self._stream is None:
            return audio
        return self._stream.resample_chunk(audio, last=last)

    def process_chunk(self, chunk: AudioChunk, last: bool = False) -> AudioChunk:
        """An int16 chunk at ``in_rate`` -> the same chunk at ``out_rate`` (needs ``dtype="int16"``)."""
        if self._stream is None:
            return chunk
        pcm = self._stream.resample_chunk(chunk.pcm, last=last)
        return AudioChunk(pcm, self.out_rate, chunk.clause_index, chunk.final)
