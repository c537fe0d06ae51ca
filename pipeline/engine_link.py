"""The link between WebSocket front-end processes and the process that owns the GPU.

With ``server.front_ends = N > 1`` (see ``pipeline/front_ends.py``) one *engine process* owns the
GPU's PyTorch side: the batching TTS engine, and the ASR when it runs on the GPU; the LLM, when it
runs on the GPU, has an *LLM process* of its own (``engine_stages``; a CUDA build of llama.cpp and
PyTorch crashed in one process). Either way every session's utterances and replies batch
together. N *front-end* processes run the sessions. Each front end keeps one Unix stream socket
to the engine process (and one to the LLM process); messages are length-prefixed pickles (both ends are
our own processes, started together; the socket lives in a private directory, mode 0700). Audio
travels out of band (pickle protocol 5): the engine process hands the socket views of its audio
blocks, so neither its scheduler thread nor a writer thread copies a chunk under the interpreter
lock (``frame``; the kernel's copy runs without it), and a front end's audio is a view of the
message it read:

front end -> engine
  ``("speak", key, sentences, options)``: phoneme ids of each sentence (the front end runs the text
  front end), ``SynthesisOptions`` without the rate (resampling happens in the front end);
  ``("cancel", key)``;
  ``("asr", key, pcm_bytes, dtype, language, priority, prompt)`` / ``("asr_cancel", key)``;
  ``("llm", key, session, messages, max_tokens, priority, tools, tool_choice, words_key)`` (``words_key``:
  not None to score the last message's words with the reply, answered as ``llm_words``) / ``("llm_cancel", key)`` /
  ``("llm_release", session)``; ``("llm_words", key, session, transcript, messages, tools)`` (the
  end-of-turn score of the words, ``BatchedLlm.end_of_turn``).
engine -> front end
  ``("step", [(key, clause_index, final, pcm, stamps) | (key, error) ...])``: **one message
  per finished GPU launch** with what it made for that front end's requests (int16 at the
  engine's rate, out of band): a fast-lane launch's first chunks, or a main-lane launch's later ones; ``stamps`` is
  ``(received, handed_out)`` (``time.monotonic()`` of this host), ``received`` only on a speak's
  first chunk (else None);
  ``error`` is an exception, or None when the engine closed;
  ``("asr", key, transcript_or_error)``;
  ``("llm", [(key, text, stats, error, tool_calls) ...])``: one message per ``llama_decode`` step with every
  reply of that front end it advanced (``stats`` set on a reply's last item; ``tool_calls`` its
  ``ToolCallDelta`` s of the step);
  ``("llm_words", key, probability_or_None)``;
  ``("report", {...})`` once a second, for ``/metrics``.

``EngineHost`` is the engine side (threads: one reader and one writer per front end; the TTS
scheduler, ASR and LLM threads only append to a front end's queue). ``EngineClient`` is the
front end's end of the socket; ``RemoteSpeech``, ``RemoteAsr`` and ``RemoteLlm`` are the stages a
front end's sessions use, with the interfaces of the local ones.
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
import time
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Any

import numpy as np

from pipeline import gc_pauses
from pipeline.speech import FirstAudioTiming, sentence_ids
from pipeline.workers import NORMAL, ModelWorker
from tts_engine.engine import AudioChunk, SynthesisOptions, engine_defaults, resolve_options
from tts_engine.resample import StreamResampler
from base.errors import Cancelled, ConfigError, ModelError

log = logging.getLogger(__name__)

#: A message's head: pickle bytes, out-of-band buffers; then one size per buffer (``_SIZE``).
_HEAD = struct.Struct("!II")
_SIZE = struct.Struct("!I")
#: Most out-of-band buffers a message head may announce (a reader's sanity bound; a step's chunks
#: for one front end are at most a launch's rows).
MAX_BUFFERS = 1 << 20
REPORT_INTERVAL_S = 1.0
#: How often a front end's reply stream looks at its cancel event while no token arrives, s.
CANCEL_POLL_S = 0.05


def _padded(n: int) -> int:
    return -(-n // 8) * 8


def frame(message: Any) -> list:
    """``message`` as the parts to write, in order: head and sizes, the pickle, then each
    ``pickle.PickleBuffer`` in it as is (out of band, not copied); the pickle and each buffer
    padded to a multiple of 8 bytes (so int16 audio is aligned in what the reader gets)."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    parts: list = [_HEAD.pack(len(body), len(views)) + b"".join(_SIZE.pack(v.nbytes) for v in views)]
    for part in (body, *views):
        parts.append(part)
        if pad := _padded(len(part)) - len(part):
            parts.append(bytes(pad))
    return parts


