"""Continuous batching of TTS requests on one GPU stream.

One thread owns the GPU. Each step it (1) drops cancelled requests, freeing their
slots; (2) admits waiting requests into free slots and runs the encoder for all of
them in one launch; (3) decodes the next chunk of up to ``max_slots`` running
requests in one launch, first chunks first (then oldest); (4) waits for the step,
hands each request its chunk. A request is finished after its last chunk.

``submit(ids, scales)`` returns a ``SpeechRequest`` at once: iterate it (from any one
thread) for ``AudioChunk``s; ``cancel()`` (from any thread) ends it at the next step.
The waiting line is bounded: ``submit`` raises ``Overloaded`` when it is full.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from tts_engine.engine import AudioChunk
from tts_engine.torch_vits.runner import EncodeItem, StepRunner, bucket_for
from voxloop.errors import InvalidInput, ModelError, Overloaded

log = logging.getLogger(__name__)

_END = object()


@dataclass(frozen=True)
class Scales:
    """Per-request synthesis knobs (see ``SynthesisOptions``)."""

    noise_scale: float = 0.667
    length_scale: float = 1.0
    noise_w: float = 0.8
    speaker_id: int = 0


@dataclass(eq=False)
class SpeechRequest:
    """Handle of one submitted clause; iterate for its int16 chunks at the voice's rate."""

    ids: tuple[int, ...]
    scales: Scales
    sample_rate: int
    clause_index: int = 0
    #: Monotonic time of ``submit``, s.
    submitted_at: float = field(default_factory=time.monotonic)
    #: Utterance length in frames, once encoded.
    frames: int | None = None
    #: Frames already delivered.
    next_frame: int = 0
    slot: int | None = None
    seq: int = 0
    _chunks: queue.SimpleQueue = field(default_factory=queue.SimpleQueue, repr=False)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    def cancel(self) -> None:
        """Stop this request: its slot is freed at the next step and iteration ends."""
        self._cancelled.set()
        self._chunks.put(_END)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def __iter__(self) -> Iterator[AudioChunk]:
        while True:
            item = self._chunks.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.final:
                return


