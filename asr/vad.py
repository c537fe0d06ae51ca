"""Voice activity detection over webrtcvad: PCM in, utterance events out.

``VoiceActivityDetector.feed(pcm16)`` takes int16 mono PCM of any length, cuts it
into whole webrtcvad frames (10/20/30 ms, the rest is kept for the next call) and
returns the events those frames caused:

- ``SpeechStart``: ``start_frames`` consecutive voiced frames were seen.
- ``Pause``: silence inside speech reached ``speculative_pause_ms`` (once per pause);
  carries the utterance so far, so ASR can start before the turn is over.
- ``Resume``: speech came back after a ``Pause``; the speculative result is stale.
- ``SpeechEnd``: silence reached ``silence_duration_ms`` (or the utterance reached
  ``max_utterance_s``, ``forced=True``); carries the whole utterance.

Durations in the config are rounded up to whole frames (``speculative_pause_ms``
200 with 30 ms frames waits 210 ms). Times (``t_ms``, int) are stream time:
milliseconds of audio fed since construction, on frame boundaries (samples that
``reset()`` drops still count, so the clock never goes back).
``SpeechStart.t_ms`` is where the first voiced frame of the start run begins;
``Pause.t_ms`` and ``SpeechEnd.t_ms`` are where the last voiced frame ends (speech
end, not detection time: detection happens ``speculative_pause_ms`` /
``silence_duration_ms`` later; a forced ``SpeechEnd`` is at the cut);
``Resume.t_ms`` is where the voiced frame that resumed speech begins.

webrtcvad keeps calling frames voiced for 60-120 ms after a word ends (its own hangover), even
digital silence. With ``noise_gate_db`` > 0 a frame it calls voiced counts as silence when its
energy is within that many dB of the noise floor: the floor follows the frames webrtcvad calls
unvoiced outside speech and in silences inside it (down at once, up at most ``NOISE_RISE_DB_S``
dB per second), so a speech end is found where the voice meets the noise. On the project's turn
set the end moves from 66 ms after the last audible sample to 16 ms (docs/architecture.md,
"Voice activity").

Utterance audio runs from ``prefix_padding_ms`` before the speech start to
``TRAILING_MS`` after the last voiced frame (webrtcvad often calls soft word
endings unvoiced). Since ``TRAILING_MS`` <= the default ``speculative_pause_ms``,
a ``SpeechEnd`` that follows a ``Pause`` with no ``Resume`` carries the same
samples as that ``Pause``, so a speculative transcript of it can be reused as is.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import webrtcvad

from base.config import Config, VadConfig
from base.errors import ConfigError, InvalidInput

SAMPLE_RATES = (8000, 16000, 32000, 48000)  # what webrtcvad accepts, Hz
FRAME_MS = (10, 20, 30)
#: Silence kept after the last voiced frame in utterance audio, ms.
TRAILING_MS = 180
#: Stream start during which no speech can start, ms: a fresh webrtcvad calls the
#: first ~120 ms of any non-silent input (even faint noise) speech while it adapts.
WARMUP_MS = 150
#: The noise floor rises at most this fast, dB/s (it falls at once to a quieter frame).
NOISE_RISE_DB_S = 6.0
#: Energy of a digitally silent frame, dBFS (the floor never goes below it).
SILENT_DBFS = -100.0
#: Frames of silence inside speech after which unvoiced frames update the noise floor
#: (shorter gaps are often soft consonants).
NOISE_GAP_MS = 60


@dataclass(frozen=True)
class SpeechStart:
    """Speech began at stream time ``t_ms``."""

    t_ms: int


@dataclass(frozen=True, eq=False)
class SpeechEnd:
    """Speech ended at ``t_ms``; ``audio`` is the whole utterance (int16, detector rate).

    ``forced`` is True when the utterance was cut at ``max_utterance_s`` or by ``flush()``.
    """

    t_ms: int
    audio: np.ndarray
    forced: bool = False


@dataclass(frozen=True, eq=False)
class Pause:
    """Silence inside speech reached ``speculative_pause_ms``; speech last ended at ``t_ms``.

    ``audio`` is the utterance so far (int16), for speculative ASR.
    """

    t_ms: int
    audio: np.ndarray

    @property
    def audio_so_far(self) -> np.ndarray:
        return self.audio


@dataclass(frozen=True)
class Resume:
    """Speech came back at ``t_ms`` after a ``Pause``; a speculative transcript is stale."""

    t_ms: int


VadEvent = SpeechStart | SpeechEnd | Pause | Resume


def _check(vad: VadConfig, sample_rate: int, max_utterance_s: float) -> None:
    if sample_rate not in SAMPLE_RATES:
        raise ConfigError(f"VAD sample rate must be one of {SAMPLE_RATES} Hz, got {sample_rate}")
    if vad.frame_ms not in FRAME_MS:
        raise ConfigError(f"vad.frame_ms must be 10, 20 or 30, got {vad.frame_ms}")
    if vad.aggressiveness not in (0, 1, 2, 3):
        raise ConfigError(f"vad.aggressiveness must be 0..3, got {vad.aggressiveness}")
    if vad.start_frames < 1:
        raise ConfigError(f"vad.start_frames must be >= 1, got {vad.start_frames}")
    if vad.silence_duration_ms < vad.frame_ms:
        raise ConfigError(
            f"vad.silence_duration_ms must be >= frame_ms ({vad.frame_ms}), "
            f"got {vad.silence_duration_ms}"
        )
    if not 0.0 <= vad.noise_gate_db <= 20.0:
        raise ConfigError(f"vad.noise_gate_db must be 0..20 dB, got {vad.noise_gate_db}")
    if vad.prefix_padding_ms < 0 or vad.speculative_pause_ms < 0:
        raise ConfigError("vad.prefix_padding_ms and vad.speculative_pause_ms must be >= 0")
    if max_utterance_s <= 0:
        raise ConfigError(f"limits.max_utterance_s must be > 0, got {max_utterance_s}")


def _frames(ms: int, frame_ms: int) -> int:
    """Whole frames covering ``ms`` (rounded up)."""
    return -(-ms // frame_ms)


class VoiceActivityDetector:
    """Streaming utterance detector for one audio stream (not thread-safe; one per session).

    ``config`` is a ``VadConfig``; ``sample_rate`` in Hz (8/16/32/48 kHz);
    ``max_utterance_s`` caps one utterance (``LimitsConfig.max_utterance_s``).
    """

    def __init__(
        self, config: VadConfig, sample_rate: int = 16000, max_utterance_s: float = 30.0
    ) -> None:
        _check(config, sample_rate, max_utterance_s)
        self.config = config
        self.sample_rate = sample_rate
        self.frame_ms = config.frame_ms
        self.frame_samples = sample_rate * config.frame_ms // 1000
        self._vad = webrtcvad.Vad(config.aggressiveness)
        self._start_frames = config.start_frames
        self._prefix_frames = _frames(config.prefix_padding_ms, self.frame_ms)
        self._end_frames = _frames(config.silence_duration_ms, self.frame_ms)
        spec = config.speculative_pause_ms
        self._pause_frames = _frames(spec, self.frame_ms) if 0 < spec else 0
        if self._pause_frames >= self._end_frames:
            self._pause_frames = 0  # the turn would end first: no speculation
        self._tail_frames = _frames(TRAILING_MS, self.frame_ms)
        self._max_frames = max(1, int(max_utterance_s * 1000) // self.frame_ms)
        self._warmup_frames = _frames(WARMUP_MS, self.frame_ms)
        self._gate_db = float(config.noise_gate_db)
        self._rise_db = NOISE_RISE_DB_S * self.frame_ms / 1000
        self._noise_gap_frames = _frames(NOISE_GAP_MS, self.frame_ms)
        #: Noise floor, dBFS (None until webrtcvad has called a frame unvoiced).
        self.noise_dbfs: float | None = None
        self._frame_index = 0  # frames processed since construction
        self._consumed = 0  # samples processed or dropped since construction (the clock)
        self._pending = np.zeros(0, dtype=np.int16)
        self.reset()

    @classmethod
    def from_config(cls, cfg: Config, sample_rate: int = 16000) -> "VoiceActivityDetector":
        return cls(cfg.vad, sample_rate=sample_rate, max_utterance_s=cfg.limits.max_utterance_s)

    # --- state ---------------------------------------------------------------

    def reset(self) -> None:
        """Forget any utterance in progress and buffered audio; stream time keeps counting."""
        self._consumed += len(self._pending)
        self._pending = np.zeros(0, dtype=np.int16)
        # Idle: recent frames (prefix + a start run) and how many trailing ones are voiced.
        self._recent: deque[np.ndarray] = deque(maxlen=self._prefix_frames + self._start_frames)
        self._voiced_run = 0
        # Speaking: utterance frames, index (in it) one past the last voiced frame.
        self._utterance: list[np.ndarray] | None = None
        self._speech_end = 0
        self._silence = 0
        self._paused = False

    @property
    def in_speech(self) -> bool:
        """True between ``SpeechStart`` and ``SpeechEnd``."""
        return self._utterance is not None

    @property
    def stream_ms(self) -> float:
        """Milliseconds of audio fed so far (including samples not yet a whole frame)."""
        return (self._consumed + len(self._pending)) * 1000.0 / self.sample_rate

    def utterance_so_far(self) -> np.ndarray | None:
        """The current utterance up to now (int16, incl. prefix padding), or None when idle."""
        if self._utterance is None:
            return None
        return np.concatenate(self._utterance)

    def pause_audio(self) -> np.ndarray | None:
        """The utterance so far cut ``TRAILING_MS`` after its last voiced frame (what a ``Pause``
        carries), or None when idle."""
        return None if self._utterance is None else self._audio(whole=False)

    # --- feeding -------------------------------------------------------------

    def feed(self, pcm16: np.ndarray | bytes) -> list[VadEvent]:
        """Feed int16 mono PCM at ``sample_rate`` (any length); return the events it caused."""
        samples = _as_int16(pcm16)
        if len(self._pending):
            samples = np.concatenate((self._pending, samples))
        n = len(samples) // self.frame_samples * self.frame_samples
        self._pending = samples[n:].copy()
        events: list[VadEvent] = []
        for start in range(0, n, self.frame_samples):
            frame = samples[start : start + self.frame_samples]
            voiced = self._vad.is_speech(frame.tobytes(), self.sample_rate)
            if self._gate_db:
                voiced = self._gate(frame, voiced)
            self._frame_index += 1
            self._consumed += self.frame_samples
            self._step(frame, voiced, events)
        return events

    def _gate(self, frame: np.ndarray, voiced: bool) -> bool:
        """webrtcvad's call, with a voiced frame at the noise floor made silence (see the module doc)."""
        x = frame.astype(np.float32)
        power = float(np.dot(x, x)) / len(x) / (32768.0 * 32768.0)
        energy = 10.0 * np.log10(power) if power > 1e-10 else SILENT_DBFS
        noise = self.noise_dbfs
        if not voiced:
            if self._utterance is None or self._silence + 1 >= self._noise_gap_frames:
                self.noise_dbfs = energy if noise is None or energy < noise else min(energy, noise + self._rise_db)
            return False
        return noise is None or energy >= noise + self._gate_db

    def flush(self) -> list[VadEvent]:
        """End the current utterance now (client commit): ``[SpeechEnd(forced=True)]`` or ``[]``."""
        if self._utterance is None:
            return []
        return [self._finish(forced=True, whole=True)]

    def _t(self, frame_offset: int = 0) -> int:
        """Stream time (ms) of the end of the current frame, shifted by ``frame_offset`` frames."""
        return (self._consumed + frame_offset * self.frame_samples) * 1000 // self.sample_rate

    def _step(self, frame: np.ndarray, voiced: bool, events: list[VadEvent]) -> None:
        if self._utterance is None:
            self._step_idle(frame, voiced, events)
        else:
            self._step_speech(frame, voiced, events)

    def _step_idle(self, frame: np.ndarray, voiced: bool, events: list[VadEvent]) -> None:
        self._recent.append(frame.copy())
        voiced = voiced and self._frame_index > self._warmup_frames
        self._voiced_run = self._voiced_run + 1 if voiced else 0
        if self._voiced_run < self._start_frames:
            return
        self._utterance = list(self._recent)
        self._recent.clear()
        self._voiced_run = 0
        self._speech_end = len(self._utterance)
        self._silence = 0
        self._paused = False
        events.append(SpeechStart(self._t(-self._start_frames)))
        if len(self._utterance) >= self._max_frames:
            events.append(self._finish(forced=True, whole=True))

    def _step_speech(self, frame: np.ndarray, voiced: bool, events: list[VadEvent]) -> None:
        utterance = self._utterance
        assert utterance is not None
        utterance.append(frame.copy())
        if voiced:
            if self._paused:
                events.append(Resume(self._t(-1)))
                self._paused = False
            self._silence = 0
            self._speech_end = len(utterance)
        else:
            self._silence += 1
            if self._silence >= self._end_frames:
                events.append(self._finish(forced=False, whole=False))
                return
            if self._pause_frames and self._silence == self._pause_frames:
                self._paused = True
                events.append(Pause(self._t(-self._silence), self._audio(whole=False)))
        if len(utterance) >= self._max_frames:
            events.append(self._finish(forced=True, whole=True))

    def _audio(self, whole: bool) -> np.ndarray:
        """Utterance samples; unless ``whole``, cut ``TRAILING_MS`` after the last voiced frame."""
        assert self._utterance is not None
        end = len(self._utterance) if whole else self._speech_end + self._tail_frames
        return np.concatenate(self._utterance[:end])

    def _finish(self, forced: bool, whole: bool) -> SpeechEnd:
        audio = self._audio(whole)
        t_ms = self._t() if whole else self._t(-self._silence)
        self._utterance = None
        self._paused = False
        self._silence = 0
        return SpeechEnd(t_ms, audio, forced=forced)


def _as_int16(pcm: np.ndarray | bytes) -> np.ndarray:
    """Validate mono int16 PCM (array or raw little-endian bytes)."""
    if isinstance(pcm, (bytes, bytearray, memoryview)):
        if len(pcm) % 2:
            raise InvalidInput("int16 PCM must have an even number of bytes")
        return np.frombuffer(pcm, dtype="<i2").astype(np.int16, copy=False)
    if not isinstance(pcm, np.ndarray) or pcm.dtype != np.int16 or pcm.ndim != 1:
        got = (f"{pcm.dtype} array of shape {pcm.shape}" if isinstance(pcm, np.ndarray)
               else type(pcm).__name__)
        raise InvalidInput(f"VAD expects 1-D int16 PCM, got {got}")
    return pcm