def _sizes(head: bytes) -> tuple[int, int]:
    """(pickle bytes, out-of-band buffers) of a message head."""
    size, count = _HEAD.unpack(head)
    if count > MAX_BUFFERS:
        raise ValueError(f"engine link: a message head announces {count} buffers, at most {MAX_BUFFERS}")
    return size, count


def _payload_bytes(size: int, sizes: bytes) -> int:
    return _padded(size) + sum(_padded(n) for (n,) in _SIZE.iter_unpack(sizes))


def _load(size: int, sizes: bytes, payload: bytes) -> Any:
    """The message of ``payload`` (the pickle, then the buffers, each padded); buffers are views of it."""
    view = memoryview(payload)
    buffers, at = [], _padded(size)
    for (n,) in _SIZE.iter_unpack(sizes):
        buffers.append(view[at:at + n])
        at += _padded(n)
    return pickle.loads(view[:size], buffers=buffers)


def read_message(read: Callable[[int], bytes]) -> Any:
    """The next message from a blocking ``read(n)`` (n bytes, or fewer at end of stream); None at the end."""
    if len(head := read(_HEAD.size)) < _HEAD.size:
        return None
    size, count = _sizes(head)
    if len(sizes := read(_SIZE.size * count)) < _SIZE.size * count:
        return None
    total = _payload_bytes(size, sizes)
    if len(payload := read(total)) < total:
        return None
    return _load(size, sizes, payload)


async def read_message_async(reader: asyncio.StreamReader) -> Any:
    """The next message from ``reader`` (raises ``asyncio.IncompleteReadError`` at the end)."""
    size, count = _sizes(await reader.readexactly(_HEAD.size))
    sizes = await reader.readexactly(_SIZE.size * count)
    return _load(size, sizes, await reader.readexactly(_payload_bytes(size, sizes)))


#: Parts per ``sendmsg`` call (Linux's IOV_MAX).
_IOV_MAX = 1024


def send_parts(conn: socket.socket, parts: list) -> None:
    """Write ``parts`` (``frame``'s) to a blocking socket: gathered writes, no joined copy."""
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        sent = conn.sendmsg(views[:_IOV_MAX])
        while views and sent >= views[0].nbytes:
            sent -= views[0].nbytes
            views.pop(0)
        if sent:
            views[0] = views[0][sent:]


def engine_stages(cfg: Any) -> tuple[str, ...]:
    """Stages besides TTS that the engine process runs: ``server.engine_stages``, or by default
    those configured on the GPU (``asr.device = "cuda"``, ``llm.n_gpu_layers != 0``). Never the
    LLM of ``llm.backend = "openai"``: each front end streams from that server itself."""
    stages = cfg.server.engine_stages
    served = cfg.llm.backend != "openai"
    if stages is None:
        stages = tuple(s for s, on_gpu in (("asr", cfg.asr.device == "cuda"),
                                           ("llm", served and cfg.llm.n_gpu_layers != 0)) if on_gpu)
    elif "llm" in stages and not served:
        raise ConfigError('server.engine_stages has "llm", but llm.backend = "openai" runs no LLM here: each '
                          'front end streams replies from llm.base_url itself. Remove "llm" from server.engine_stages.')
    return tuple(s for s in stages if s in cfg.server.stages)


