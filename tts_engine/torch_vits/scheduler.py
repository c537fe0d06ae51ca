"""Continuous batching of TTS requests on one GPU stream.

One thread owns the GPU. Each step it (1) drops cancelled requests, freeing their
slots; (2) *starts new requests*: admits waiting requests into free slots, runs the encoder
for all of them in one launch and their first chunks, on the runner's fast lane, and hands
those chunks out at once; (3) queues the next ``chunks_per_step`` chunks (0: all that are left)
of every running request whose length is known on the main lane (a row per (request, start
frame); one launch per chunk size and ``max_batch`` rows; a new request's length is copied to the
host right behind its encoder, so its later chunks are queued once its encoder is done, while its
first chunk still decodes, and handed out after it), and **while the GPU runs them**
starts every request that arrives meanwhile as in (2) on a free fast lane (a high-priority
stream on CUDA; ``fast_lanes`` of them), so a new request's first audio does not wait for the
long chunks of the others; (4) hands out the main lane's chunks. A request is finished after its last chunk.
A slot is freed only between steps, so the two lanes never share one. With ``main_in_flight`` > 1,
chunks that become ready during (3) are queued behind the running main launch at once (up to that
many launches, each with its own event and staged buffers) and a step ends when the oldest is
handed out; a request keeps its slot while any launch in flight holds its rows.

Decoding ahead (``RunnerOptions.speculate_frames``, while at most ``speculate_below`` requests run):
the main lane's launch of the step also decodes new requests' chunks after their first, behind a
CUDA event after their encoder, before their length is known; rows past a request's end are
dropped. The one exception to the rule above: a request that ends with its first chunk frees its
slot while such rows may still read it; a new request may take the slot at once, and those rows
(of the ended request) are dropped.

``submit(ids, scales)`` returns a ``SpeechRequest`` at once: iterate it (from any one
thread) for ``AudioChunk``s; ``cancel()`` (from any thread) ends it at the next step.
The waiting line is bounded: ``submit`` raises ``Overloaded`` when it is full. A launch's chunks
reach the iterating threads once all its rows are copied out, not row by row: a thread woken
per row took the interpreter lock back from the scheduler between the copies of the next rows,
and the GPU stood idle while the hand-out dragged on (``bench.tts_gpu_model``, 50 clients: the
modeled GPU idle 5.6-7.0 % of the time before, 0.6-1.0 % after; docs/benchmarks.md).

Delivery in bulk: a request submitted with a ``sink`` is not iterated; instead, each sink is
called (on the scheduler thread) once per fast-lane launch with its first chunks, as soon as
they are decoded, and once with the main lane's chunks — with every outcome made for its
requests since the last call:
``[(request, AudioChunk | BaseException | None), ...]`` in order, where an
exception ends the request with that error and None ends it without one (scheduler closed).
A server hands a whole step to its event loop with one wake-up this way, instead of one
thread and one hand-off per chunk. A sink must be quick and must not raise.

Out of GPU memory (``torch.OutOfMemoryError`` in a launch, or ``inject_oom`` in tests):
the largest batch (``max_batch``) drops to the largest decode bucket <= half the
failed launch's padded batch, so repeated failures reach 1 in log2 steps. The step's
requests keep their state and go on: decodes only read their slot and advance
``next_frame`` on delivery; requests not yet encoded are re-queued. Only the requests
of a failed launch of batch 1 (nothing smaller to try) end, with
``Overloaded(retry_after_ms=oom_retry_after_ms)`` from their iterator. After
``regrow_steps`` steps without failure the limit doubles (to the next bucket at most
twice as large), up to ``max_slots``; both changes are logged. With CUDA graphs a
lower limit just means smaller captured buckets.
"""

from __future__ import annotations

import collections
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple
from dataclasses import dataclass, field

import numpy as np
import torch

from tts_engine.engine import AudioChunk
from tts_engine.torch_vits.buffers import HostBufferPool
from tts_engine.torch_vits.runner import EncodeItem, StepRunner, bucket_for
from base.errors import InvalidInput, ModelError, Overloaded

log = logging.getLogger(__name__)

_END = object()
#: While the main lane runs, how long the scheduler waits for an arrival between looks at the GPU, s.
POLL_S = 0.0002

#: Receives one step's outcomes for its requests: ``(request, AudioChunk | BaseException | None)``.
Sink = Callable[[list[tuple["SpeechRequest", object]]], None]


