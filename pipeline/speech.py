"""Speech output for sessions: ``await``-able TTS streams over the engine a server runs.

``SpeechStage.stream(text, options, cancel, priority)`` is the one way sessions get audio:
an async iterator of ``AudioChunk`` at ``options.sample_rate``. Two implementations:

* ``ThreadedSpeech`` (CPU engines): each stream runs the engine's ``synthesize`` generator on
  a TTS worker thread (``pipeline.workers.ModelWorker``), one hand-off per chunk. Right for
  onnxruntime, where the threads are the parallelism.
* ``BatchedSpeech`` (engines that batch across requests, the CUDA engine): the text front end
  runs on a small worker, the sentences are submitted straight to the engine's scheduler with
  a sink, and the scheduler hands each finished GPU launch's chunks to the event loop in one
  wake-up (a fast-lane launch's first chunks as soon as they are decoded, a main-lane launch's
  later ones; ``loop.call_soon_threadsafe`` per hand-off, not per chunk; no thread per request). Resampling to
  the client's rate happens here, per stream, on the event loop.

Neither blocks the loop on model work.

A caller may pass a ``FirstAudioTiming``: the batching stages mark where the stream's first audio
spent its time (``FIRST_AUDIO_PARTS``), and the caller marks ``out`` once the first audio event is
queued; ``x.tts.speak`` exports the parts as ``voxloop_tts_first_audio_part_seconds{part}``. They
also stamp the last chunk (``last_chunk``: when the engine handed it out, when it reached this
process), so the time to the *last* audio splits the same way (``LAST_AUDIO_PARTS``,
``voxloop_tts_last_audio_part_seconds{part}``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from pipeline.workers import NORMAL, URGENT, ModelWorker
from tts_engine.engine import AudioChunk, SynthesisOptions
from tts_engine.resample import StreamResampler

#: Where a stream's first audio spends its time inside the server, in order (seconds each):
#: ``text`` request -> phoneme ids (text worker, its queue included); ``to_engine`` ids sent ->
#: the engine process has them (front-end processes only); ``engine`` -> the scheduler hands out
#: the first chunk (waiting line, encoder, first decode); ``from_engine`` -> the stream's task
#: resumes with it (link, event-loop wake-up); ``out`` -> the first audio event is queued
#: (resampling, base64/JSON framing happen here or in the connection's writer).
FIRST_AUDIO_PARTS = ("text", "to_engine", "engine", "from_engine", "out")
#: From the request to its last audio queued, the same way in: ``text`` and ``to_engine`` are the
#: first audio's (one request); ``engine`` -> the scheduler hands out the last chunk (from when the
#: engine had the request, as for the first audio); ``from_engine`` -> it reaches this process (the
#: engine link, or the loop's wake-up); ``out`` -> resampled, cut into deltas and queued (with
#: ``x.tts.done``) here.
LAST_AUDIO_PARTS = ("text", "to_engine", "engine", "from_engine", "out")


class FirstAudioTiming:
    """Marks along one stream's way to its first audio (``time.monotonic``: one clock for every
    process of a host, so the engine process's stamps compare with a front end's)."""

    def __init__(self) -> None:
        self._last = time.monotonic()
        #: part -> seconds since the previous mark.
        self.parts: dict[str, float] = {}
        #: When the engine had the request: the mark before ``engine`` (``time.monotonic``).
        self._engine_start: float | None = None
        #: (handed out by the engine, arrived here) of the last chunk, once streamed.
        self.last: tuple[float, float] | None = None

    def mark(self, part: str, at: float | None = None) -> None:
        at = time.monotonic() if at is None else at
        if part == "engine":
            self._engine_start = self._last
        self.parts[part] = max(0.0, at - self._last)
        self._last = at

    def last_chunk(self, handed_out: float) -> None:
        """The stream's last chunk: handed out by the engine at ``handed_out``, here now."""
        self.last = (handed_out, time.monotonic())

    def last_parts(self, queued: float) -> dict[str, float] | None:
        """``LAST_AUDIO_PARTS`` in seconds (those this stream passed: no ``to_engine`` in one
        process) for a stream whose last audio was queued at ``queued``; None when it stamped no
        last chunk (cancelled, CPU engines) or no first audio's way to the engine."""
        if self.last is None or self._engine_start is None:
            return None
        handed_out, arrived = self.last
        way_in = {part: self.parts[part] for part in ("text", "to_engine") if part in self.parts}
        return {**way_in, "engine": max(0.0, handed_out - self._engine_start),
                "from_engine": max(0.0, arrived - handed_out), "out": max(0.0, queued - arrived)}


class SpeechStage(Protocol):
    def stream(self, text: str, options: SynthesisOptions, cancel: threading.Event,
               priority: int = NORMAL, timing: FirstAudioTiming | None = None) -> AsyncIterator[AudioChunk]:
        """Audio of ``text`` in order; stops early when ``cancel`` is set or the consumer stops.
        ``timing``: marked up to ``from_engine`` by stages that batch (others leave it empty)."""
        ...

    def memory_report(self) -> dict | None:
        """The GPU engine's memory figures (``CudaTtsEngine.memory_report``); None without a GPU engine."""
        ...

    def scheduled(self) -> int | None:
        """Requests inside the GPU scheduler; None without one."""
        ...