# --------------------------------------------------------------------------- engine process
class EngineHost:
    """Serves the engine process's stages to front ends on a Unix socket.

    ``tts``: a batching engine (``submit_sentences(..., sink=)``); ``asr``: a ``BatchingAsr``;
    ``llm``: a ``BatchedLlm`` (its thread runs the steps). None: not served here (the LLM process
    serves only ``llm``).
    """

    def __init__(self, tts: Any, path: str, asr: Any = None, llm: Any = None) -> None:
        self.engine = tts
        self.asr = asr
        self.llm = llm
        self.path = path
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen(64)
        self._closed = threading.Event()
        self._links: list[_FrontEndLink] = []
        threading.Thread(target=self._accept, name="engine-host-accept", daemon=True).start()
        threading.Thread(target=self._report, name="engine-host-report", daemon=True).start()

    def _accept(self) -> None:
        for number in itertools.count():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            if self._closed.is_set():
                return
            self._links.append(_FrontEndLink(self, conn, number))

    def report(self) -> dict:
        memory = getattr(self.engine, "memory_report", None)
        return {"tts_memory": memory() if memory else None,
                "tts_in_flight": self.engine.scheduler.in_flight if self.engine is not None else None,
                "llm": self.llm.report() if self.llm is not None else None,
                "asr": self.asr.report() if self.asr is not None else None,
                "gc": gc_pauses.PAUSES.snapshot()}

    def _report(self) -> None:
        while not self._closed.wait(REPORT_INTERVAL_S):
            message = ("report", self.report())
            for link in list(self._links):
                link.send(message)

    def close(self) -> None:
        self._closed.set()
        self._server.close()
        for link in self._links:
            link.close()


