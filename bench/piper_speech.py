"""Test helper: English speech from the bundled Piper voice, as int16 PCM at 16 kHz.

Synthesis noise is off so the audio (and every test on it) is deterministic.
Not our TTS engine on purpose: ASR/VAD tests should not depend on it.
"""

from __future__ import annotations

import functools

import numpy as np
import soxr

RATE = 16000  # Hz


@functools.lru_cache(maxsize=1)
def _voice(path: str):
    from piper.voice import PiperVoice

    return PiperVoice.load(path)


class PiperSpeech:
    """``say(text)`` -> int16 PCM at 16 kHz with leading/trailing near-silence trimmed."""

    def __init__(self, cfg) -> None:
        from base import models

        self.voice = _voice(str(models.resolve_voice(cfg).path))

    def say(self, text: str) -> np.ndarray:
        from piper.config import SynthesisConfig

        syn = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
        chunks = list(self.voice.synthesize(text, syn_config=syn))
        audio = np.concatenate([c.audio_float_array for c in chunks])
        audio = soxr.resample(audio, chunks[0].sample_rate, RATE)
        loud = np.flatnonzero(np.abs(audio) > 0.01)
        audio = audio[loud[0] : loud[-1] + 1]
        return (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)


def silence(ms: float) -> np.ndarray:
    """Digital silence, int16 at 16 kHz."""
    return np.zeros(int(RATE * ms / 1000), dtype=np.int16)


def noise(ms: float, rms: float, seed: int = 0) -> np.ndarray:
    """White noise with the given RMS (int16 units), int16 at 16 kHz."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, rms, int(RATE * ms / 1000))
    return np.clip(x, -32768, 32767).astype(np.int16)
