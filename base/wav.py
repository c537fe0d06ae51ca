"""16-bit mono WAV files in and out (stdlib ``wave``), for the CLI commands and clients."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

from base.errors import InvalidInput


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """Mono int16 samples and rate (Hz) of a 16-bit PCM WAV; channels are averaged."""
    try:
        with wave.open(str(path), "rb") as w:
            width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
            raw = w.readframes(w.getnframes())
    except (OSError, wave.Error, EOFError) as exc:
        raise InvalidInput(f"cannot read {path}: {exc}") from None
    if width != 2:
        raise InvalidInput(f"{path}: need 16-bit PCM, got {8 * width}-bit samples")
    pcm = np.frombuffer(raw, dtype="<i2").astype(np.int16)
    if channels > 1:
        pcm = pcm.reshape(-1, channels).mean(axis=1).astype(np.int16)
    return pcm, rate


def write_wav(path: Path, pcm: np.ndarray, sample_rate: int) -> None:
    """Write mono int16 ``pcm`` at ``sample_rate`` Hz as a 16-bit PCM WAV."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(np.asarray(pcm, dtype="<i2").tobytes())