class _FrontEndLink:
    """One front end's connection: its requests by key; every result goes out on one writer thread."""

    def __init__(self, host: EngineHost, conn: socket.socket, number: int) -> None:
        self.host = host
        self.engine = host.engine
        self.conn = conn
        self.number = number
        self._requests: dict[int, list] = {}  # key -> its SpeechRequests
        self._keys: dict[Any, int] = {}  # SpeechRequest -> key
        self._received: dict[int, float] = {}  # key -> when its speak arrived, until its first chunk
        self._asr: dict[int, threading.Event] = {}  # key -> cancel, while transcribing
        self._replies: dict[int, Any] = {}  # key -> LLM Reply, while generating
        self._sessions: set[Hashable] = set()  # this front end's LLM conversations
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        threading.Thread(target=self._read, name="engine-host-read", daemon=True).start()
        threading.Thread(target=self._write, name="engine-host-write", daemon=True).start()

    def send(self, message: Any) -> None:
        self._out.put(message)

    # ---------------------------------------------------------------- results (other threads)
    def sink(self, outcomes: list) -> None:
        """TTS scheduler thread, once per finished launch: this front end's outcomes become one message."""
        items = []
        now = time.monotonic()
        with self._lock:
            for request, outcome in outcomes:
                key = self._keys.get(request)
                if key is None:
                    continue
                if isinstance(outcome, AudioChunk):
                    received = self._received.pop(key, None) if outcome.clause_index == 0 else None
                    # out of band: the writer thread's sendmsg reads the chunk's own samples (a view of
                    # its request's block, which stays leased while this message holds it)
                    items.append((key, outcome.clause_index, outcome.final, pickle.PickleBuffer(np.ascontiguousarray(outcome.pcm)),
                                  (received, now)))
                else:
                    self._received.pop(key, None)
                    items.append((key, outcome))
        if items:
            self._out.put(("step", items))

    def deliver(self, events: list) -> None:
        """LLM thread, once per step (``BatchedLlm`` route): this front end's reply events, one message."""
        items = []
        with self._lock:
            for event in events:
                key = event.reply.tag[1]
                error = None
                if event.stats is not None:
                    self._replies.pop(key, None)
                    error = event.reply.error
                items.append((key, event.text, event.stats, error, event.tool_calls))
        self._out.put(("llm", items))

    # ---------------------------------------------------------------- requests (reader thread)
    def _read(self) -> None:
        reader = self.conn.makefile("rb")  # read(n) returns n bytes, or fewer at end of stream
        try:
            while (message := read_message(reader.read)) is not None:
                self._handle(message)
        except (OSError, ValueError):
            pass
        finally:  # the front end went away: its work stops at the next step, its conversations end
            with self._lock:
                for requests in self._requests.values():
                    for r in requests:
                        r.cancel()
                self._requests.clear()
                self._keys.clear()
                self._received.clear()
                for cancel in self._asr.values():
                    cancel.set()
                replies, self._replies = list(self._replies.values()), {}
                sessions, self._sessions = list(self._sessions), set()
            llm = self.host.llm
            if llm is not None:
                for reply in replies:
                    llm.engine.cancel(reply)
                for session in sessions:
                    llm.release(session)
            self._out.put(None)

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        try:
            handler = getattr(self, f"_on_{kind}")
        except AttributeError:
            log.error("engine link: unknown message %r from front end %d", kind, self.number)
            return
        handler(*message[1:])

    def _on_speak(self, key: int, sentences: list, options: SynthesisOptions) -> None:
        # Under the lock the sink takes: a step that ends before the keys are known would drop
        # its outcomes (the stream would wait forever). submit_sentences never blocks.
        received = time.monotonic()
        with self._lock:
            try:
                if self.engine is None:
                    raise ModelError("this process runs no TTS")
                requests, _ = self.engine.submit_sentences(sentences, options, sink=self.sink)
            except Exception as exc:  # noqa: BLE001 - Overloaded / InvalidInput go back to the session
                self._out.put(("step", [(key, exc)]))
                return
            self._requests[key] = requests
            self._received[key] = received
            for r in requests:
                self._keys[r] = key

    def _on_cancel(self, key: int) -> None:
        with self._lock:
            self._received.pop(key, None)
            for r in self._requests.pop(key, ()):
                self._keys.pop(r, None)
                r.cancel()

    def _on_asr(self, key: int, raw: bytes, dtype: str, language: str | None, priority: int,
                prompt: str | None = None) -> None:
        if self.host.asr is None:
            self._out.put(("asr", key, ModelError("the engine process runs no ASR")))
            return
        cancel = threading.Event()

        def done(result: Any) -> None:
            with self._lock:
                self._asr.pop(key, None)
            self._out.put(("asr", key, result))

        with self._lock:
            self._asr[key] = cancel
        try:
            self.host.asr.submit(np.frombuffer(raw, dtype=np.dtype(dtype)), language, done, priority, cancel, prompt)
        except Exception as exc:  # noqa: BLE001 - Overloaded goes back to the session
            done(exc)

    def _on_asr_cancel(self, key: int) -> None:
        with self._lock:
            cancel = self._asr.get(key)
        if cancel is not None:
            cancel.set()

    def _on_llm(self, key: int, session: Hashable, messages: list, max_tokens: int, priority: int,
                tools: tuple = (), tool_choice: str | dict | None = None, words_key: int | None = None) -> None:
        from llm.replies import ReplyOptions

        llm = self.host.llm
        if llm is None:
            self._out.put(("llm", [(key, "", None, ModelError("the engine process runs no LLM"), ())]))
            if words_key is not None:
                self._out.put(("llm_words", words_key, None))
            return
        conversation = (self.number, session)  # session ids are unique per front end only
        with self._lock:
            self._sessions.add(conversation)
        options = ReplyOptions(max_tokens=max_tokens, priority=priority, tools=tools, tool_choice=tool_choice)
        probes = []
        try:
            if words_key is not None:  # the words' score, read from this reply's prompt (BatchedLlm.stream)
                probe = llm.words_probe(conversation, messages[-1]["content"], messages[:-1],
                                        lambda p: self._out.put(("llm_words", words_key, p)), tools)
                probes = [probe] if probe is not None else []
            reply = llm.engine.submit(conversation, messages, options, tag=(self, key), probes=probes)
        except Exception as exc:  # noqa: BLE001 - InvalidInput goes back to the session
            self._out.put(("llm", [(key, "", None, exc, ())]))
            if words_key is not None:
                self._out.put(("llm_words", words_key, None))
            return
        with self._lock:
            if not reply.done:
                self._replies[key] = reply

    def _on_llm_cancel(self, key: int) -> None:
        with self._lock:
            reply = self._replies.pop(key, None)
        if reply is not None:
            self.host.llm.engine.cancel(reply)

    def _on_llm_words(self, key: int, session: Hashable, transcript: str, messages: list, tools: tuple) -> None:
        llm = self.host.llm
        if llm is None:
            self._out.put(("llm_words", key, None))
            return
        try:  # session ids are unique per front end only
            llm.probe_words((self.number, session), transcript, messages,
                            lambda p: self._out.put(("llm_words", key, p)), tools)
        except Exception:  # noqa: BLE001 - no score: the session ends the turn on the audio alone
            log.exception("end-of-turn score of the words failed")
            self._out.put(("llm_words", key, None))

    def _on_llm_release(self, session: Hashable) -> None:
        conversation = (self.number, session)
        with self._lock:
            self._sessions.discard(conversation)
        if self.host.llm is not None:
            self.host.llm.release(conversation)

    def _write(self) -> None:
        try:
            while (message := self._out.get()) is not None:
                send_parts(self.conn, frame(message))
                del message  # its audio views: their blocks go back to the pool now, not at the next message
        except OSError:
            pass

    def close(self) -> None:
        self._out.put(None)
        try:
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


