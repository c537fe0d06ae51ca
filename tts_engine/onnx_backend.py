"""Piper VITS inference with onnxruntime on CPU, plus the audio post-processing steps.

``OnnxVits.infer(ids, scales, speaker_id)`` runs the exported model: inputs ``input``
[1, T] int64 phoneme ids, ``input_lengths`` [1] int64, ``scales`` [3] float32
(noise_scale, length_scale, noise_w), ``sid`` [1] int64 for multi-speaker voices;
output float32 audio in [-1, 1] at the voice's rate.

``to_int16`` converts like Piper (clip to ±32767, truncate); resampling is
``tts_engine.resample.StreamResampler`` (re-exported here).
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tts_engine.resample import StreamResampler  # noqa: F401 - re-exported
from base.errors import ConfigError, ModelError

log = logging.getLogger(__name__)

_MAX_WAV_VALUE = 32767.0
_INPUTS = ("input", "input_lengths", "scales")
#: Inputs longer than this many phoneme ids give back onnxruntime's arena growth after their run.
#: It is the longest sentence the text frontend makes (``MAX_SENTENCE_PHONEMES`` = 400: BOS, pad, a pad
#: after each phoneme, EOS), and ``OnnxVits.reserve_arena`` sizes each session's arena for it at
#: load (bundled voice: 513 MB of regions, grown in power-of-two steps up to 256 MB; a 200-character
#: LLM clause of ~460 ids uses about 250 MB of it). Only raw id input can be longer; giving its
#: growth back frees the reserved regions too, and the arena grows again as clauses come.
#: Shrinking after every run would cost about 13 % more CPU per clause.
SHRINK_ARENA_ABOVE_IDS = 803
_SHRINK_ARENA = ort.RunOptions()
_SHRINK_ARENA.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")


@dataclass(frozen=True)
class InferenceScales:
    """The model's three noise/length knobs, in the order of its ``scales`` input."""

    #: Prior variance; 0 is deterministic.
    noise_scale: float
    #: Phoneme duration multiplier; >1 is slower.
    length_scale: float
    #: Duration-predictor noise; 0 is deterministic.
    noise_w: float

    def as_array(self) -> np.ndarray:
        return np.array([self.noise_scale, self.length_scale, self.noise_w], dtype=np.float32)


def session_options(threads: int) -> ort.SessionOptions:
    """CPU session options: ``threads`` intra-op threads (0 lets onnxruntime choose), sequential graph,
    no memory pattern.

    A memory pattern is planned per input shape, and every clause has a new length: each run asked
    the arena for one block holding all its activations, kept one more pattern, and when that block
    did not fit the arena's free space the arena took a new region twice the size of its last one
    (a one-hour soak: +256 MB after 10 minutes). Without the pattern each tensor takes a chunk of
    its own and reuses the freed ones: 100 clauses of 40-450 ids settle at the size of the longest
    (the pattern's arena grew 36 MB over the same clauses, 178 MB more when started at the longest).
    """
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(0, threads)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.enable_mem_pattern = False
    return opts


class OnnxVits:
    """A pool of ``workers`` onnxruntime sessions over one Piper ``.onnx`` file.

    ``infer`` may be called from several threads; each call takes a free session, so
    up to ``workers`` clauses run in parallel (two 1-thread sessions beat one 2-thread
    session on throughput on a 2-core CPU).
    """

    def __init__(self, model_path: str | Path, *, threads: int = 1, workers: int = 1) -> None:
        self.model_path = Path(model_path)
        if workers < 1:
            raise ConfigError(f"tts.onnx_workers must be >= 1, got {workers}")
        sessions = [self._load(threads) for _ in range(workers)]
        self._free: queue.Queue[ort.InferenceSession] = queue.Queue()
        for session in sessions:
            self._free.put(session)
        names = {i.name for i in sessions[0].get_inputs()}
        missing = [n for n in _INPUTS if n not in names]
        if missing:
            raise ModelError(f"voice model {self.model_path} is not a Piper VITS export: no input {missing[0]!r}")
        #: True when the model takes a speaker id (multi-speaker voice).
        self.takes_speaker_id = "sid" in names
        self.workers = workers

    def _load(self, threads: int) -> ort.InferenceSession:
        try:
            return ort.InferenceSession(
                str(self.model_path), sess_options=session_options(threads), providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidProtobuf/NoSuchFile types
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelError(f"cannot load voice model {self.model_path} (truncated or not ONNX?): {reason}") from None

    @contextmanager
    def _session(self) -> Iterator[ort.InferenceSession]:
        session = self._free.get()
        try:
            yield session
        finally:
            self._free.put(session)

    def infer(self, ids: Sequence[int], scales: InferenceScales, speaker_id: int | None = None) -> np.ndarray:
        """Float32 mono audio for one id sequence (one sentence), at the voice's rate."""
        run_options = _SHRINK_ARENA if len(ids) > SHRINK_ARENA_ABOVE_IDS else None
        with self._session() as session:
            audio = session.run(None, self._feeds(ids, scales, speaker_id), run_options)[0]
        return audio.reshape(-1)

    def _feeds(self, ids: Sequence[int], scales: InferenceScales, speaker_id: int | None) -> dict[str, np.ndarray]:
        feeds = {
            "input": np.asarray(ids, dtype=np.int64)[np.newaxis, :],
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": scales.as_array(),
        }
        if self.takes_speaker_id:
            feeds["sid"] = np.array([speaker_id or 0], dtype=np.int64)
        return feeds

    def reserve_arena(self, ids: Sequence[int], scales: InferenceScales) -> None:
        """Run every session once on ``ids`` tiled to ``SHRINK_ARENA_ABOVE_IDS`` ids: each arena then
        holds what the longest input it keeps needs, at start, instead of growing under load."""
        longest = (list(ids) * (SHRINK_ARENA_ABOVE_IDS // max(1, len(ids)) + 1))[:SHRINK_ARENA_ABOVE_IDS]
        sessions = [self._free.get() for _ in range(self.workers)]
        try:
            for session in sessions:
                session.run(None, self._feeds(longest, scales, None))
        finally:
            for session in sessions:
                self._free.put(session)


def to_int16(audio: np.ndarray) -> np.ndarray:
    """Float32 in [-1, 1] -> int16, clipped to ±32767 and truncated exactly like Piper."""
    audio = np.asarray(audio, dtype=np.float32)
    return np.clip(audio * _MAX_WAV_VALUE, -_MAX_WAV_VALUE, _MAX_WAV_VALUE).astype(np.int16)