class BatchScheduler:
    """Owns a ``StepRunner`` and the thread that drives it."""

    def __init__(self, runner: StepRunner, sample_rate: int, queue_size: int = 256) -> None:
        self.runner = runner
        self.sample_rate = sample_rate
        self.max_slots = runner.options.max_slots
        self._inbox: queue.Queue[SpeechRequest] = queue.Queue(maxsize=queue_size)
        self._waiting: list[SpeechRequest] = []
        self._running: dict[int, SpeechRequest] = {}  # slot -> request
        self._free_slots = list(range(self.max_slots))
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        #: Steps run and their wall time, s (for the benchmark's breakdown).
        self.steps = 0
        self.step_s = 0.0
        self._thread = threading.Thread(target=self._loop, name="tts-gpu-scheduler", daemon=True)
        self._thread.start()

    def submit(self, ids: Sequence[int], scales: Scales | None = None, clause_index: int = 0) -> SpeechRequest:
        """Queue one clause; Overloaded when the waiting line is full, InvalidInput when too long."""
        if self._error is not None:
            raise ModelError(f"TTS scheduler stopped: {self._error}")
        if not ids:
            raise InvalidInput("phoneme_ids is empty")
        longest = max(self.runner.options.phoneme_buckets)
        if len(ids) > longest:
            raise InvalidInput(f"clause of {len(ids)} phoneme ids exceeds the GPU engine's limit of {longest}")
        request = SpeechRequest(tuple(int(i) for i in ids), scales or Scales(), self.sample_rate, clause_index)
        request.seq = next(self._seq)
        try:
            self._inbox.put_nowait(request)
        except queue.Full:
            raise Overloaded("TTS queue is full", retry_after_ms=200) from None
        return request

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread; unfinished requests end (their iterators stop)."""
        self._stop.set()
        self._thread.join(timeout_s)

    @property
    def in_flight(self) -> int:
        return len(self._running) + len(self._waiting) + self._inbox.qsize()

    # ---------------------------------------------------------------- the loop

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._fill():
                    continue
                t0 = time.perf_counter()
                self._step()
                self.steps += 1
                self.step_s += time.perf_counter() - t0
        except BaseException as exc:  # the GPU failed: every request must learn it
            log.exception("TTS scheduler failed")
            self._error = exc
            self._fail_all(ModelError(f"TTS GPU step failed: {exc}"))
        else:
            self._fail_all(None)

    def _fill(self) -> bool:
        """Drop cancelled requests, then take as many submissions as there are free slots.

        Blocks briefly when idle. The rest stays in the bounded inbox, so ``queue_size``
        bounds everything that waits. True when there is work for a step.
        """
        self._waiting = [r for r in self._waiting if not r.cancelled]
        for request in [r for r in self._running.values() if r.cancelled]:
            self._release(request)
        if not self._running and not self._waiting:
            try:
                self._waiting.append(self._inbox.get(timeout=0.05))
            except queue.Empty:
                return False
        while len(self._waiting) < len(self._free_slots):
            try:
                self._waiting.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        self._waiting = [r for r in self._waiting if not r.cancelled]
        return bool(self._running or self._waiting)

    def _step(self) -> None:
        admitted = self._admit()
        frames_dev = self.runner.encode([self._encode_item(r) for r in admitted]) if admitted else None
        options = self.runner.options
        groups: dict[int, list[SpeechRequest]] = {}
        for r in sorted(self._running.values(), key=lambda r: (r.next_frame > 0, r.seq)):
            size = options.chunk_frames if r.next_frame == 0 else options.next_chunk(r.next_frame, r.frames or 0)
            groups.setdefault(size, []).append(r)
        # First chunks first: their group is decoded, fetched and handed out before the rest.
        first = [size for size, batch in groups.items() if batch[0].next_frame == 0]
        launched: list[tuple[int, list[SpeechRequest], object]] = []
        for size in first + sorted(set(groups) - set(first)):
            batch = groups[size]
            launched.append((size, batch, self.runner.decode([r.slot for r in batch], [r.next_frame for r in batch], size)))
            if size in first:
                self._finish(launched, frames_dev, admitted)
                launched, frames_dev = [], None
        if launched:
            self._finish(launched, frames_dev, admitted)

    def _finish(self, launched: list, frames_dev: object, admitted: list[SpeechRequest]) -> None:
        """Wait for the launched decodes (and the encoder's frame counts), then hand out the chunks."""
        results = self.runner.fetch(*[audio for _, _, audio in launched], *([frames_dev] if frames_dev is not None else []))
        if frames_dev is not None:
            for request, frames in zip(admitted, results[-1]):
                self._set_frames(request, int(frames))
        for (size, batch, _), audio in zip(launched, results):
            self._deliver(batch, audio, size)

    def _admit(self) -> list[SpeechRequest]:
        admitted: list[SpeechRequest] = []
        longest = 0
        while self._waiting and self._free_slots:
            request = self._waiting[0]
            longest_if = max(longest, len(request.ids))
            if len(admitted) + 1 > self.runner.max_encode_batch(longest_if):
                break
            longest = longest_if
            self._waiting.pop(0)
            request.slot = self._free_slots.pop()
            self._running[request.slot] = request
            admitted.append(request)
        return admitted

    @staticmethod
    def _encode_item(r: SpeechRequest) -> EncodeItem:
        s = r.scales
        return EncodeItem(r.ids, r.slot, s.noise_scale, s.length_scale, s.noise_w, s.speaker_id)  # type: ignore[arg-type]

    def _set_frames(self, request: SpeechRequest, frames: int) -> None:
        cap = self.runner.options.max_frames
        if frames > cap:
            log.warning("utterance of %d frames cut to tts max_frames=%d", frames, cap)
        request.frames = min(frames, cap)

    def _deliver(self, batch: list[SpeechRequest], audio: np.ndarray, chunk: int) -> None:
        hop = self.runner.geometry.hop_length
        for row, request in zip(audio, batch):
            assert request.frames is not None
            n = min(chunk, request.frames - request.next_frame)
            request.next_frame += n
            final = request.next_frame >= request.frames
            pcm = row[: n * hop].copy()
            request._chunks.put(AudioChunk(pcm, request.sample_rate, request.clause_index, final))
            if final:
                self._release(request)

    def _release(self, request: SpeechRequest) -> None:
        if request.slot is not None and self._running.get(request.slot) is request:
            del self._running[request.slot]
            self._free_slots.append(request.slot)

    def _fail_all(self, error: BaseException | None) -> None:
        pending = [*self._running.values(), *self._waiting]
        while True:
            try:
                pending.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for request in pending:
            request._chunks.put(error if error is not None else _END)
        self._running.clear()
        self._waiting.clear()


__all__ = ["BatchScheduler", "Scales", "SpeechRequest", "bucket_for"]
