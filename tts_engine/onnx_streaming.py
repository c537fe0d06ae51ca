"""Streaming CPU synthesis: the voice's encoder and chunk decoder, exported to ONNX, on onnxruntime.

A sentence runs as one encoder call (ids -> per-frame prior sample ``z_p`` and its frame
count) and then chunk-decoder calls on frame windows (flow + HiFi-GAN, see
``tts_engine/torch_vits/chunked.py``): a small first chunk gives first audio after about
one chunk of work, larger later chunks keep the work spent on context frames low. The
joined chunks equal the whole-sentence audio (at noise 0: up to ~1e-4 of full scale
from Piper's own graph, float rounding of the re-export).

The two ONNX files come from ``tts_engine.torch_vits.export_onnx`` (PyTorch, once per
voice; ``tts_engine.chunked_voice`` caches them): ``encoder.onnx`` and
``chunk_decoder.onnx``, whose metadata gives ``context_frames`` and ``hop_length``.
Only single-speaker voices: the export takes no speaker id.

Units: frames are latent frames of ``hop_length`` samples; audio is float32 in [-1, 1]
at the voice's rate.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tts_engine.onnx_backend import InferenceScales, session_options
from base.errors import ConfigError, ModelError

ENCODER_FILE, DECODER_FILE = "encoder.onnx", "chunk_decoder.onnx"
_TORCH_HINT = (
    "install PyTorch with `pip install -e '.[torch]'` (done by `make venv`) and run `voxloop models`, "
    "or set tts.streaming = false"
)


@dataclass(frozen=True)
class ChunkPlan:
    """How one sentence's frames are cut into decoder chunks."""

    #: Frames of the first chunk (first audio waits for it); 64 frames = 0.74 s at 22050 Hz.
    first_frames: int = 64
    #: Largest later chunk, frames; the rest of the sentence is split in equal chunks up to this.
    tail_frames: int = 512

    def __post_init__(self) -> None:
        if self.first_frames < 1 or self.tail_frames < 1:
            raise ConfigError(f"decoder chunks must be >= 1 frame, got {self.first_frames}/{self.tail_frames}")

    def sizes(self, frames: int) -> list[int]:
        """Chunk sizes, in order, summing to ``frames``.

        Equal later chunks, not ``tail_frames`` plus a remainder: every chunk costs its
        context frames too, so a tiny last chunk would cost nearly as much as a full one.
        """
        if frames <= self.first_frames:
            return [frames]
        rest = frames - self.first_frames
        n = math.ceil(rest / self.tail_frames)
        return [self.first_frames] + [rest // n + (1 if i < rest % n else 0) for i in range(n)]


class _SessionPool:
    """(encoder, decoder) session pairs handed out earliest deadline first.

    A deadline is the monotonic time by which the caller's audio is needed: a new
    sentence's first chunk is needed now, a later chunk when the audio already delivered
    has played. So first chunks overtake the later chunks of sentences that are ahead.
    """

    def __init__(self, pairs: list[tuple[ort.InferenceSession, ort.InferenceSession]]) -> None:
        self._free = list(pairs)
        self._waiting: list[tuple[float, int]] = []  # heap of (deadline, arrival)
        self._arrivals = itertools.count()
        self._cond = threading.Condition()

    @contextmanager
    def take(self, deadline: float) -> Iterator[tuple[ort.InferenceSession, ort.InferenceSession]]:
        with self._cond:
            ticket = (deadline, next(self._arrivals))
            heapq.heappush(self._waiting, ticket)
            try:
                while not (self._free and self._waiting[0] == ticket):
                    self._cond.wait()
            except BaseException:  # interrupted while waiting: leave the line, or it blocks everyone
                self._waiting.remove(ticket)
                heapq.heapify(self._waiting)
                self._cond.notify_all()
                raise
            heapq.heappop(self._waiting)
            pair = self._free.pop()
            if self._free and self._waiting:
                self._cond.notify_all()  # the next ticket in line may take the other free pair
        try:
            yield pair
        finally:
            with self._cond:
                self._free.append(pair)
                self._cond.notify_all()


class ChunkedOnnxVits:
    """A pool of ``workers`` (encoder, chunk decoder) onnxruntime session pairs from ``model_dir``.

    ``stream`` may be called from several threads; each chunk takes a free pair, so with
    more callers than workers the chunks of different sentences interleave (earliest
    deadline first) and a new sentence's first audio does not wait for whole sentences.
    """

    def __init__(self, model_dir: str | Path, *, threads: int = 1, workers: int = 1) -> None:
        self.model_dir = Path(model_dir)
        if workers < 1:
            raise ConfigError(f"tts.onnx_workers must be >= 1, got {workers}")
        pairs = [(self._load(ENCODER_FILE, threads), self._load(DECODER_FILE, threads)) for _ in range(workers)]
        meta = pairs[0][1].get_modelmeta().custom_metadata_map
        try:
            #: Frames of ``z_p`` each window needs on each side of its chunk.
            self.context_frames = int(meta["context_frames"])
            #: Audio samples per frame.
            self.hop_length = int(meta["hop_length"])
        except (KeyError, ValueError):
            raise ModelError(f"{self.model_dir / DECODER_FILE} has no context_frames/hop_length metadata") from None
        self.workers = workers
        self._pool = _SessionPool(pairs)

    def _load(self, name: str, threads: int) -> ort.InferenceSession:
        path = self.model_dir / name
        try:
            return ort.InferenceSession(str(path), sess_options=session_options(threads), providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidProtobuf/NoSuchFile types
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelError(f"cannot load {path} ({reason}); re-export with `voxloop models`") from None

    def stream(
        self, ids: Sequence[int], scales: InferenceScales, plan: ChunkPlan, sample_rate: int
    ) -> Iterator[tuple[np.ndarray, bool]]:
        """Float32 audio of one sentence, chunk by chunk, as ``(audio, is_last)``.

        ``sample_rate`` (Hz) only dates the deadlines of later chunks. Nothing runs until
        the first ``next()``; closing the generator early skips the remaining chunks.
        """
        with self._pool.take(time.monotonic()) as (encoder, decoder):
            z_pad, mask = self._encode(encoder, ids, scales)
            sizes = plan.sizes(z_pad.shape[2] - 2 * self.context_frames)
            audio = self._decode(decoder, z_pad, mask, 0, sizes[0])
        played_from = time.monotonic()  # the listener's clock: audio plays from here
        delivered_s = len(audio) / sample_rate
        yield audio, len(sizes) == 1
        start = sizes[0]
        for k, size in enumerate(sizes[1:], start=2):
            with self._pool.take(played_from + delivered_s) as (_, decoder):
                audio = self._decode(decoder, z_pad, mask, start, size)
            delivered_s += len(audio) / sample_rate
            start += size
            yield audio, k == len(sizes)

    def _encode(
        self, encoder: ort.InferenceSession, ids: Sequence[int], scales: InferenceScales
    ) -> tuple[np.ndarray, np.ndarray]:
        """``z_p`` [1, C, F + 2 * context] with zero context on both sides, and its mask [1, 1, same]."""
        feeds = {
            "ids": np.asarray(ids, dtype=np.int64)[np.newaxis, :],
            "lengths": np.array([len(ids)], dtype=np.int64),
            "scales": scales.as_array()[np.newaxis, :],
        }
        z_p, frames = encoder.run(None, feeds)
        n, c = int(frames[0]), self.context_frames
        z_pad = np.zeros((1, z_p.shape[1], n + 2 * c), dtype=np.float32)
        z_pad[:, :, c : c + n] = z_p[:, :, :n]
        mask = np.zeros((1, 1, n + 2 * c), dtype=np.float32)
        mask[:, :, c : c + n] = 1.0
        return z_pad, mask

    def _decode(
        self, decoder: ort.InferenceSession, z_pad: np.ndarray, mask: np.ndarray, start: int, size: int
    ) -> np.ndarray:
        """Audio of frames ``[start, start + size)``: ``size * hop_length`` float32 samples."""
        window = slice(start, start + size + 2 * self.context_frames)
        feeds = {"z": np.ascontiguousarray(z_pad[:, :, window]), "mask": np.ascontiguousarray(mask[:, :, window])}
        return decoder.run(None, feeds)[0].reshape(-1)


def export_chunked(voice_path: str | Path, out_dir: str | Path) -> None:
    """Write ``encoder.onnx`` and ``chunk_decoder.onnx`` of a single-speaker Piper voice into ``out_dir``.

    Needs PyTorch and onnx (the ``torch`` extra): ModelError with an install hint without
    them. Takes ~10 s of CPU for a "medium" voice. Not atomic: callers export into a
    scratch folder (``tts_engine.chunked_voice`` does).
    """
    import warnings

    try:
        import onnx  # noqa: F401 - the exporter needs it
        import torch

        from tts_engine.torch_vits.export_onnx import export
        from tts_engine.torch_vits.weights import load_vits
    except ImportError as exc:
        raise ModelError(
            f"tts.streaming needs the voice exported once as chunked ONNX, which needs PyTorch and onnx "
            f"({exc}); {_TORCH_HINT}"
        ) from None
    model = load_vits(voice_path)
    if model.config.n_speakers > 1:
        raise ModelError(f"{voice_path}: streaming supports single-speaker voices only; set tts.streaming = false")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer warnings
        export(model, out_dir)
