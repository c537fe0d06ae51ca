"""The link between WebSocket front-end processes and the process that owns the GPU engine.

With ``server.front_ends = N > 1`` (see ``pipeline/front_ends.py``) one *engine process* owns the
batching TTS engine and N *front-end* processes run the sessions. Each front end keeps one Unix
stream socket to the engine process; messages are length-prefixed pickles (both ends are our own
processes, started together; the socket lives in a private directory, mode 0700):

front end -> engine
  ``("speak", key, sentences, options)``: phoneme ids of each sentence (the front end runs the text
  front end), ``SynthesisOptions`` without the rate (resampling happens in the front end);
  ``("cancel", key)``.
engine -> front end
  ``("step", [(key, clause_index, final, pcm_bytes) | (key, error) ...])``: **one message per GPU
  step** with everything that step made for that front end's requests (int16 at the voice's rate);
  ``error`` is an exception, or None when the engine closed;
  ``("report", memory_report, in_flight)`` once a second, for ``/metrics``.

``EngineHost`` is the engine side (threads: one reader and one writer per front end; the scheduler
thread only appends to a queue). ``RemoteSpeech`` is the front-end side, a ``SpeechStage``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import pickle
import queue
import socket
import struct
import threading
from collections.abc import AsyncIterator
from typing import Any

from pipeline.workers import NORMAL, ModelWorker
from tts_engine.engine import AudioChunk, SynthesisOptions, resolve_options
from tts_engine.onnx_backend import StreamResampler
from voxloop.errors import ModelError

log = logging.getLogger(__name__)

_LEN = struct.Struct("!I")
REPORT_INTERVAL_S = 1.0


def frame(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(body)) + body


# --------------------------------------------------------------------------- engine process
class EngineHost:
    """Serves a batching engine (``submit_sentences(..., sink=)``) to front ends on a Unix socket."""

    def __init__(self, engine: Any, path: str) -> None:
        self.engine = engine
        self.path = path
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen(64)
        self._closed = threading.Event()
        self._links: list[_FrontEndLink] = []
        threading.Thread(target=self._accept, name="engine-host-accept", daemon=True).start()
        threading.Thread(target=self._report, name="engine-host-report", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._links.append(_FrontEndLink(self.engine, conn))

    def _report(self) -> None:
        report = getattr(self.engine, "memory_report", None)
        while not self._closed.wait(REPORT_INTERVAL_S):
            message = ("report", report() if report else None, self.engine.scheduler.in_flight)
            for link in list(self._links):
                link.send(message)

    def close(self) -> None:
        self._closed.set()
        self._server.close()
        for link in self._links:
            link.close()


class _FrontEndLink:
    """One front end's connection: requests by key, a sink that sends each step in one message."""

    def __init__(self, engine: Any, conn: socket.socket) -> None:
        self.engine = engine
        self.conn = conn
        self._requests: dict[int, list] = {}  # key -> its SpeechRequests
        self._keys: dict[Any, int] = {}  # SpeechRequest -> key
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        threading.Thread(target=self._read, name="engine-host-read", daemon=True).start()
        threading.Thread(target=self._write, name="engine-host-write", daemon=True).start()

    def send(self, message: Any) -> None:
        self._out.put(message)

    def sink(self, outcomes: list) -> None:
        """Scheduler thread, once per step: this front end's outcomes become one message."""
        items = []
        with self._lock:
            for request, outcome in outcomes:
                key = self._keys.get(request)
                if key is None:
                    continue
                if isinstance(outcome, AudioChunk):
                    items.append((key, outcome.clause_index, outcome.final, outcome.pcm.tobytes()))
                else:
                    items.append((key, outcome))
        if items:
            self._out.put(("step", items))

    def _read(self) -> None:
        reader = self.conn.makefile("rb")  # read(n) returns n bytes, or fewer at end of stream
        try:
            while len(head := reader.read(_LEN.size)) == _LEN.size:
                size = _LEN.unpack(head)[0]
                if len(body := reader.read(size)) < size:
                    break
                self._handle(pickle.loads(body))
        except OSError:
            pass
        finally:  # the front end went away: its requests stop at the next step
            with self._lock:
                for requests in self._requests.values():
                    for r in requests:
                        r.cancel()
                self._requests.clear()
                self._keys.clear()
            self._out.put(None)

    def _handle(self, message: tuple) -> None:
        if message[0] == "cancel":
            with self._lock:
                for r in self._requests.pop(message[1], ()):
                    self._keys.pop(r, None)
                    r.cancel()
            return
        _, key, sentences, options = message
        try:
            requests, _ = self.engine.submit_sentences(sentences, options, sink=self.sink)
        except Exception as exc:  # noqa: BLE001 - Overloaded / InvalidInput go back to the session
            self._out.put(("step", [(key, exc)]))
            return
        with self._lock:
            self._requests[key] = requests
            for r in requests:
                self._keys[r] = key

    def _write(self) -> None:
        try:
            while (message := self._out.get()) is not None:
                self.conn.sendall(frame(message))
        except OSError:
            pass

    def close(self) -> None:
        self._out.put(None)
        try:
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


