"""The ASR stage as the event loop sees it: ``await asr.transcribe(audio, language, ...)``.

``BatchingAsr`` owns one ``Transcriber`` on one thread. Requests queue by priority
(final transcripts before speculative ones before partials); each time the thread is
free it takes the first request and up to ``asr.max_batch - 1`` more that are already
waiting, and transcribes those of one language in **one batched call**
(``Transcriber.transcribe_batch``: one encoder pass and one greedy decode for all of
them). On a GPU that is what lets many sessions share the model: 8 utterances cost
about twice one (``shared/gpu-recipes``); on a CPU ``max_batch = 1`` (the default)
keeps one call per utterance, which is as fast there.

``submit(..., done=callback)`` is the thread-safe core (the engine process serves front
ends through it, ``pipeline.engine_link``); ``transcribe`` wraps it for asyncio callers.
A request whose ``cancel`` is set before it runs ends with ``Cancelled``; a full queue
raises ``Overloaded`` at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.workers import NORMAL
from base.errors import Cancelled, Overloaded

log = logging.getLogger(__name__)

Done = Callable[[Any], None]  # receives a Transcript or the exception that ended the request


@dataclass(order=True)
class _Request:
    priority: int
    seq: int
    audio: np.ndarray | None = field(compare=False)  # None: the shutdown sentinel
    language: str | None = field(compare=False, default=None)
    cancel: threading.Event | None = field(compare=False, default=None)
    done: Done | None = field(compare=False, default=None)
    prompt: str | None = field(compare=False, default=None)


class BatchingAsr:
    """A ``Transcriber`` on one thread, transcribing waiting requests of one language (and prompt) together."""

    def __init__(self, transcriber: Any, max_batch: int = 1, queue_size: int = 64) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.engine = transcriber
        self.max_batch = max_batch
        self.queue_size = queue_size
        self._queue: queue.PriorityQueue[_Request] = queue.PriorityQueue(maxsize=queue_size)
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._running = 0
        #: Batched calls made and utterances transcribed (``/metrics``, the bench's batch size).
        self.calls = 0
        self.utterances = 0
        self._thread = threading.Thread(target=self._run, name="asr-0", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ callers
    def submit(self, audio: np.ndarray, language: str | None, done: Done, priority: int = NORMAL,
               cancel: threading.Event | None = None, prompt: str | None = None) -> None:
        """Queue ``audio`` (16 kHz mono); ``done`` gets the ``Transcript`` or an exception, on the ASR thread.
        ``prompt``: whisper's initial prompt (the session's ``transcription.prompt``)."""
        try:
            self._queue.put_nowait(_Request(priority, next(self._seq), audio, language, cancel, done, prompt))
        except queue.Full:
            raise Overloaded(f"asr queue is full ({self.queue_size} utterances)") from None

    async def transcribe(self, audio: np.ndarray, language: str | None, priority: int = NORMAL,
                         cancel: threading.Event | None = None, prompt: str | None = None) -> Any:
        """The ``Transcript`` of ``audio``; raises what the model raised, or ``Cancelled``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()

        def settle(result: Any) -> None:
            if fut.done():
                return
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)

        self.submit(audio, language, lambda r: loop.call_soon_threadsafe(settle, r), priority, cancel, prompt)
        return await fut

    def pending(self) -> int:
        """Utterances queued or being transcribed."""
        with self._lock:
            return self._queue.qsize() + self._running

    def idle(self) -> bool:
        return self.pending() == 0

    def report(self) -> dict[str, int | None]:
        """Batched calls, utterances transcribed, utterances pending and the GPU memory the model
        took at start-up (``gpu_bytes``, None on a CPU or when unknown), for ``/metrics``."""
        return {"calls": self.calls, "utterances": self.utterances, "pending": self.pending(),
                "gpu_bytes": getattr(self.engine, "gpu_bytes", None)}

    def close(self) -> None:
        self._queue.put(_Request(-1, -1, None))

    # ------------------------------------------------------------------ the ASR thread
    def _take(self) -> list[_Request] | None:
        """The next request and those waiting behind it (at most ``max_batch``); None at shutdown."""
        first = self._queue.get()
        if first.audio is None:
            return None
        batch = [first]
        while len(batch) < self.max_batch:
            try:
                r = self._queue.get_nowait()
            except queue.Empty:
                break
            if r.audio is None:  # shutdown: finish this batch first
                self._queue.put(r)
                break
            batch.append(r)
        return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            live = []
            for r in batch:
                if r.cancel is not None and r.cancel.is_set():
                    _finish(r, Cancelled("cancelled before transcription"))
                else:
                    live.append(r)
            by_language: dict[tuple[str | None, str | None], list[_Request]] = {}
            for r in live:
                by_language.setdefault((r.language, r.prompt), []).append(r)
            with self._lock:
                self._running = len(live)
            for (language, prompt), group in by_language.items():
                self._transcribe(language, group, prompt)
            with self._lock:
                self._running = 0

    def _transcribe(self, language: str | None, group: list[_Request], prompt: str | None = None) -> None:
        extra = {"prompt": prompt} if prompt else {}  # engines without prompts (test fakes) never get one
        try:
            if len(group) == 1:
                results: list[Any] = [self.engine.transcribe(group[0].audio, language, **extra)]
            else:
                results = self.engine.transcribe_batch([r.audio for r in group], language, **extra)
        except Exception as exc:  # noqa: BLE001 - every request of the call gets the error
            results = [exc] * len(group)
        self.calls += 1
        self.utterances += len(group)
        for r, result in zip(group, results):
            _finish(r, result)


def _finish(request: _Request, result: Any) -> None:
    try:
        assert request.done is not None
        request.done(result)
    except Exception:  # a callback must never kill the ASR thread
        log.exception("asr: delivering a result failed")