# --------------------------------------------------------------------------- front-end process
class EngineClient:
    """A front end's end of the engine socket: sends requests, hands each result to its stage."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._writer: asyncio.StreamWriter | None = None
        #: message kind -> handler(message); stages register themselves.
        self.handlers: dict[str, Callable[[tuple], None]] = {}
        #: Called once when the engine process goes away (each stage fails its waiting callers).
        self.on_lost: list[Callable[[], None]] = []
        #: The engine process's latest report (``EngineHost.report``), for ``/metrics``.
        self.report: dict = {}

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

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    def send(self, message: Any) -> None:
        if not self.connected:
            raise ModelError("the engine process is not connected")
        assert self._writer is not None
        self._writer.writelines(frame(message))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                message = await read_message_async(reader)
                if message[0] == "report":
                    self.report = message[1]
                else:
                    self.handlers[message[0]](message)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:  # engine process gone: every waiting caller ends with an error
            if self._writer is not None:
                self._writer.close()
            for lost in self.on_lost:
                lost()


class SpeechText:
    """The front end's share of a voice: text -> phoneme ids, option checks, the engine's rate (no model)."""

    def __init__(self, cfg: Any) -> None:
        from tts_engine.frontend import TextFrontend
        from tts_engine.voice import Voice
        from base import models

        path = models.resolve_voice(cfg).path
        self.voice = Voice.load(path, models.voice_config_path(cfg, path))
        #: Rate of the engine's chunks: the voice's, or ``tts.output_rate`` (resampled in the engine).
        self.sample_rate = cfg.tts.output_rate or self.voice.sample_rate
        self.defaults = engine_defaults(SynthesisOptions.from_config(cfg.tts), cfg.tts.output_rate)
        if cfg.tts.zh_lexicon_path:
            from tts_engine.zh import configure

            configure(cfg.tts.zh_lexicon_path)
        self._frontend = TextFrontend(self.voice.config, max_text_chars=cfg.limits.max_text_chars)

    def sentence_ids(self, text: str) -> list[list[int]]:
        return list(self._frontend.sentence_ids(text))

    def output_rate(self, options: SynthesisOptions) -> int:
        """The rate the client gets, Hz; raises ``InvalidInput`` for options the engine would refuse."""
        return resolve_options(options, self.defaults, self.voice).sample_rate


class _Streams:
    """A remote stage's open streams: one queue per request key, fed by the link's messages."""

    def __init__(self, link: EngineClient, kind: str, lost: tuple) -> None:
        self.link = link
        self._queues: dict[int, asyncio.Queue] = {}
        self._keys = itertools.count()
        self._lost_item = lost  # what every open stream gets, after its key, when the engine goes away
        link.handlers[kind] = self._on_step
        link.on_lost.append(self._lost)

    def _on_step(self, message: tuple) -> None:
        for item in message[1]:
            q = self._queues.get(item[0])
            if q is not None:
                q.put_nowait(item)

    def _lost(self) -> None:
        for key, q in list(self._queues.items()):
            q.put_nowait((key, *self._lost_item))


class RemoteSpeech(_Streams):
    """``SpeechStage`` of a front end: phonemize here, synthesize in the engine process, resample here
    when the session asks for another rate than the engine's."""

    def __init__(self, link: EngineClient, text: SpeechText, text_worker: ModelWorker, inline_text_chars: int = 0) -> None:
        """``inline_text_chars``: see ``pipeline.speech.sentence_ids``."""
        super().__init__(link, "step", (ModelError("the engine process went away"),))
        self.text = text
        self.text_worker = text_worker
        self.inline_text_chars = inline_text_chars
        self.engine = text  # read by the hub for facts like the sample rate
        self.handoffs = 0

    def memory_report(self) -> dict | None:
        return self.link.report.get("tts_memory")

    def scheduled(self) -> int | None:
        return self.link.report.get("tts_in_flight", 0)

    def gc_report(self) -> dict | None:
        """The engine process's garbage-collection pauses (``pipeline.gc_pauses``), once reported."""
        return self.link.report.get("gc")

    def _on_step(self, message: tuple) -> None:
        self.handoffs += 1
        super()._on_step(message)

    async def stream(self, text: str, options: SynthesisOptions, cancel: threading.Event,
                     priority: int = NORMAL, timing: FirstAudioTiming | None = None) -> AsyncIterator[AudioChunk]:
        if not self.link.connected:
            raise ModelError("the engine process is not connected")
        rate = self.text.output_rate(options)
        sentences = await sentence_ids(self.text_worker, text, priority, cancel, self.inline_text_chars)
        if cancel.is_set() or not sentences:
            return
        if timing is not None:
            timing.mark("text")
        key = next(self._keys)
        q: asyncio.Queue = asyncio.Queue()
        self._queues[key] = q
        self.link.send(("speak", key, sentences, dataclasses.replace(options, sample_rate=None)))
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
                _, clause, final, pcm, (received, handed_out) = item
                if received is not None and timing is not None:
                    timing.mark("to_engine", received)
                    timing.mark("engine", handed_out)
                    timing.mark("from_engine")
                last = final and index == len(sentences) - 1
                if last and timing is not None:
                    timing.last_chunk(handed_out)
                chunk = AudioChunk(_int16(pcm), self.text.sample_rate, clause, final)
                yield resampler.process_chunk(chunk, last=last)
                index += final
            finished = index == len(sentences)
        finally:
            self._queues.pop(key, None)
            if not finished and self.link.connected:
                self.link.send(("cancel", key))