class _FastLaunch(NamedTuple):
    """A fast-lane launch in flight: its requests, their batches of first chunks, the host arrays the
    chunks are copied to, when it was queued, the utterance lengths (host, copied right behind the
    encoder) and the event behind that copy (``runner.mark``)."""

    admitted: list["SpeechRequest"]
    batches: list[list["SpeechRequest"]]
    results: list[np.ndarray]
    t0: float
    lengths: np.ndarray
    encoded: object


class _MainLaunch(NamedTuple):
    """A main-lane launch in flight: per chunk size ``(frames, requests, device audio, start frames)``,
    the host arrays its audio is copied to, when it was queued, the event behind it (``runner.mark``)
    and its staged host buffers (``runner.take_staged``, given back once it is done)."""

    launched: list[tuple[int, list["SpeechRequest"], object, list[int]]]
    results: list[np.ndarray]
    t0: float
    event: object
    blocks: list


@dataclass(frozen=True)
class Scales:
    """Per-request synthesis knobs (see ``SynthesisOptions``)."""

    noise_scale: float = 0.667
    length_scale: float = 1.0
    noise_w: float = 0.8
    speaker_id: int = 0


@dataclass(eq=False)
class SpeechRequest:
    """Handle of one submitted clause; iterate for its int16 chunks at ``sample_rate`` (the runner's)."""

    #: Phoneme ids, int64 (the scheduler's own copy).
    ids: np.ndarray
    scales: Scales
    sample_rate: int
    clause_index: int = 0
    #: Monotonic time of ``submit``, s.
    submitted_at: float = field(default_factory=time.monotonic)
    #: Utterance length in frames, once encoded.
    frames: int | None = None
    #: Frames already delivered.
    next_frame: int = 0
    #: Frames whose chunks are queued on the main lane (delivered or not).
    queued_frame: int = 0
    #: ``flow_once``: the flow of the rest of its utterance is queued on the main lane.
    flowed: bool = False
    slot: int | None = None
    seq: int = 0
    #: int16 samples of the whole utterance (pooled), filled chunk by chunk; None once finished.
    audio: np.ndarray | None = field(default=None, repr=False)
    #: Where its outcomes go in bulk (see the module docstring); None: iterate the request.
    sink: Sink | None = field(default=None, repr=False)
    _chunks: queue.SimpleQueue = field(default_factory=queue.SimpleQueue, repr=False)
    #: Set once by ``cancel`` (any thread; one attribute store, atomic under the GIL), read by the scheduler.
    _cancelled: bool = field(default=False, repr=False)

    def cancel(self) -> None:
        """Stop this request: iteration ends, nothing more is handed out for it (not even chunks of a
        launch already running), and its slot is freed at the next step."""
        self._cancelled = True
        self._chunks.put(_END)

    @property
    def cancelled(self) -> bool:
        return self._cancelled

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

    def __init__(
        self,
        runner: StepRunner,
        sample_rate: int,
        queue_size: int = 256,
        *,
        oom_retry_after_ms: int = 2000,
        regrow_steps: int = 32,
        audio_pool: HostBufferPool | None = None,
    ) -> None:
        """``oom_retry_after_ms``: hint, ms, in the ``Overloaded`` of requests failed by an OOM;
        ``regrow_steps``: steps without OOM before the batch limit doubles; ``audio_pool``: where
        each request's audio lives (None: a 256 MiB pool)."""
        self.runner = runner
        self.audio_pool = audio_pool or HostBufferPool(pinned=False)
        self.sample_rate = sample_rate
        self.max_slots = runner.options.max_slots
        self.oom_retry_after_ms = oom_retry_after_ms
        self.regrow_steps = regrow_steps
        #: Test hook, called (on the scheduler thread) with each launch's padded batch before it
        #: runs; raising ``torch.OutOfMemoryError`` simulates an OOM. See ``inject_oom``.
        self.fault: Callable[[int], None] | None = None
        #: OOMs survived.
        self.ooms = 0
        self._max_batch = self.max_slots
        self._ok_steps = 0
        self._attempt: list[SpeechRequest] = []  # requests of the launch in progress
        self._attempt_batch = 0  # its padded batch
        self._inbox: queue.Queue[SpeechRequest] = queue.Queue(maxsize=queue_size)
        self._waiting: list[SpeechRequest] = []
        self._running: dict[int, SpeechRequest] = {}  # slot -> request
        self._free_slots = list(range(self.max_slots))
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._outcomes: list[tuple[SpeechRequest, object]] = []  # this step's, until _flush
        #: Per fast lane, its launch in flight.
        self._fast: dict[str, _FastLaunch] = {}
        #: New requests to decode ahead (``speculate_frames``), each with the event behind its encoder.
        self._ahead: list[tuple[SpeechRequest, object]] = []
        #: Main-lane launches in flight, oldest first (more than one with ``main_in_flight`` > 1).
        self._mains: collections.deque[_MainLaunch] = collections.deque()
        #: Per lane: launches completed and their time from launch to hand-out, s (bench breakdown).
        self.lane_launches = dict.fromkeys(runner.lanes, 0)
        self.lane_s = dict.fromkeys(runner.lanes, 0.0)
        #: Launches counted when queued (bench breakdown): per kind ("encode", "decode") launches, rows
        #: (requests / chunk rows) and rows of the captured buckets they ran in; the encoder's phoneme ids
        #: and ids of its (batch, length) bucket; the decoder's frames in its buckets (rows x chunk frames)
        #: and frames handed out (the rest: padding rows, chunk tails past an utterance's end, rows dropped);
        #: ``flow_once``'s packed flow launches, their frames and the utterance frames among them.
        self.launch_stats = dict.fromkeys(
            ("encode_launches", "encode_rows", "encode_padded_rows", "encode_ids", "encode_padded_ids",
             "decode_launches", "decode_rows", "decode_padded_rows", "decode_padded_frames", "decode_frames_out",
             "flow_launches", "flow_frames", "flow_frames_used"), 0)  # fmt: skip
        #: Steps run and their wall time, s (for the benchmark's breakdown).
        self.steps = 0
        self.step_s = 0.0
        self._thread = threading.Thread(target=self._loop, name="tts-gpu-scheduler", daemon=True)
        self._thread.start()

    def submit(
        self, ids: Sequence[int], scales: Scales | None = None, clause_index: int = 0, sink: Sink | None = None
    ) -> SpeechRequest:
        """Queue one clause; Overloaded when the waiting line is full, InvalidInput when too long.
        ``sink``: deliver its chunks in bulk there instead of through iteration."""
        if self._error is not None:
            raise ModelError(f"TTS scheduler stopped: {self._error}")
        if not len(ids):
            raise InvalidInput("phoneme_ids is empty")
        longest = max(self.runner.options.phoneme_buckets)
        if len(ids) > longest:
            raise InvalidInput(f"clause of {len(ids)} phoneme ids exceeds the GPU engine's limit of {longest}")
        array = np.array(ids, dtype=np.int64)  # a copy: the caller's list or array stays the caller's
        if array.ndim != 1:
            raise InvalidInput(f"phoneme_ids must be one sequence of ids, got shape {array.shape}")
        request = SpeechRequest(array, scales or Scales(), self.sample_rate, clause_index, sink=sink)
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
    def max_batch(self) -> int:
        """Current largest batch of one launch (``max_slots`` unless lowered by an OOM)."""
        return self._max_batch

    def inject_oom(self, above: int | None) -> None:
        """Test hook: every launch whose padded batch exceeds ``above`` raises an OOM; None lifts it."""

        def fault(batch: int) -> None:
            if batch > above:  # type: ignore[operator]
                raise torch.OutOfMemoryError(f"injected OOM at batch {batch} (limit {above})")

        self.fault = None if above is None else fault

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
                try:
                    self._step()
                except torch.OutOfMemoryError as exc:
                    self._on_oom(exc)
                    continue
                finally:
                    self._flush()
                self.steps += 1
                self.step_s += time.perf_counter() - t0
                self._maybe_regrow()
        except BaseException as exc:  # the GPU failed: every request must learn it
            log.exception("TTS scheduler failed")
            self._error = exc
            self._fail_all(ModelError(f"TTS GPU step failed: {exc}"))
        else:
            self._fail_all(None)

    def _post(self, request: SpeechRequest, outcome: object) -> None:
        """An outcome for ``request``, held until ``_flush``."""
        self._outcomes.append((request, outcome))

    def _flush(self) -> None:
        """Hand out what this step made: into each request's queue, or one call of each sink with its requests'."""
        if not self._outcomes:
            return
        by_sink: dict[Sink, list[tuple[SpeechRequest, object]]] = {}  # equal sinks (bound methods) share a call
        for request, outcome in self._outcomes:
            if request.sink is None:
                request._chunks.put(_END if outcome is None else outcome)
            else:
                by_sink.setdefault(request.sink, []).append((request, outcome))
        self._outcomes = []
        for sink, outcomes in by_sink.items():
            try:
                sink(outcomes)
            except Exception:  # a broken consumer must not stop the GPU for everyone
                log.exception("TTS sink failed; its requests are cancelled")
                for request, _ in outcomes:
                    request.cancel()

    def _fill(self) -> bool:
        """Drop cancelled requests, then take as many submissions as there are free slots.

        Blocks briefly when idle. The rest stays in the bounded inbox, so ``queue_size``
        bounds everything that waits. True when there is work for a step.
        """
        self._waiting = [r for r in self._waiting if not r.cancelled]
        in_flight = self._on_fast_lanes()  # their slots are written now
        in_flight |= {r for main in self._mains for _, batch, _, _ in main.launched for r in batch}  # or read
        for request in [r for r in self._running.values() if r.cancelled and r not in in_flight]:
            self._release(request)
        if not self._running and not self._waiting:
            try:
                self._waiting.append(self._inbox.get(timeout=0.05))
            except queue.Empty:
                return False
        self._take_inbox()
        return bool(self._running or self._waiting)

    def _take_inbox(self) -> None:
        """Move submissions from the inbox while free slots can take them; drop cancelled ones."""
        while len(self._waiting) < len(self._free_slots):
            try:
                self._waiting.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        self._waiting = [r for r in self._waiting if not r.cancelled]

    def _launching(self, batch: list[SpeechRequest], buckets: Sequence[int], chunk: int = 0) -> None:
        """Note the launch about to run (for ``_on_oom``), count it in ``launch_stats`` and call the
        fault hook. ``chunk``: frames per row of a decoder launch; 0: an encoder launch."""
        self._attempt, self._attempt_batch = batch, bucket_for(len(batch), buckets)
        stats, kind = self.launch_stats, "decode" if chunk else "encode"
        stats[f"{kind}_launches"] += 1
        stats[f"{kind}_rows"] += len(batch)
        stats[f"{kind}_padded_rows"] += self._attempt_batch
        if chunk:
            stats["decode_padded_frames"] += self._attempt_batch * chunk
        else:
            longest = bucket_for(max(len(r.ids) for r in batch), self.runner.options.phoneme_buckets)
            stats["encode_ids"] += sum(len(r.ids) for r in batch)
            stats["encode_padded_ids"] += self._attempt_batch * longest
        if self.fault is not None:
            self.fault(self._attempt_batch)

    def _step(self) -> None:
        """Start new requests on the fast lane and queue the later chunks of the others on the main
        lane as soon as it is free; until the main lane's launch is done, hand out finished
        fast-lane work and start what arrives meanwhile. Neither lane waits for the other
        (``fast_lane = "exclusive"``: the main lane's launch waits for a fast-lane launch in flight;
        the fast lane may start at the step's start and while the main launch runs, not while
        later chunks wait for it)."""
        exclusive = self.runner.options.fast_lane == "exclusive"
        room = self.runner.options.main_in_flight
        first = True
        while True:
            # exclusive: the fast lane starts once at the step's start; while later chunks then wait
            # for it, it starts nothing more (neither lane can starve the other)
            hold_fast = exclusive and not self._mains and not first
            progressed = self._fast_lane(start=not hold_fast)
            # Later chunks become ready only at the step's start or as first chunks come out: look
            # for them then, not on every poll.
            if len(self._mains) < room and (first or progressed) and not (exclusive and self._fast):
                main = self._launch_main()  # later chunks, also of requests whose first just came out
                if main is not None:
                    self._mains.append(main)
                    progressed = True
            first = False
            if self._mains and self.runner.done(self._mains[0].event):
                self._finish_main(self._mains.popleft())
                return
            if not self._mains and not self._fast:
                return
            if not progressed:
                self._arrivals(POLL_S)

    def _launch_main(self) -> _MainLaunch | None:
        """Queue the later chunks of every running request past its first (main lane): its next
        ``chunks_per_step`` chunks (0: all it has left), one row per (request, start frame) and one
        launch per chunk size; and the chunks ahead of new requests (``_launch_ahead``). None if none."""
        options, limit = self.runner.options, self._max_batch
        groups: dict[int, list[tuple[SpeechRequest, int]]] = {}
        for r in sorted(self._running.values(), key=lambda r: r.seq):
            if r.cancelled or r.frames is None:  # length not known yet: its encoder is still running
                continue
            start = max(r.next_frame, r.queued_frame)  # chunks of launches still in flight are not queued again
            for _ in itertools.repeat(None) if options.chunks_per_step == 0 else range(options.chunks_per_step):
                if start >= r.frames:
                    break
                size = options.next_chunk(start, r.frames)
                groups.setdefault(size, []).append((r, start))
                start += min(size, r.frames - start)
            r.queued_frame = start
        if options.flow_once:  # the flow of each request's rest, once, ahead of its first main-lane chunk
            firsts: dict[SpeechRequest, int] = {}
            for rows in groups.values():
                for r, start in rows:
                    if not r.flowed:
                        firsts[r] = min(start, firsts.get(r, start))
            if firsts:
                launches, frames, used = self.runner.flow([(r.slot, start, r.frames) for r, start in firsts.items()])
                for r in firsts:
                    r.flowed = True
                self.launch_stats["flow_launches"] += launches
                self.launch_stats["flow_frames"] += frames
                self.launch_stats["flow_frames_used"] += used
        #: (chunk frames, requests, device audio, start frame of each row)
        launched: list[tuple[int, list[SpeechRequest], object, list[int]]] = []
        for size in sorted(groups):
            for i in range(0, len(groups[size]), limit):
                rows = groups[size][i : i + limit]
                batch, starts = [r for r, _ in rows], [start for _, start in rows]
                self._launching(batch, options.decode_batches, size)
                launched.append((size, batch, self.runner.decode([r.slot for r in batch], starts, size, lane="main"),
                                 starts))  # fmt: skip
        launched += self._launch_ahead()
        if not launched:
            return None
        results = self.runner.fetch_async(*[audio for _, _, audio, _ in launched], lane="main")
        return _MainLaunch(launched, results, time.perf_counter(), self.runner.mark("main"),
                           self.runner.take_staged("main"))  # fmt: skip

    def _launch_ahead(self) -> list[tuple]:
        """Chunks of the largest size after the first chunk of new requests whose encoder is queued
        but not handed out (``speculate_frames``): one main-lane launch, a row per (request, start),
        that waits on the GPU for their encoders, not for the host to learn their lengths."""
        options = self.runner.options
        ahead = [(r, e) for r, e in self._ahead if r.frames is None and r.slot is not None and not r.cancelled]
        self._ahead = []
        if not ahead:  # entries exist only with speculate_frames > 0: at least one start below
            return []
        size = options.chunk_sizes[-1]
        starts = range(options.chunk_frames, options.chunk_frames + options.speculate_frames, size)
        ahead = ahead[: self._max_batch // len(starts)]
        if not ahead:  # max_batch (lowered by an OOM) holds fewer rows than one request needs
            return []
        batch = [r for _ in starts for r, _ in ahead]  # each request's rows in order of start
        for r, _ in ahead:
            r.queued_frame = starts[-1] + size
        row_starts = [start for start in starts for _ in ahead]
        events = list({id(e): e for _, e in ahead}.values())
        self._launching(batch, options.decode_batches, size)
        audio = self.runner.decode([r.slot for r in batch], row_starts, size, lane="main", after=events, ahead=True)
        return [(size, batch, audio, row_starts)]

    def _finish_main(self, main: _MainLaunch) -> None:
        """Hand out a main launch's rows (once it is done), then its staged buffers."""
        self.runner.wait_event(main.event)
        self.lane_s["main"] += time.perf_counter() - main.t0
        self.lane_launches["main"] += 1
        launched = main.launched
        first_pending = self._on_fast_lanes()
        if any(r in first_pending for _, batch, _, _ in launched for r in batch):
            self._finish_fast(wait=True)  # rows of requests whose first chunk is still on a fast lane: it comes first
        # Each request's rows in order of start frame (one request's rows may be in launches of several sizes).
        rows = sorted(((start, size, request, row) for (size, batch, _, starts), audio in zip(launched, main.results)
                       for request, start, row in zip(batch, starts, audio)), key=lambda x: x[0])  # fmt: skip
        for start, size, request, row in rows:
            self._deliver_row(request, row, size, start)
        self.runner.give_staged(main.blocks)
        self._flush()

    def _fast_lane(self, start: bool = True) -> bool:
        """Hand out the fast lanes' finished launches; on each free fast lane (if ``start``),
        launch waiting requests. True if it did either."""
        did = self._finish_fast()
        did = self._learn_lengths() or did
        for lane in self.runner.fast_lanes if start else ():
            if lane in self._fast:
                continue
            admitted = self._admit()
            if not admitted:
                break
            options = self.runner.options
            self._launching(admitted, options.encode_batches)
            frames_dev = self.runner.encode([self._encode_item(r) for r in admitted], lane=lane)
            # The lengths come to the host right behind the encoder, before the first chunks: once that
            # copy is done the main lane may queue the later chunks (``_learn_lengths``).
            (lengths,) = self.runner.fetch_async(frames_dev, lane=lane)
            encoded = self.runner.mark(lane)
            if 0 < options.speculate_frames and len(self._running) <= options.speculate_below:
                self._ahead += [(r, encoded) for r in admitted]  # chunks ahead need only the encoder
            batches = [admitted[i : i + self._max_batch] for i in range(0, len(admitted), self._max_batch)]
            launched = []
            for batch in batches:
                self._launching(batch, options.decode_batches, options.chunk_frames)
                launched.append(self.runner.decode([r.slot for r in batch], [0] * len(batch), options.chunk_frames,
                                                   lane=lane))  # fmt: skip
            results = self.runner.fetch_async(*launched, lane=lane)
            for r in admitted:
                r.queued_frame = options.chunk_frames  # the first chunk is queued here
            self._fast[lane] = _FastLaunch(admitted, batches, results, time.perf_counter(), lengths, encoded)
            self._finish_fast()  # done already on CPU
            did = True
        return did

    def _finish_fast(self, wait: bool = False) -> bool:
        """For each fast lane whose launch is done (``wait``: every one, once done): set the frame
        counts, hand out the first chunks."""
        done = [lane for lane in self._fast if wait or not self.runner.busy(lane)]
        for lane in done:
            launch = self._fast.pop(lane)
            self.runner.wait(lane)
            self.lane_s[lane] += time.perf_counter() - launch.t0
            self.lane_launches[lane] += 1
            self._take_lengths(launch)
            size = self.runner.options.chunk_frames
            for batch, chunk in zip(launch.batches, launch.results):
                self._deliver(batch, chunk, size)
            self.runner.release_staged(lane)
        if done:
            self._flush()  # first chunks leave now, whatever the main lane is doing
        return bool(done)

    def _learn_lengths(self) -> bool:
        """Requests of fast launches still in flight whose encoder (and the copy of their lengths) is
        done learn their lengths, so the main lane can queue their later chunks while their first
        chunk is still decoding (handed out first: ``_finish_main``). True if any did."""
        learned = False
        for launch in self._fast.values():
            if launch.admitted[0].frames is None and self.runner.done(launch.encoded):  # no event query once known
                learned = self._take_lengths(launch) or learned
        return learned

    def _take_lengths(self, launch: _FastLaunch) -> bool:
        """Set the frame counts of ``launch``'s requests unless they are set already; True if it did."""
        if launch.admitted[0].frames is not None:  # set together, by the first of _learn_lengths / _finish_fast
            return False
        for request, n in zip(launch.admitted, launch.lengths):
            self._set_frames(request, int(n))
        return True

    def _on_fast_lanes(self) -> set[SpeechRequest]:
        """Requests of the fast launches in flight (their first chunk not handed out yet)."""
        return {r for launch in self._fast.values() for r in launch.admitted}

    def _arrivals(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for submissions that free slots can take."""
        if len(self._waiting) >= len(self._free_slots) or len(self._running) >= self._max_batch:
            time.sleep(timeout_s)  # nothing more could start: the rest stays in the bounded inbox
            return
        try:
            self._waiting.append(self._inbox.get(timeout=timeout_s))
        except queue.Empty:
            return
        self._take_inbox()

    def _admit(self) -> list[SpeechRequest]:
        """Waiting requests for one encoder launch: at most ``max_batch`` running, and an
        encoder bucket no larger than ``max_batch``."""
        admitted: list[SpeechRequest] = []
        longest = 0
        encode_cap = max(b for b in self.runner.options.encode_batches if b <= self._max_batch or b == 1)
        while self._waiting and self._free_slots and len(self._running) < self._max_batch:
            request = self._waiting[0]
            longest_if = max(longest, len(request.ids))
            if len(admitted) + 1 > min(encode_cap, self.runner.max_encode_batch(longest_if)):
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
        # The whole utterance's audio, from the pool; chunks are views into it.
        samples = self.runner.resampler.out_samples(request.frames * self.runner.geometry.hop_length)
        request.audio = self.audio_pool.lease((samples,), np.int16)

    def _deliver(self, batch: list[SpeechRequest], audio: np.ndarray, chunk: int) -> None:
        """Row i is ``batch[i]``'s next chunk of ``chunk`` frames."""
        for row, request in zip(audio, batch):
            self._deliver_row(request, row, chunk, request.next_frame)

    def _deliver_row(self, request: SpeechRequest, row: np.ndarray, chunk: int, start: int) -> None:
        """``request``'s chunk of ``chunk`` frames from frame ``start``; dropped unless that is where the
        request stands (decoded ahead past its end, or it ended) and it is not cancelled."""
        audio = request.audio
        if audio is None or request.next_frame != start or request._cancelled:
            return
        frames = request.frames
        assert frames is not None
        end = min(start + chunk, frames)
        self.launch_stats["decode_frames_out"] += end - start
        request.next_frame = end
        span = self.runner.resampler.span(start, end)
        pcm = audio[span.start : span.stop]
        pcm[:] = span.of(row)
        self._post(request, AudioChunk(pcm, request.sample_rate, request.clause_index, end >= frames))
        if end >= frames:
            self._release(request)

    def _release(self, request: SpeechRequest) -> None:
        request.audio = None  # delivered chunks keep their views; the block returns when they go
        if request.slot is not None and self._running.get(request.slot) is request:
            del self._running[request.slot]
            self._free_slots.append(request.slot)

    def _on_oom(self, exc: BaseException) -> None:
        """Lower the batch limit; re-queue requests not yet encoded; fail a batch-1 launch's requests."""
        self.ooms += 1
        self._ok_steps = 0
        if self.runner.device.type == "cuda":
            torch.cuda.synchronize(self.runner.device)  # queued copies from staged buffers are done
            torch.cuda.empty_cache()
        self.runner.release_staged()
        for main in self._mains:  # their rows are lost: queued again from where each request stands
            self.runner.give_staged(main.blocks)
        self._mains.clear()
        for request in self._running.values():
            request.queued_frame = request.next_frame
            request.flowed = False  # its flow launch may be lost too
        self._fast = {}  # their requests are not encoded as far as we know: re-queued below
        self._ahead = []
        failed_batch, old = self._attempt_batch, self._max_batch
        self._max_batch = self._bucket_at_most(max(1, min(old, failed_batch // 2)))
        log.warning("TTS GPU out of memory at batch %d (%s): max batch %d -> %d", failed_batch, exc, old, self._max_batch)
        if failed_batch <= 1:  # nothing smaller to try: these requests end, the caller retries later
            for request in self._attempt:
                self._release(request)
                self._post(request, Overloaded("TTS GPU out of memory", retry_after_ms=self.oom_retry_after_ms))
        requeued = [r for r in self._running.values() if r.frames is None]
        for request in requeued:  # their encoder output may be lost: encode them again
            self._release(request)
            request.slot = None
        self._waiting = sorted(requeued + self._waiting, key=lambda r: r.seq)
        self._attempt, self._attempt_batch = [], 0

    def _maybe_regrow(self) -> None:
        if self._max_batch >= self.max_slots:
            return
        self._ok_steps += 1
        if self._ok_steps >= self.regrow_steps:
            old, self._ok_steps = self._max_batch, 0
            self._max_batch = self._bucket_at_most(min(self.max_slots, 2 * old))
            log.info("TTS GPU max batch %d -> %d after %d steps without OOM", old, self._max_batch, self.regrow_steps)

    def _bucket_at_most(self, size: int) -> int:
        """Largest decode batch bucket <= ``size`` (1 at least)."""
        return max([b for b in self.runner.options.decode_batches if b <= size] or [1])

    def _fail_all(self, error: BaseException | None) -> None:
        pending = [*self._running.values(), *self._waiting]
        while True:
            try:
                pending.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for request in pending:
            self._post(request, error)
        self._flush()
        self._running.clear()
        self._waiting.clear()


__all__ = ["BatchScheduler", "Scales", "SpeechRequest", "bucket_for"]
