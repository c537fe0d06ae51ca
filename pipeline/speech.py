"""Speech output for sessions: ``await``-able TTS streams over the engine a server runs.

``SpeechStage.stream(text, options, cancel, priority)`` is the one way sessions get audio:
an async iterator of ``AudioChunk`` at ``options.sample_rate``. Two implementations:

* ``ThreadedSpeech`` (CPU engines): each stream runs the engine's ``synthesize`` generator on
  a TTS worker thread (``pipeline.workers.ModelWorker``), one hand-off per chunk. Right for
  onnxruntime, where the threads are the parallelism.
* ``BatchedSpeech`` (engines that batch across requests, the CUDA engine): the text front end
  runs on a small worker, the sentences are submitted straight to the engine's scheduler with
  a sink, and the scheduler hands each step's chunks to the event loop in at most **two**
  wake-ups (first chunks as soon as they are decoded, then the rest; ``loop.call_soon_threadsafe``
  per hand-off, not per chunk; no thread per request). Resampling to
  the client's rate happens here, per stream, on the event loop.

Neither blocks the loop on model work.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any, Protocol

from pipeline.workers import NORMAL, ModelWorker
from tts_engine.engine import AudioChunk, SynthesisOptions
from tts_engine.resample import StreamResampler


class SpeechStage(Protocol):
    def stream(self, text: str, options: SynthesisOptions, cancel: threading.Event,
               priority: int = NORMAL) -> AsyncIterator[AudioChunk]:
        """Audio of ``text`` in order; stops early when ``cancel`` is set or the consumer stops."""
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
               priority: int = NORMAL) -> AsyncIterator[AudioChunk]:
        return self.worker.stream(lambda tts: tts.synthesize(text, options), cancel, priority=priority)

    def memory_report(self) -> dict | None:
        return None

    def scheduled(self) -> int | None:
        return None


class BatchedSpeech:
    """Streams on a batching engine (``sentence_ids`` + ``submit_sentences(..., sink=)``)."""

    def __init__(self, engine: Any, text_worker: ModelWorker) -> None:
        self.engine = engine
        self.text_worker = text_worker
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[Any, asyncio.Queue] = {}  # request -> its outcomes, while streamed
        #: Scheduler hand-offs (event-loop wake-ups) and the outcomes they carried.
        self.handoffs = 0
        self.outcomes = 0

    def memory_report(self) -> dict | None:
        return self.engine.memory_report()

    def scheduled(self) -> int | None:
        return self.engine.scheduler.in_flight

    def _sink(self, outcomes: list) -> None:
        """Scheduler thread: one wake-up of the loop per hand-off (at most two per step)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._dispatch, outcomes)

    def _dispatch(self, outcomes: list) -> None:
        self.handoffs += 1
        self.outcomes += len(outcomes)
        for request, outcome in outcomes:
            queue = self._queues.get(request)
            if queue is not None:  # else: the stream already ended (cancelled)
                queue.put_nowait(outcome)

    async def stream(self, text: str, options: SynthesisOptions, cancel: threading.Event,
                     priority: int = NORMAL) -> AsyncIterator[AudioChunk]:
        self._loop = self._loop or asyncio.get_running_loop()
        sentences = await self.text_worker.submit(lambda engine: engine.sentence_ids(text), priority, cancel)
        if cancel.is_set():
            return
        requests, rate = self.engine.submit_sentences(sentences, options, sink=self._sink)
        queues = [self._queues.setdefault(r, asyncio.Queue()) for r in requests]
        resampler = StreamResampler(self.engine.sample_rate, rate, dtype="int16")
        try:
            for n, queue in enumerate(queues):
                last_request = n == len(queues) - 1
                while not cancel.is_set():
                    outcome = await queue.get()
                    if outcome is None:  # the engine closed
                        return
                    if isinstance(outcome, BaseException):
                        raise outcome
                    yield resampler.process_chunk(outcome, last=last_request and outcome.final)
                    if outcome.final:
                        break
        finally:  # finished, failed, cancelled or abandoned: free the GPU slots at the next step
            for request in requests:
                request.cancel()
                self._queues.pop(request, None)