class RemoteAsr:
    """``BatchingAsr``'s interface in a front end: utterances are transcribed in the engine process,
    batched with every other front end's."""

    def __init__(self, link: EngineClient) -> None:
        self.link = link
        self._futures: dict[int, asyncio.Future] = {}
        self._keys = itertools.count()
        link.handlers["asr"] = self._on_result
        link.on_lost.append(self._lost)

    async def transcribe(self, audio: np.ndarray, language: str | None, priority: int = NORMAL,
                         cancel: threading.Event | None = None, prompt: str | None = None) -> Any:
        if cancel is not None and cancel.is_set():
            raise Cancelled("cancelled before transcription")
        key = next(self._keys)
        fut = asyncio.get_running_loop().create_future()
        self._futures[key] = fut
        try:
            self.link.send(("asr", key, audio.tobytes(), audio.dtype.str, language, priority, prompt))
            return await fut
        except asyncio.CancelledError:
            if self.link.connected:
                self.link.send(("asr_cancel", key))
            raise
        finally:
            self._futures.pop(key, None)

    def _on_result(self, message: tuple) -> None:
        _, key, result = message
        fut = self._futures.get(key)
        if fut is None or fut.done():
            return
        if isinstance(result, BaseException):
            fut.set_exception(result)
        else:
            fut.set_result(result)

    def _lost(self) -> None:
        for fut in self._futures.values():
            if not fut.done():
                fut.set_exception(ModelError("the engine process went away"))

    def pending(self) -> int:
        """This front end's utterances in the engine process."""
        return len(self._futures)

    def idle(self) -> bool:
        """Whether the engine process's ASR has nothing queued (partial transcripts wait for that)."""
        report = self.link.report.get("asr") or {}
        return not self._futures and not report.get("pending")

    def report(self) -> dict | None:
        """The engine process's ASR counters (one second old at most)."""
        return self.link.report.get("asr")

    def close(self) -> None:
        pass