# --------------------------------------------------------------------------- front-end process
class SpeechText:
    """The front end's share of a voice: text -> phoneme ids, option checks, the native rate (no model)."""

    def __init__(self, cfg: Any) -> None:
        from tts_engine.frontend import TextFrontend
        from tts_engine.voice import Voice
        from voxloop import models

        path = models.resolve_voice(cfg).path
        self.voice = Voice.load(path, models.voice_config_path(cfg, path))
        self.sample_rate = self.voice.sample_rate
        self.defaults = SynthesisOptions.from_config(cfg.tts)
        if cfg.tts.zh_lexicon_path:
            from tts_engine.zh import configure

            configure(cfg.tts.zh_lexicon_path)
        self._frontend = TextFrontend(self.voice.config, max_text_chars=cfg.limits.max_text_chars)

    def sentence_ids(self, text: str) -> list[list[int]]:
        return list(self._frontend.sentence_ids(text))

    def output_rate(self, options: SynthesisOptions) -> int:
        """The rate the client gets, Hz; raises ``InvalidInput`` for options the engine would refuse."""
        return resolve_options(options, self.defaults, self.voice).sample_rate


class RemoteSpeech:
    """``SpeechStage`` of a front end: phonemize here, synthesize in the engine process, resample here."""

    def __init__(self, path: str, text: SpeechText, text_worker: ModelWorker) -> None:
        self.path = path
        self.text = text
        self.text_worker = text_worker
        self.engine = text  # read by the hub for facts like the sample rate
        self._writer: asyncio.StreamWriter | None = None
        self._queues: dict[int, asyncio.Queue] = {}
        self._keys = itertools.count()
        #: The engine process's latest ``memory_report`` and requests in its scheduler.
        self.report: dict | None = None
        self.in_flight = 0
        self.handoffs = 0

    async def connect(self, timeout_s: float = 600.0) -> None:
        """Connect to the engine process (retrying while it loads), then read its messages."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                reader, self._writer = await asyncio.open_unix_connection(self.path, limit=2**26)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if loop.time() > deadline:
                    raise ModelError(f"engine process not reachable at {self.path}") from None
                await asyncio.sleep(0.2)
        asyncio.create_task(self._read(reader), name="engine-link-read")

    def memory_report(self) -> dict | None:
        return self.report

    def scheduled(self) -> int | None:
        return self.in_flight

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                head = await reader.readexactly(_LEN.size)
                message = pickle.loads(await reader.readexactly(_LEN.unpack(head)[0]))
                if message[0] == "step":
                    self.handoffs += 1
                    for item in message[1]:
                        q = self._queues.get(item[0])
                        if q is not None:
                            q.put_nowait(item)
                elif message[0] == "report":
                    self.report, self.in_flight = message[1], message[2]
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:  # engine process gone: every stream ends with an error
            if self._writer is not None:
                self._writer.close()
            for key, q in list(self._queues.items()):
                q.put_nowait((key, ModelError("the engine process went away")))

    async def stream(self, text: str, options: SynthesisOptions, cancel: threading.Event,
                     priority: int = NORMAL) -> AsyncIterator[AudioChunk]:
        if not self.connected:
            raise ModelError("the engine process is not connected")
        rate = self.text.output_rate(options)
        sentences = await self.text_worker.submit(lambda t: t.sentence_ids(text), priority, cancel)
        if cancel.is_set() or not sentences:
            return
        key = next(self._keys)
        q: asyncio.Queue = asyncio.Queue()
        self._queues[key] = q
        assert self._writer is not None
        self._writer.write(frame(("speak", key, sentences, dataclasses.replace(options, sample_rate=None))))
        resampler = StreamResampler(self.text.sample_rate, rate, dtype="int16")
        ahead: dict[int, list] = {}  # chunks of later sentences that arrived first (they share GPU steps)
        index, finished = 0, False
        try:
            while index < len(sentences) and not cancel.is_set():
                if ahead.get(index):
                    item = ahead[index].pop(0)
                else:
                    item = await q.get()
                    if len(item) == 2:  # (key, error): the request failed in the engine
                        raise item[1] if item[1] is not None else ModelError("the engine closed")
                    if item[1] != index:
                        ahead.setdefault(item[1], []).append(item)
                        continue
                _, clause, final, pcm = item
                chunk = AudioChunk(_int16(pcm), self.text.sample_rate, clause, final)
                yield resampler.process_chunk(chunk, last=final and index == len(sentences) - 1)
                index += final
            finished = index == len(sentences)
        finally:
            self._queues.pop(key, None)
            if not finished and self.connected:
                self._writer.write(frame(("cancel", key)))


def _int16(raw: bytes):  # noqa: ANN202 - np.ndarray
    import numpy as np

    return np.frombuffer(raw, dtype=np.int16)
