"""Model workers: the only bridge between the synchronous engines and the event loop.

Each model is owned by one ``ModelWorker``: one thread per engine instance (usually
one; ``tts.onnx_workers`` gives the CPU TTS several onnxruntime sessions), pulling
jobs from one bounded priority queue. Jobs are callables that receive the thread's
engine. Blocking work never runs on the event loop.

Overflow policy: ``submit``/``stream`` raise ``Overloaded`` at once when the queue
is full (the caller turns it into an ``error`` event with ``retry_after_ms``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from base.errors import Cancelled, Overloaded

log = logging.getLogger(__name__)
E = TypeVar("E")
T = TypeVar("T")

#: Priority classes: lower runs first. First clauses of a reply jump the queue so
#: speech starts sooner; speculative work yields to committed work, and partial transcripts
#: (a courtesy while the user speaks) to everything: a speculative turn's transcript is the
#: final one for most turns (every turn of bench/voice_latency.py's H200 runs).
URGENT, NORMAL, BACKGROUND, PARTIAL = 0, 1, 2, 3

_END = object()


@dataclass(order=True)
class _Job:
    priority: int
    seq: int
    run: Callable[[Any], None] = field(compare=False)
    cancel: threading.Event | None = field(compare=False, default=None)


class ModelWorker(Generic[E]):
    """Threads that own engine instances and run queued jobs on them."""

    def __init__(self, name: str, engines: list[E], queue_size: int = 64) -> None:
        if not engines:
            raise ValueError("a worker needs at least one engine")
        self.name = name
        self.engines = engines
        self.queue_size = queue_size
        self._queue: queue.PriorityQueue[_Job] = queue.PriorityQueue(maxsize=queue_size)
        self._seq = itertools.count()
        self._busy = 0
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._loop, args=(e,), name=f"{name}-{i}", daemon=True)
            for i, e in enumerate(engines)
        ]
        for t in self._threads:
            t.start()

    @property
    def engine(self) -> E:
        """The first engine (for read-only facts like its sample rate)."""
        return self.engines[0]

    def pending(self) -> int:
        """Jobs queued or running."""
        with self._lock:
            return self._queue.qsize() + self._busy

    def idle(self) -> bool:
        return self.pending() == 0

    def queued(self) -> int:
        """Jobs waiting for a thread (not running)."""
        return self._queue.qsize()

    def _loop(self, engine: E) -> None:
        while True:
            job = self._queue.get()
            if job.run is None:  # shutdown sentinel
                return
            if job.cancel is not None and job.cancel.is_set():
                job.run(None)  # lets the job resolve its future as cancelled
                continue
            with self._lock:
                self._busy += 1
            try:
                job.run(engine)
            except Exception:  # a job must never kill the worker thread
                log.exception("%s: job failed", self.name)
            finally:
                with self._lock:
                    self._busy -= 1

    def _put(self, run: Callable[[Any], None], priority: int, cancel: threading.Event | None) -> None:
        try:
            self._queue.put_nowait(_Job(priority, next(self._seq), run, cancel))
        except queue.Full:
            raise Overloaded(f"{self.name} queue is full ({self.queue_size} jobs)") from None

    def submit(
        self,
        fn: Callable[[E], T],
        priority: int = NORMAL,
        cancel: threading.Event | None = None,
    ) -> asyncio.Future[T]:
        """Run ``fn(engine)`` on a worker thread; await the returned future for its result."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()

        def settle(setter: Callable[[Any], None], value: Any) -> None:
            if not fut.done():
                setter(value)

        def run(engine: E | None) -> None:
            if engine is None:
                loop.call_soon_threadsafe(settle, fut.set_exception, Cancelled("cancelled before start"))
                return
            try:
                result = fn(engine)
            except BaseException as exc:  # noqa: BLE001 - forwarded to the awaiting task
                loop.call_soon_threadsafe(settle, fut.set_exception, exc)
            else:
                loop.call_soon_threadsafe(settle, fut.set_result, result)

        self._put(run, priority, cancel)
        return fut

    def stream(
        self,
        make: Callable[[E], Iterator[T]],
        cancel: threading.Event,
        priority: int = NORMAL,
    ) -> AsyncIterator[T]:
        """Iterate ``make(engine)`` on a worker thread, yielding its items on the loop.

        ``cancel`` is checked between items; setting it (or closing the async
        iterator) stops the generator at the next item.
        """
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[Any] = asyncio.Queue()
        abandoned = threading.Event()  # the consumer stopped early: stop this stream only

        def run(engine: E | None) -> None:
            if engine is None:
                loop.call_soon_threadsafe(items.put_nowait, _END)
                return
            gen = make(engine)
            try:
                for item in gen:
                    if cancel.is_set() or abandoned.is_set():
                        break
                    loop.call_soon_threadsafe(items.put_nowait, item)
            except BaseException as exc:  # noqa: BLE001 - forwarded to the consumer
                loop.call_soon_threadsafe(items.put_nowait, _Failure(exc))
            finally:
                close = getattr(gen, "close", None)
                if close is not None:
                    close()
                loop.call_soon_threadsafe(items.put_nowait, _END)

        self._put(run, priority, cancel)
        return _drain(items, abandoned)

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(_Job(-1, -1, None))  # type: ignore[arg-type]


@dataclass
class _Failure:
    exc: BaseException


async def _drain(items: asyncio.Queue[Any], abandoned: threading.Event) -> AsyncIterator[Any]:
    try:
        while True:
            item = await items.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        # Consumer stopped early (cancelled task, break): stop the producer too.
        abandoned.set()