class ThreadedSpeech:
    """One worker thread per stream runs the engine's generator (CPU engines)."""

    def __init__(self, worker: ModelWorker) -> None:
        self.worker = worker

    def stream(self, text: str, options: SynthesisOptions, cancel: threading.Event,
               priority: int = NORMAL, timing: FirstAudioTiming | None = None) -> AsyncIterator[AudioChunk]:
        def synthesize(tts: Any) -> Any:
            # A reply's first clause (URGENT) in decoder chunks when the engine keeps both forms
            # (``tts.stream_first_clause``) and no other clause waits for a thread: its first audio
            # is what the user is waiting for, and the chunks' extra CPU is spent only when spare.
            if (priority == URGENT and getattr(tts, "can_stream", False) and not tts.streaming
                    and self.worker.queued() == 0):
                return tts.synthesize(text, options, stream=True)
            return tts.synthesize(text, options)

        return self.worker.stream(synthesize, cancel, priority=priority)

    def memory_report(self) -> dict | None:
        return None

    def scheduled(self) -> int | None:
        return None


async def sentence_ids(text_worker: ModelWorker, text: str, priority: int, cancel: threading.Event,
                       inline_chars: int) -> list[list[int]]:
    """Phoneme ids per sentence of ``text`` from the text worker's engine (``sentence_ids``).

    A text of at most ``inline_chars`` characters while the worker is idle is phonemized right
    here on the event loop (espeak: ~0.4 ms for a 14-word sentence) instead of through the
    worker's thread (two thread hand-offs, ~1 ms more at one request); a longer text, or any
    while the worker is busy, goes through the worker, so the loop never waits for the espeak lock.
    """
    if len(text) <= inline_chars and text_worker.idle():
        return text_worker.engine.sentence_ids(text)
    return await text_worker.submit(lambda engine: engine.sentence_ids(text), priority, cancel)


class BatchedSpeech:
    """Streams on a batching engine (``sentence_ids`` + ``submit_sentences(..., sink=)``)."""

    def __init__(self, engine: Any, text_worker: ModelWorker, inline_text_chars: int = 0) -> None:
        """``inline_text_chars``: texts up to this many characters are phonemized on the event loop
        when the text thread is idle (0: always on the text thread)."""
        self.engine = engine
        self.text_worker = text_worker
        self.inline_text_chars = inline_text_chars
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[Any, asyncio.Queue] = {}  # request -> (outcome, handed out at), while streamed
        #: Scheduler hand-offs (event-loop wake-ups) and the outcomes they carried.
        self.handoffs = 0
        self.outcomes = 0

    def memory_report(self) -> dict | None:
        return self.engine.memory_report()

    def scheduled(self) -> int | None:
        return self.engine.scheduler.in_flight

    def _sink(self, outcomes: list) -> None:
        """Scheduler thread: one wake-up of the loop per hand-off (one per finished GPU launch)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._dispatch, outcomes, time.monotonic())

    def _dispatch(self, outcomes: list, sunk_at: float) -> None:
        self.handoffs += 1
        self.outcomes += len(outcomes)
        for request, outcome in outcomes:
            queue = self._queues.get(request)
            if queue is not None:  # else: the stream already ended (cancelled)
                queue.put_nowait((outcome, sunk_at))

    async def stream(self, text: str, options: SynthesisOptions, cancel: threading.Event,
                     priority: int = NORMAL, timing: FirstAudioTiming | None = None) -> AsyncIterator[AudioChunk]:
        self._loop = self._loop or asyncio.get_running_loop()
        sentences = await sentence_ids(self.text_worker, text, priority, cancel, self.inline_text_chars)
        if cancel.is_set():
            return
        if timing is not None:
            timing.mark("text")
        requests, rate = self.engine.submit_sentences(sentences, options, sink=self._sink)
        queues = [self._queues.setdefault(r, asyncio.Queue()) for r in requests]
        resampler = StreamResampler(self.engine.sample_rate, rate, dtype="int16")
        try:
            for n, queue in enumerate(queues):
                last_request = n == len(queues) - 1
                while not cancel.is_set():
                    outcome, sunk_at = await queue.get()
                    if outcome is None:  # the engine closed
                        return
                    if isinstance(outcome, BaseException):
                        raise outcome
                    if timing is not None and "engine" not in timing.parts:
                        timing.mark("engine", sunk_at)
                        timing.mark("from_engine")
                    if timing is not None and last_request and outcome.final:
                        timing.last_chunk(sunk_at)
                    yield resampler.process_chunk(outcome, last=last_request and outcome.final)
                    if outcome.final:
                        break
        finally:  # finished, failed, cancelled or abandoned: free the GPU slots at the next step
            for request in requests:
                request.cancel()
                self._queues.pop(request, None)

