"""The hub: one asyncio ``websockets`` server on one port. It moves bytes and schedules work.

HTTP routes (answered during the opening handshake, no upgrade):
  ``GET /``            the browser client (``web_client/``), other static files below it
  ``GET /health``      liveness: 200 while the process serves
  ``GET /ready``       readiness: 200 when the models of ``server.stages`` are loaded (in every
                       front-end process, ``server.front_ends``), the LLM server answers
                       (``llm.backend = "openai"``) and a session slot is free, else 503
  ``GET /metrics``     Prometheus text
WebSocket: ``/v1/realtime`` (also ``/realtime``, as the openai SDK builds ``{base}/realtime``).

Admission: over ``limits.max_sessions`` the upgrade gets HTTP 503 + ``Retry-After``;
a wrong bearer token 401; a browser Origin that is not loopback, the server's own page or in
``server.allowed_origins`` 403 (pipeline/origin.py).
Per connection: a reader task (frames -> protocol core -> session) and a writer task
(bounded queue -> protocol core -> frames). A client that stops reading fills the
queue and is closed with 1008. Speech knows nothing of this module.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import mimetypes
import signal
import uuid
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from pipeline import gc_pauses, heap
from pipeline.deflate import AudioPassthroughDeflateFactory
from pipeline.engines import Engines
from pipeline.loadwatch import LoopLagMonitor, QueueDepthCollector, SendCounters
from pipeline.origin import CONFIG_KEY as ORIGINS_KEY, refused_origin
from pipeline.outbox import Outbox
from pipeline.conversation import AfterSent
from pipeline.session import Session
from pipeline.trace import Metrics, TraceSink
from pipeline.voices import VoicesCollector
from realtime.protocol import BINARY_AUDIO_EVENTS, RealtimeProtocol
from realtime.session_schema import connect_options
from realtime.wire import ProtocolError
from base.config import Config

log = logging.getLogger(__name__)

WS_PATHS = ("/v1/realtime", "/realtime")
WEB_ROOT = Path(__file__).resolve().parent.parent / "web_client"
CLOSE_GOING_AWAY, CLOSE_POLICY = 1001, 1008


def _response(status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> Response:
    headers = Headers({"Content-Type": content_type, "Content-Length": str(len(body)),
                       "Cache-Control": "no-store", **(extra or {})})
    return Response(status, HTTPStatus(status).phrase, headers, body)


def _text(status: int, text: str, extra: dict[str, str] | None = None) -> Response:
    return _response(status, (text + "\n").encode(), "text/plain; charset=utf-8", extra)


class SessionCount:
    """Open sessions: of this process, or of every front-end process when given a shared counter
    (a ``multiprocessing.Value("i")``), so that ``limits.max_sessions`` holds across front ends."""

    def __init__(self, shared=None) -> None:  # noqa: ANN001 - multiprocessing.Value
        self._shared = shared
        self._local = 0

    def add(self, n: int) -> None:
        self._local += n
        if self._shared is not None:
            with self._shared.get_lock():
                self._shared.value += n

    @property
    def value(self) -> int:
        return self._shared.value if self._shared is not None else self._local


class Hub:
    """The server. ``await hub.start()``, then ``await hub.serve_until_signal()`` or ``await hub.stop()``.

    ``shared_sessions``: a counter shared by several front-end processes on one port (``server.front_ends``);
    ``shared_loaded``: how many of them have loaded (``/ready`` waits for all).
    """

    def __init__(self, cfg: Config, engines: Engines, shared_sessions=None, shared_loaded=None) -> None:  # noqa: ANN001
        self.cfg = cfg
        self.engines = engines
        self.shared_loaded = shared_loaded
        self.open_sessions = SessionCount(shared_sessions)
        self._reserved: set[ServerConnection] = set()  # admitted upgrades, until their handler ends
        self.metrics = Metrics()
        self.traces = TraceSink(self.metrics, cfg.trace.path)
        self.metrics.watch_tts_memory(self.tts_memory_report)
        self.metrics.watch_llm(self.llm_report)
        self.metrics.watch_asr(self.asr_report)
        on_gpu = cfg.tts.backend == "cuda" and cfg.tts.device != "cpu"
        self.metrics.register(VoicesCollector(lambda: self.engines.voices, "gpu" if on_gpu else "cpu"))
        self.traces.gpu_report = self.tts_memory_report
        self.sessions: dict[str, Session] = {}
        self.metrics.watch_process()
        gc_pauses.PAUSES.install()
        self.metrics.watch_gc(self.gc_reports)
        self.sent = SendCounters(self.metrics.registry)
        self.loop_lag = LoopLagMonitor(self.metrics.registry)
        self.metrics.register(QueueDepthCollector(
            lambda: [s.outbox.qsize() for s in list(self.sessions.values())], self.stage_depths))
        self.web_root = Path(cfg.server.web_root) if cfg.server.web_root else WEB_ROOT
        self.draining = False
        self._server: Server | None = None
        self._conn_tasks: set[asyncio.Task] = set()
        self._heap_trimmer: asyncio.Task | None = None

    def tts_memory_report(self) -> dict | None:
        """The GPU TTS engine's memory figures once loaded; None for engines without (CPU)."""
        speech = self.engines.speech
        return speech.memory_report() if speech is not None else None

    def gc_reports(self) -> dict[str, dict]:
        """Garbage-collection pauses by process: this one and, with front ends, the engine process's."""
        reports = {"front_end" if self.cfg.server.front_ends > 1 else "server": gc_pauses.PAUSES.snapshot()}
        engine = getattr(self.engines.speech, "gc_report", None)
        if engine is not None and (report := engine()) is not None:
            reports["engine"] = report
        return reports

    def stage_depths(self) -> dict[str, int]:
        """Jobs queued or running per loaded stage; ``tts_gpu``: requests in the GPU scheduler."""
        e = self.engines
        depths = {name: w.pending() for name, w in (("asr", e.asr), ("llm", e.llm), ("tts", e.tts)) if w is not None}
        scheduled = e.speech.scheduled() if e.speech is not None else None
        if scheduled is not None:
            depths["tts_gpu"] = scheduled
        return depths

    def asr_report(self) -> dict | None:
        """The ASR's batching counters (this process's, or the engine process's); None without ASR."""
        report = getattr(self.engines.asr, "report", None)
        return report() if report is not None else None

    def llm_report(self) -> dict | None:
        """The batched LLM's memory and batch figures once loaded; None otherwise (fakes)."""
        report = getattr(self.engines.llm, "report", None)  # BatchedLlm, or the engine process's
        return report() if report is not None else None

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        self._server = await serve(
            self._handle,
            self.cfg.server.host,
            self.cfg.server.port,
            process_request=self._process_request,
            process_response=self._process_response,
            # Twice the protocol limit: an oversize message gets an error event, a huge one 1009.
            max_size=2 * self.cfg.limits.max_message_bytes,
            # permessage-deflate is accepted when offered, but audio is sent uncompressed (pipeline.deflate).
            compression=None,
            extensions=[AudioPassthroughDeflateFactory()],
            # Several front-end processes listen on the same port; the kernel spreads connections.
            reuse_port=self.cfg.server.front_ends > 1,
            max_queue=64,
            ping_interval=20,
            ping_timeout=20,
        )
        self.loop_lag.start()
        # This process's free C heap goes back to the kernel while no session is open (pipeline/heap.py).
        self._heap_trimmer = asyncio.create_task(heap.trim_when_idle(lambda: len(self.sessions)))
        log.info("voxloop listening on ws://%s:%d%s", self.cfg.server.host, self.port, WS_PATHS[0])

    async def serve_until_signal(self) -> None:
        """Serve until SIGINT/SIGTERM, then drain and return (exit code 0)."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("signal received: draining (grace %.1f s)", self.cfg.server.shutdown_grace_s)
        await self.stop()

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting, let turns in flight finish within the grace period, close with 1001."""
        grace = self.cfg.server.shutdown_grace_s if grace_s is None else grace_s
        self.draining = True
        if self._server is not None:
            self._server.close(close_connections=False)
        sessions = list(self.sessions.values())
        if sessions:
            busy = [s.wait_idle() for s in sessions]
            try:
                await asyncio.wait_for(asyncio.gather(*busy), timeout=grace)
            except TimeoutError:
                log.warning("grace period over: closing %d sessions with turns in flight", len(sessions))
        for s in list(self.sessions.values()):
            await s.close(CLOSE_GOING_AWAY, "server shutting down")
        if self._conn_tasks:
            await asyncio.wait(self._conn_tasks, timeout=5)
        if self._server is not None:
            await self._server.wait_closed()
        self.loop_lag.stop()
        if self._heap_trimmer is not None:
            self._heap_trimmer.cancel()
        self.engines.close()

    # ------------------------------------------------------------------ HTTP
    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path, _, query = request.path.partition("?")
        if path in WS_PATHS:
            refused = self._admit(request, query)
            if refused is None:  # the slot is taken now, not when the handler starts (other front ends count too)
                self.open_sessions.add(1)
                self._reserved.add(connection)
            return refused
        if path == "/health":
            return _text(200, "ok")
        if path == "/ready":
            ready, why = self.ready()
            return _text(200 if ready else 503, why)
        if path == "/metrics":
            return _response(200, self.metrics.exposition(), CONTENT_TYPE_LATEST)
        return self._static(path)

    def _process_response(self, connection: ServerConnection, request: Request, response: Response) -> None:
        if response.status_code != 101:  # the upgrade failed after admission
            self._release_slot(connection)

    def _release_slot(self, connection: ServerConnection) -> None:
        """Give back the session slot taken when ``connection`` was admitted (once)."""
        if connection in self._reserved:
            self._reserved.discard(connection)
            self.open_sessions.add(-1)

    def ready(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        if not self.engines.loaded:
            return False, "models loading"
        problem = self.engines.not_ready()
        if problem is not None:
            return False, problem
        if self.shared_loaded is not None and self.shared_loaded.value < self.cfg.server.front_ends:
            return False, f"front ends loading: {self.shared_loaded.value} of {self.cfg.server.front_ends} ready"
        free = self.cfg.limits.max_sessions - self.open_sessions.value
        if free <= 0:
            return False, "full: 0 session slots free"
        return True, f"ready: {free} session slots free"

    def _admit(self, request: Request, query: str) -> Response | None:
        if request.headers.get("Upgrade", "").lower() != "websocket":
            return _text(426, "this path needs a WebSocket upgrade", {"Upgrade": "websocket"})
        token = self.cfg.server.auth_token
        # Browsers cannot set headers on a WebSocket: they may pass ?token= instead.
        offered = parse_qs(query).get("token", [None])[0]
        bearer = request.headers.get("Authorization", "")
        if token is not None and not (hmac.compare_digest(bearer, f"Bearer {token}")
                                      or (offered is not None and hmac.compare_digest(offered, token))):
            self.metrics.rejected.labels(reason="auth").inc()
            return _text(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
        try:
            connect_options(parse_qs(query))
        except ProtocolError as exc:
            return _text(400, str(exc))
        origin = refused_origin(request.headers, self.cfg.server)
        if origin is not None:
            self.metrics.rejected.labels(reason="origin").inc()
            log.warning("refused a WebSocket from origin %r: add it to %s to allow it", origin, ORIGINS_KEY)
            return _text(403, f"origin {origin} is not allowed (server setting {ORIGINS_KEY})")
        retry = {"Retry-After": str(self.cfg.limits.retry_after_s)}
        if not self.engines.loaded:
            self.metrics.rejected.labels(reason="loading").inc()
            return _text(503, "models are still loading, retry later", retry)
        if self.draining or self.open_sessions.value >= self.cfg.limits.max_sessions:
            self.metrics.rejected.labels(reason="full").inc()
            return _text(503, "server full, retry later", retry)
        return None

    def _static(self, path: str) -> Response:
        rel = "index.html" if path in ("", "/") else path.lstrip("/")
        root = self.web_root.resolve()
        target = (root / rel).resolve()
        if root not in target.parents or not target.is_file():
            return _text(404, "not found")
        ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype.endswith("javascript"):
            ctype += "; charset=utf-8"
        return _response(200, target.read_bytes(), ctype)

    # ------------------------------------------------------------------ WebSocket
    async def _handle(self, ws: ServerConnection) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conn_tasks.add(task)
        session_id = "sess_" + uuid.uuid4().hex[:20]
        protocol = RealtimeProtocol.from_limits(self.cfg.limits)
        outbox = Outbox(self.cfg.limits.send_queue_messages, self.cfg.limits.send_stall_s)
        session = Session(session_id, self.cfg, self.engines, outbox, self.metrics, self.traces,
                          close=lambda code, reason: ws.close(code, reason))
        self.sessions[session_id] = session
        self.metrics.sessions.inc()
        self.metrics.sessions_total.inc()
        writer = asyncio.create_task(self._write(ws, protocol, outbox, session.on_sent, session.sendable),
                                     name=f"{session_id}-writer")
        lifetime = self.cfg.limits.max_session_minutes * 60
        try:
            session.start(protocol, connect_options(parse_qs(ws.request.path.partition("?")[2])))
            async with asyncio.timeout(lifetime):
                async for message in ws:
                    events = (protocol.receive_bytes(message) if isinstance(message, bytes)
                              else protocol.receive_text(message))
                    for event in events:
                        session.handle(event)
        except TimeoutError:
            await ws.close(CLOSE_POLICY, f"session limit of {self.cfg.limits.max_session_minutes:g} min reached")
        except ConnectionClosed:
            pass
        finally:
            await session.shutdown()
            writer.cancel()
            self.sessions.pop(session_id, None)
            self._release_slot(ws)
            self.metrics.sessions.dec()
            self._conn_tasks.discard(task)

    async def _write(self, ws: ServerConnection, protocol: RealtimeProtocol, outbox: asyncio.Queue,
                     on_sent, sendable) -> None:
        """Serialize and send queued events in order, skipping those ``sendable(event)`` refuses
        (audio of a cancelled response); ``on_sent(event)`` after each hit the socket."""
        count = self.sent.count
        try:
            while True:
                event = await outbox.get()
                if isinstance(event, AfterSent):
                    event.run()
                    continue
                if not sendable(event):
                    continue
                frame = protocol.send(event)
                await ws.send(frame)
                count(frame, isinstance(event, BINARY_AUDIO_EVENTS))
                on_sent(event)
        except ConnectionClosed:
            pass
