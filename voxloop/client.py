"""Asyncio client for the voxloop Realtime WebSocket API (end-to-end tests, benchmarks, tools).

    async with RealtimeClient.connect("ws://127.0.0.1:8765/v1/realtime") as client:
        await client.update_session(audio={"input": {"turn_detection": None}})  # push-to-talk
        await client.send_audio(pcm, sample_rate=16000)      # int16 mono, resampled to the session rate
        await client.commit()
        reply = await client.collect_response(timeout_s=30)  # Reply: transcript, pcm, metrics…

Function tools: ``RealtimeClient(url, tools=[get_weather, …])`` (plain functions, or a
``voxloop.client_tools.Toolbox``) offers them in the session; ``collect_turn`` runs the calls a
reply makes, sends their outputs and the next ``response.create``, until a reply calls nothing.

Frames are parsed and built by the protocol core shared with the server (``realtime.protocol``,
``realtime.events``), so the wire format has one definition. Server events arrive in
order through :meth:`RealtimeClient.events` / :meth:`wait_for` / :meth:`collect_response`
(one consumer at a time). Events answering a call of this client go to that call instead:
``session.created`` / ``session.updated`` to ``open`` / ``update_session`` (the session is
in :attr:`RealtimeClient.session`), ``x.tts.*`` events and errors about a request to
``speak``, which may therefore run concurrently with a conversation.

Back-pressure: at most ``max_pending_events`` unread events are buffered; past that the
reader stops reading the socket, and a server whose send queue fills closes the
connection (1008). Errors are ``base.errors`` types (see :func:`error_from_event`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np
import soxr
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from realtime import events as ev
from realtime.items import ContentPart, MessageItem, ResponseOptions
from realtime.tools import FunctionCallOutputItem, ToolChoiceFunction
from realtime.protocol import parse_server_frame
from realtime.session_schema import SessionConfig
from realtime.wire import ErrorCode, new_id, pcm16_bytes
from voxloop.client_tools import CallResult, Toolbox
from voxloop.client_types import (
    Connecting,
    Reply,
    ReplyBuilder,
    RetryPolicy,
    TtsResult,
    deep_merge,
    drain,
    error_from_event,
    event_matches,
    event_type_name,
    retry_after_s,
)
from base.errors import ConnectionFailed, InvalidInput, Overloaded, VoxloopError

__all__ = ["RealtimeClient", "Reply", "RetryPolicy", "TtsResult", "error_from_event"]

log = logging.getLogger(__name__)
_END = object()  # reader -> consumers: the connection is over
#: Largest audio piece per message sent by ``send_audio``, ms (the server refuses messages > 1 MiB).
MAX_APPEND_MS = 1000


class RealtimeClient:
    """One WebSocket connection to ``/v1/realtime`` (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        session: Mapping[str, Any] | None = None,
        binary_audio: bool = False,
        tools: Toolbox | list[Any] | None = None,
        x_events: bool = True,
        retry: RetryPolicy | None = None,
        open_timeout_s: float = 10.0,
        max_pending_events: int = 4096,
    ) -> None:
        """``session``: partial session applied at connect (``session.update``);
        ``binary_audio``: negotiate the binary fast path; ``tools``: functions the model may call
        (``collect_turn`` runs them); ``x_events``: ask for the ``x.*`` server events (turn metrics,
        paused/resumed/cleared playback); ``retry``: connect/overload policy."""
        self.url = url
        self.token = token
        self.retry = retry or RetryPolicy()
        self.open_timeout_s = open_timeout_s
        self._settings: dict[str, Any] = deep_merge({}, dict(session or {}))
        if binary_audio:
            self._settings["x_binary_audio"] = True
        self.toolbox = tools if isinstance(tools, Toolbox) else Toolbox(list(tools or []))
        if self.toolbox.tools:
            self._settings["tools"] = self.toolbox.session_tools()
        if x_events:
            self._settings.setdefault("x_events", True)
        self._max_pending = max_pending_events
        #: The effective session (from the latest ``session.created`` / ``session.updated``).
        self.session: SessionConfig = SessionConfig()
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task | None = None
        self._events: asyncio.Queue[Any] = asyncio.Queue(max_pending_events)
        self._unread: collections.deque[Any] = collections.deque()
        self._ended: BaseException | None = None
        self._routes: dict[str, asyncio.Queue[Any]] = {}  # request_id / client event_id -> queue
        self._update: tuple[str, asyncio.Future[SessionConfig]] | None = None
        self._update_lock = asyncio.Lock()
        self._created: asyncio.Future[SessionConfig] | None = None

    # ------------------------------------------------------------------ connection
    @classmethod
    def connect(cls, url: str, **kwargs: Any) -> Connecting:
        """``async with RealtimeClient.connect(url, …) as c`` (closes at exit) or ``c = await …``.

        Keyword arguments are those of the constructor.
        """
        return Connecting(cls(url, **kwargs))

    @property
    def ended(self) -> BaseException | None:
        """Why the connection ended (a ``ConnectionFailed`` with its ``close_code``), None while it is open."""
        return self._ended

    @property
    def response_headers(self):  # noqa: ANN201 - websockets' Headers, or None before the upgrade
        """The HTTP headers of the server's upgrade response (e.g. the replica a load balancer chose)."""
        response = getattr(self._ws, "response", None)
        return None if response is None else response.headers

    @property
    def compressed(self) -> bool:
        """The connection negotiated permessage-deflate (this client offers none: it never needs it; a bench
        that makes it offer, as browsers do, reads here whether the server took it)."""
        return self._ws is not None and bool(self._ws.protocol.extensions)

    @property
    def connected(self) -> bool:
        return self._ws is not None and self._ended is None

    async def open(self) -> None:
        """Connect (retrying per ``self.retry``), wait for ``session.created``, apply the settings.

        Retries a full server (HTTP 503, honouring ``Retry-After``) and unreachable servers;
        raises ``Overloaded`` / ``ConnectionFailed`` when attempts run out, at once for 401/403/404.
        """
        for attempt in range(self.retry.attempts):
            try:
                await self._open_once()
                break
            except (Overloaded, ConnectionFailed) as exc:
                retryable = isinstance(exc, Overloaded) or exc.status is None
                if not retryable or attempt + 1 >= self.retry.attempts:
                    raise
                retry_after = exc.retry_after_ms / 1000 if isinstance(exc, Overloaded) else None
                delay = self.retry.delay_s(attempt, retry_after)
                log.info("connect to %s failed (%s); retrying in %.2f s", self.url, exc, delay)
                await asyncio.sleep(delay)
        if self._settings:
            await self.update_session(**self._settings)

    async def _open_once(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        try:
            ws = await ws_connect(self.url, additional_headers=headers, compression=None,
                                  open_timeout=self.open_timeout_s, max_size=16 * 2**20, proxy=None)
        except InvalidStatus as exc:
            status = exc.response.status_code
            body = exc.response.body.decode("utf-8", "replace").strip() if exc.response.body else ""
            if status == 503:
                retry_s = retry_after_s(exc.response.headers.get("Retry-After"))
                raise Overloaded(f"server full: {body or 'HTTP 503'}",
                                 retry_after_ms=round(1000 * retry_s)) from None
            raise ConnectionFailed(f"server refused the WebSocket: HTTP {status} {body}".strip(),
                                   status=status) from None
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            raise ConnectionFailed(f"cannot connect to {self.url}: {exc}") from None
        self._reset()
        self._ws = ws
        self._created = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read(ws), name="voxloop-client-reader")
        try:
            await asyncio.wait_for(asyncio.shield(self._created), self.open_timeout_s)
        except TimeoutError:
            await self.close()
            raise ConnectionFailed(f"no session.created from {self.url} within {self.open_timeout_s} s") from None

    def _reset(self) -> None:
        self._events = asyncio.Queue(self._max_pending)
        self._unread.clear()
        self._ended = None
        self._routes.clear()
        self._update = None

    async def close(self) -> None:
        """Close the WebSocket (code 1000) and stop the reader."""
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            try:
                await asyncio.wait_for(self._reader, 5)
            except (TimeoutError, asyncio.CancelledError):
                self._reader.cancel()
        self._reader = None

    async def reconnect(self) -> None:
        """Close (if open) and connect again, re-applying every setting given so far.

        A new connection is a new server session: the conversation history starts empty.
        """
        await self.close()
        await self.open()

    # ------------------------------------------------------------------ reading
    async def _read(self, ws: ClientConnection) -> None:
        try:
            async for frame in ws:
                try:
                    event = parse_server_frame(frame)
                except VoxloopError as exc:  # a server bug: surface it to the consumer
                    await self._events.put(exc)
                    continue
                await self._route(event)
            self._ended = ConnectionFailed("connection closed", close_code=ws.close_code)
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd else None
            reason = exc.rcvd.reason if exc.rcvd else "no close frame"
            self._ended = ConnectionFailed(f"connection closed ({code} {reason})".strip(), close_code=code)
        finally:
            if self._ended is None:
                self._ended = ConnectionFailed("connection reader stopped")
            self._fail_waiters(self._ended)
            await self._events.put(_END)

    def _fail_waiters(self, exc: BaseException) -> None:
        for fut in (self._created, self._update[1] if self._update else None):
            if fut is not None and not fut.done():
                fut.set_exception(exc)
        for q in self._routes.values():
            q.put_nowait(_END)

    async def _route(self, event: ev.ServerEvent) -> None:
        if isinstance(event, ev.SessionCreated | ev.SessionUpdated):
            self.session = event.session
            waiter = self._created if isinstance(event, ev.SessionCreated) else self._update and self._update[1]
            if waiter and not waiter.done():
                waiter.set_result(event.session)
                return  # answered open() / update_session(); ``self.session`` has it
        if isinstance(event, ev.XTtsAudioDelta | ev.XTtsDone) and event.request_id in self._routes:
            self._routes[event.request_id].put_nowait(event)
            return
        if isinstance(event, ev.ErrorEvent):
            client_id = event.error.event_id
            if self._update and client_id == self._update[0] and not self._update[1].done():
                self._update[1].set_exception(error_from_event(event))
                return
            if client_id in self._routes:
                self._routes[client_id].put_nowait(event)
                return
        await self._events.put(event)

    async def _next(self, deadline: float | None) -> ev.ServerEvent:
        """The next unrouted event; raises TimeoutError at ``deadline`` (monotonic s)."""
        if self._unread:
            return self._unread.popleft()
        if self._ws is None:
            raise ConnectionFailed("not connected: call open() or use RealtimeClient.connect()")
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        async with asyncio.timeout(timeout):
            item = await self._events.get()
        if item is _END:
            self._events.put_nowait(_END)  # every later read sees the end too
            raise self._ended or ConnectionFailed("connection closed")
        if isinstance(item, BaseException):
            raise item
        return item

    async def events(self) -> AsyncIterator[ev.ServerEvent]:
        """Server events in order (all but those routed to ``speak``/``update_session``).

        Ends when the connection closes normally (1000/1001); raises ``ConnectionFailed`` otherwise.
        """
        while True:
            try:
                yield await self._next(None)
            except ConnectionFailed as exc:
                if exc.close_code in (1000, 1001):
                    return
                raise

    async def wait_for(self, event_type: str | type | tuple[type, ...], timeout_s: float = 30.0,
                       raise_on_error: bool = True) -> Any:
        """Skip events until one of ``event_type`` (wire type string or event class) arrives.

        An ``error`` event raises its typed exception (``error_from_event``) unless
        ``raise_on_error`` is False or ``"error"`` is what is awaited. Raises TimeoutError.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                event = await self._next(deadline)
            except TimeoutError:
                raise TimeoutError(f"no {event_type_name(event_type)} within {timeout_s:g} s") from None
            if event_matches(event, event_type):
                return event
            if raise_on_error and isinstance(event, ev.ErrorEvent):
                raise error_from_event(event)

    def unread(self, event: ev.ServerEvent) -> None:
        """Put ``event`` back at the front: the next read returns it."""
        self._unread.appendleft(event)

    async def collect_response(self, timeout_s: float = 60.0, metrics_timeout_s: float = 0.5,
                               raise_on_error: bool = True) -> Reply:
        """Read one response to its ``response.done`` (plus the ``x.turn.metrics`` after it).

        Also picks up the user's transcript if it arrives first. A user turn whose
        transcript is empty gets no response from the server: that returns a Reply with
        status ``no_response``, reason ``empty_transcript``. Raises TimeoutError.
        """
        builder = ReplyBuilder(self.session.output_rate)
        deadline = time.monotonic() + timeout_s
        while not builder.finished:
            try:
                event = await self._next(deadline)
            except TimeoutError:
                raise TimeoutError(f"response not done within {timeout_s:g} s "
                                   f"(so far: {builder.progress()})") from None
            if raise_on_error and isinstance(event, ev.ErrorEvent):
                raise error_from_event(event)
            builder.feed(event, time.monotonic())
        reply = builder.reply()
        if reply.status != "no_response" and metrics_timeout_s > 0:
            reply.metrics = await self._turn_metrics(reply.response_id, metrics_timeout_s)
        return reply

    async def _turn_metrics(self, response_id: str, timeout_s: float) -> dict[str, Any]:
        """``x.turn.metrics`` of ``response_id`` if it is the next event (else left unread)."""
        try:
            event = await self._next(time.monotonic() + timeout_s)
        except (TimeoutError, ConnectionFailed):
            return {}
        if isinstance(event, ev.XTurnMetrics) and event.response_id == response_id:
            return dict(event.metrics)
        self.unread(event)
        return {}

    # ------------------------------------------------------------------ sending
    async def send_event(self, event: ev.ClientEvent) -> None:
        """Send one client event as JSON text (the low-level call behind every helper)."""
        await self._send(ev.serialize(event))

    async def _send(self, frame: str | bytes) -> None:
        if self._ws is None or self._ended is not None:
            raise self._ended or ConnectionFailed("not connected: call open() or use RealtimeClient.connect()")
        try:
            await self._ws.send(frame)
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd else None
            raise ConnectionFailed(f"connection closed while sending ({code})", close_code=code) from None

    async def update_session(self, **partial: Any) -> SessionConfig:
        """``session.update`` with a partial session (nested dicts merge on the server).

        Example: ``update_session(instructions="Be brief.", audio={"input": {"turn_detection": None}})``.
        Returns the session from ``session.updated``; a rejected update raises ``ProtocolError``.
        """
        ev.SessionUpdate.from_dict({"session": {"type": "realtime", **partial}})  # bad values raise here
        async with self._update_lock:
            event_id = new_id("client")
            fut: asyncio.Future[SessionConfig] = asyncio.get_running_loop().create_future()
            self._update = (event_id, fut)
            try:
                await self.send_event(ev.SessionUpdate(session={"type": "realtime", **partial},
                                                       event_id=event_id))
                session = await asyncio.wait_for(fut, self.open_timeout_s)
            finally:
                self._update = None
        self._settings = deep_merge(self._settings, dict(partial))
        return session

    def _to_session_rate(self, pcm: np.ndarray, sample_rate: int) -> np.ndarray:
        if not isinstance(pcm, np.ndarray) or pcm.ndim != 1 or pcm.dtype != np.int16:
            raise InvalidInput("audio must be a 1-D int16 numpy array (mono PCM16)")
        rate = self.session.input_rate
        if sample_rate == rate:
            return pcm
        return soxr.resample(pcm, sample_rate, rate, quality="HQ")

    async def _send_pcm(self, pcm: np.ndarray) -> None:
        """Append int16 audio already at the session input rate (binary frame or base64 JSON)."""
        if self.session.x_binary_audio:
            await self._send(pcm16_bytes(pcm))
        else:
            await self.send_event(ev.InputAudioBufferAppend(pcm=pcm))

    async def send_audio(self, pcm_int16: np.ndarray, sample_rate: int) -> None:
        """Append mono int16 audio at ``sample_rate`` Hz, resampled to the session input rate.

        Each call is resampled on its own: to stream one signal in pieces, pass it whole to
        :meth:`stream_audio` or send it at the session rate (``self.session.input_rate``).
        """
        pcm = self._to_session_rate(pcm_int16, sample_rate)
        step = self.session.input_rate * MAX_APPEND_MS // 1000
        for start in range(0, len(pcm), step):
            await self._send_pcm(pcm[start:start + step])

    async def stream_audio(self, pcm: np.ndarray, sample_rate: int, realtime: bool = True,
                           chunk_ms: int = 20) -> float:
        """Send audio in ``chunk_ms`` pieces, paced like a microphone when ``realtime``.

        Each piece leaves when its last sample would have been recorded. Returns the
        monotonic time (s) the last sample was sent: the end of speech for latency figures.
        """
        pcm = self._to_session_rate(pcm, sample_rate)
        rate = self.session.input_rate
        step = max(1, rate * chunk_ms // 1000)
        start = time.monotonic()
        for offset in range(0, len(pcm), step):
            piece = pcm[offset:offset + step]
            if realtime:
                due = start + (offset + len(piece)) / rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            await self._send_pcm(piece)
        return time.monotonic()

    async def commit(self) -> None:
        """``input_audio_buffer.commit``: end the user's push-to-talk turn."""
        await self.send_event(ev.InputAudioBufferCommit())

    async def clear(self) -> None:
        """``input_audio_buffer.clear``: drop uncommitted input audio."""
        await self.send_event(ev.InputAudioBufferClear())

    async def create_response(self, instructions: str | None = None, text_only: bool = False,
                              out_of_band: bool = False, tool_choice: Any = None) -> None:
        """``response.create``; ``out_of_band``: the reply is not added to the history; ``tool_choice``:
        ``"required"``, ``"none"``, ``"auto"`` or a function's name, for this response."""
        if isinstance(tool_choice, str) and tool_choice not in ("auto", "none", "required"):
            tool_choice = ToolChoiceFunction(name=tool_choice)
        opts = ResponseOptions(instructions=instructions, output_modalities=("text",) if text_only else None,
                               conversation="none" if out_of_band else None, tool_choice=tool_choice)
        await self.send_event(ev.ResponseCreate(response=opts if opts != ResponseOptions() else None))

    async def collect_turn(self, timeout_s: float = 60.0, max_rounds: int = 4) -> Reply:
        """``collect_response``, and while the reply calls functions of ``tools``: run them, send each
        output (``function_call_output``) and ``response.create``, and collect the next reply. Returns
        the last reply; its ``tool_results`` lists every call of the turn with its output."""
        return await self.answer_calls(await self.collect_response(timeout_s), timeout_s, max_rounds)

    async def answer_calls(self, reply: Reply, timeout_s: float = 60.0, max_rounds: int = 4) -> Reply:
        """``collect_turn`` from a reply already collected: ``reply`` itself when it calls nothing."""
        results: list[CallResult] = []
        for _ in range(max_rounds):
            if not reply.calls or reply.status != "completed":
                break
            results += await self.send_call_outputs(reply.calls)
            await self.send_event(ev.ResponseCreate())
            reply = await self.collect_response(timeout_s)
        reply.tool_results = results
        return reply

    async def send_call_outputs(self, calls: list[Any]) -> list[CallResult]:
        """Run ``calls`` (``function_call`` items) with ``tools`` and send each output; no response.create."""
        results = []
        for call in calls:
            output = await self.toolbox.run(call.name, call.arguments)
            results.append(CallResult(call.call_id, call.name, call.arguments, output))
            await self.send_event(ev.ConversationItemCreate(
                item=FunctionCallOutputItem(call_id=call.call_id, output=output)))
        return results

    async def send_text(self, text: str, respond: bool = True) -> None:
        """A user text message (``conversation.item.create``), then ``response.create``."""
        item = MessageItem(role="user", content=(ContentPart(type="input_text", text=text),))
        await self.send_event(ev.ConversationItemCreate(item=item))
        if respond:
            await self.send_event(ev.ResponseCreate())

    async def cancel_response(self, response_id: str | None = None) -> None:
        """``response.cancel`` (default: the active response)."""
        await self.send_event(ev.ResponseCancel(response_id=response_id))

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        """``conversation.item.truncate``: only ``audio_end_ms`` ms of the item were heard."""
        await self.send_event(ev.ConversationItemTruncate(item_id=item_id, content_index=0,
                                                          audio_end_ms=max(0, int(audio_end_ms))))

    async def report_playback(self, item_id: str, played_ms: float, finished: bool = False,
                              response_id: str | None = None) -> None:
        """``x.playback``: ``played_ms`` ms of the item's audio have been played so far."""
        await self.send_event(ev.XPlayback(item_id=item_id, response_id=response_id,
                                           audio_end_ms=max(0, round(played_ms)), finished=finished))

    # ------------------------------------------------------------------ x.tts.speak
    async def speak(self, text: str, request_id: str | None = None, *, voice: str | None = None,
                    length_scale: float | None = None, timeout_s: float = 60.0) -> TtsResult:
        """Text to speech without the LLM (``x.tts.speak``); collects the audio.

        Retries ``server_overloaded`` after its ``retry_after_ms`` (up to ``retry.attempts``
        tries). Latencies in the result count from the first attempt. Raises the typed error
        of a failed request, TimeoutError after ``timeout_s``.
        """
        request_id = request_id or new_id("tts")
        result = TtsResult(request_id=request_id, sample_rate=self.session.output_rate, sent_at=time.monotonic())
        deadline = result.sent_at + timeout_s
        inbox: asyncio.Queue[Any] = asyncio.Queue()
        self._routes[request_id] = inbox
        try:
            for attempt in range(self.retry.attempts):
                result.attempts = attempt + 1
                event_id = new_id("client")
                self._routes[event_id] = inbox
                try:
                    await self.send_event(ev.XTtsSpeak(request_id=request_id, text=text, voice=voice,
                                                       length_scale=length_scale, event_id=event_id))
                    overloaded = await self._speak_attempt(result, inbox, deadline)
                finally:
                    self._routes.pop(event_id, None)
                if overloaded is None:
                    return result
                if attempt + 1 >= self.retry.attempts:
                    raise overloaded
                await asyncio.sleep(self.retry.delay_s(attempt, overloaded.retry_after_ms / 1000))
                drain(inbox)  # the failed attempt's x.tts.done
            raise AssertionError("unreachable")
        finally:
            self._routes.pop(request_id, None)

    async def _speak_attempt(self, result: TtsResult, inbox: asyncio.Queue[Any],
                             deadline: float) -> Overloaded | None:
        """Read one attempt's events into ``result``; an ``Overloaded`` to retry, else None."""
        chunks: list[np.ndarray] = []
        while True:
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    event = await inbox.get()
            except TimeoutError:
                raise TimeoutError(f"x.tts.speak {result.request_id} not done in time") from None
            now = time.monotonic()
            if event is _END:
                raise self._ended or ConnectionFailed("connection closed")
            if isinstance(event, ev.ErrorEvent):
                exc = error_from_event(event)
                if isinstance(exc, Overloaded):
                    return exc
                raise exc
            if isinstance(event, ev.XTtsAudioDelta):
                if result.first_audio_at is None:
                    result.first_audio_at = now
                chunks.append(event.pcm)
                continue
            result.done_at, result.status, result.audio_ms = now, event.status, event.audio_ms
            result.pcm = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
            if event.status == "failed":
                code = (event.error and event.error.code) or ErrorCode.INTERNAL_ERROR
                message = (event.error and event.error.message) or f"x.tts.speak failed ({code})"
                if code == ErrorCode.SERVER_OVERLOADED:
                    return Overloaded(message)
                raise VoxloopError(message, code=code)
            return None

    async def cancel_speak(self, request_id: str) -> None:
        """``x.tts.cancel``: the request ends with status ``cancelled``."""
        await self.send_event(ev.XTtsCancel(request_id=request_id))