class RemoteLlm(_Streams):
    """``BatchedLlm``'s interface in a front end: replies are generated in the LLM process, in one
    batch with every other front end's conversations; each step's tokens arrive in one message."""

    def __init__(self, link: EngineClient) -> None:
        super().__init__(link, "llm", ("", None, ModelError("the LLM process went away"), ()))
        self._words: dict[int, asyncio.Future] = {}
        link.handlers["llm_words"] = self._on_words
        link.on_lost.append(lambda: [self._on_words(("llm_words", k, None)) for k in list(self._words)])

    scores_words = True  # the LLM process says None when its model cannot

    async def end_of_turn(self, session: Hashable, transcript: str, conversation: list[dict],
                          tools: tuple[dict, ...] = ()) -> float | None:
        """``BatchedLlm.end_of_turn`` in the LLM process."""
        if not self.link.connected:
            return None
        key = next(self._keys)
        future = self._words[key] = asyncio.get_running_loop().create_future()
        try:
            self.link.send(("llm_words", key, session, transcript, conversation, tuple(tools)))
            return await future
        finally:
            self._words.pop(key, None)

    def _on_words(self, message: tuple) -> None:
        future = self._words.pop(message[1], None)
        if future is not None and not future.done():
            future.set_result(message[2])

    async def stream(self, session: Hashable, messages: list[dict], max_tokens: int,
                     cancel: threading.Event, priority: int = NORMAL,
                     on_done: Callable[[Any], None] | None = None, tools: tuple[dict, ...] = (),
                     tool_choice: str | dict | None = None, words: asyncio.Future | None = None) -> AsyncIterator[Any]:
        key = next(self._keys)
        q: asyncio.Queue = asyncio.Queue()
        self._queues[key] = q
        done = False
        words_key = None
        if words is not None:  # answered by _on_words, or None when the link goes (on_lost)
            if self.link.connected:
                words_key = next(self._keys)
                self._words[words_key] = words
            elif not words.done():
                words.set_result(None)
        try:
            self.link.send(("llm", key, session, messages, max_tokens, priority, tuple(tools), tool_choice, words_key))
            while not cancel.is_set():
                try:
                    _, text, stats, error, calls = q.get_nowait() if not q.empty() else await asyncio.wait_for(
                        q.get(), CANCEL_POLL_S)
                except TimeoutError:
                    continue
                if text:
                    yield text
                for call in calls:
                    yield call
                if stats is not None or error is not None:
                    done = True
                    if stats is not None and on_done is not None:
                        on_done(stats)
                    if error is not None:
                        raise error
                    return
        finally:
            self._queues.pop(key, None)
            if not done and self.link.connected:
                self.link.send(("llm_cancel", key))

    def prefill(self, session: Hashable, messages: list[dict]) -> None:
        pass  # not sent to the LLM process (yet): its next turn reads a cut history itself

    def release(self, session: Hashable) -> None:
        if self.link.connected:
            self.link.send(("llm_release", session))

    def pending(self) -> int:
        """This front end's replies in the engine process."""
        return len(self._queues)

    def report(self) -> dict | None:
        """The engine process's ``BatchedChat.report`` (one second old at most)."""
        return self.link.report.get("llm")

    def close(self) -> None:
        pass


def _int16(raw: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(raw, dtype=np.int16)
