"""One session per connection: its settings, the outbox to the client, and dispatch.

Client events come in (already validated by the protocol core); server events go
out through a bounded outbox. The session hands each event to the part that owns it:

- ``VoiceInput`` (pipeline/voice_input.py): input audio, VAD, turn taking (the pure
  ``TurnTaking`` decides, it performs), voice turns, partial transcripts;
- ``Conversation`` (pipeline/conversation.py): history, turns and their replies,
  cancel and truncation, ``response.create``;
- ``TtsRequests`` (pipeline/tts_requests.py): ``x.tts.speak``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pipeline.conversation import Conversation
from pipeline.engines import Engines
from pipeline.items import ConversationItems
from pipeline.stages import missing_stage_error
from pipeline.trace import Metrics, TraceSink
from pipeline.tts_requests import TtsRequests
from pipeline.voice_input import VoiceInput
from realtime import events as ev
from realtime.session_schema import ConnectOptions, default_session
from realtime.wire import ErrorCode
from base.config import Config
from base.errors import InvalidInput, VoxloopError

log = logging.getLogger(__name__)

#: Cancelled responses / x.tts requests remembered for dropping their unsent audio (oldest forgotten).
STOPPED_AUDIO_IDS = 64


class Session:
    def __init__(self, session_id: str, cfg: Config, engines: Engines, outbox: asyncio.Queue,
                 metrics: Metrics, traces: TraceSink,
                 close: Callable[[int, str], Awaitable[None]]) -> None:
        self.id = session_id
        self.cfg = cfg
        self.engines = engines
        self.outbox = outbox
        self.metrics = metrics
        self.traces = traces
        self._close = close
        self.closed = False
        self.protocol: Any = None
        self.conversation = Conversation(session_id, cfg, engines, self._send, metrics, traces, self._settings,
                                         room=self.audio_room)
        self.history = self.conversation.history
        self.items = ConversationItems(self.history, self._send, self.conversation.call_item_create)
        self.voice = VoiceInput(cfg, engines, self.conversation, self._send, self._error, self._settings)
        self.tts_requests = TtsRequests(engines, self._send, metrics, room=self.audio_room)
        # Audio of a cancelled response or x.tts request still in the outbox is not sent: a client
        # would otherwise receive (and a naive one play) seconds of it after its cancel.
        self._stopped_audio: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.conversation.on_audio_stopped = self.tts_requests.on_audio_stopped = self._stop_audio

    # ------------------------------------------------------------------ plumbing
    def start(self, protocol: Any, options: ConnectOptions | None = None) -> None:
        """Begin with the server's session as the URL's ``options`` ask (``?intent=``, ``?x_events=``)."""
        self.protocol = protocol
        protocol.session = default_session(self.cfg, self.id, options)
        if self.engines.voices:  # a server without TTS has none to choose
            protocol.voices = tuple(self.engines.voices)
        self.voice.configure()
        self._send(ev.SessionCreated(session=protocol.session))

    def _settings(self) -> Any:
        """The session object (``realtime.session_schema.SessionConfig``) as the client last set it."""
        return self.protocol.session

    def _send(self, event: Any) -> None:
        if self.closed or (isinstance(event, ev.OPT_IN_EVENTS) and not self.protocol.session.x_events):
            return  # a client that did not ask for x.* events never sees one (strict OpenAI clients)
        if isinstance(event, ev.ErrorEvent):
            self.metrics.errors.labels(code=event.error.code).inc()
        try:
            self.outbox.put_nowait(event)
        except asyncio.QueueFull:
            self._not_reading()

    async def audio_room(self) -> bool:
        """Wait until the outbox takes audio (``Outbox.wait_room``): the speech stream pauses while a
        slow client catches up. False when the session is closing (the client stopped reading)."""
        if self.closed:
            return False
        if self.outbox.has_room():
            return True
        t0 = time.monotonic()
        if not await self.outbox.wait_room():
            self._not_reading()
        self.metrics.audio_waits_s.inc(time.monotonic() - t0)
        return not self.closed

    def _not_reading(self) -> None:
        if self.closed:
            return
        self.closed = True
        log.warning("%s: client is not reading (%d queued); closing", self.id, self.outbox.qsize())
        asyncio.get_running_loop().create_task(self._close(1008, "client is not reading its messages"))

    def _error(self, exc: BaseException, event_id: str | None = None) -> None:
        if not isinstance(exc, VoxloopError):
            log.exception("%s: internal error", self.id, exc_info=exc)
        self._send(ev.ErrorEvent.from_exception(exc, event_id))

    def _stop_audio(self, stream_id: str) -> None:
        self._stopped_audio[stream_id] = None
        while len(self._stopped_audio) > STOPPED_AUDIO_IDS:
            self._stopped_audio.popitem(last=False)

    def sendable(self, event: Any) -> bool:
        """False for an audio delta of a response or x.tts request that was cancelled (the hub's
        writer skips it; everything else goes out in order)."""
        if isinstance(event, ev.ResponseOutputAudioDelta):
            return event.response_id not in self._stopped_audio
        if isinstance(event, ev.XTtsAudioDelta):
            return event.request_id not in self._stopped_audio
        return True

    def on_sent(self, event: Any) -> None:
        """Called by the hub's writer after ``event`` went out on the socket."""
        if isinstance(event, ev.ResponseOutputAudioDelta):
            self.conversation.audio_sent(event)
            self.metrics.audio_sent_s.inc(len(event.pcm) / self.protocol.session.output_rate)

    async def wait_idle(self) -> None:
        """Return when no turn is in flight (graceful drain)."""
        while (turn := self.conversation.turns.running) is not None:
            await turn.finished.wait()

    async def close(self, code: int, reason: str) -> None:
        self.closed = True
        await self._close(code, reason)

    async def shutdown(self) -> None:
        self.closed = True
        self.conversation.turns.interrupt("client_cancelled")
        self.tts_requests.cancel_all()
        self.voice.shutdown()
        if self.engines.llm is not None:
            self.engines.llm.release(self.id)  # frees the conversation's KV sequence

    # ------------------------------------------------------------------ dispatch
    def handle(self, event: Any) -> None:
        if isinstance(event, ev.ErrorEvent):  # the protocol core rejected a message
            self._send(event)
            return
        handler = _HANDLERS.get(type(event))
        refused = missing_stage_error(event, self.engines.stages,  # e.g. audio on a TTS-only server
                                      transcription=self.protocol.session.type == "transcription")
        if handler is None or refused is not None:
            self._error(refused or InvalidInput(f"{event.type} is not supported",
                                                code=ErrorCode.UNSUPPORTED_EVENT_TYPE), event.event_id)
            return
        try:
            handler(self, event)
        except VoxloopError as exc:
            self._error(exc, event.event_id)

    def _on_session_update(self, event: ev.SessionUpdate) -> None:
        self.voice.configure()
        if isinstance(event, ev.TranscriptionSessionUpdate):
            self._send(ev.TranscriptionSessionUpdated(session=self.protocol.session))
        else:
            self._send(ev.SessionUpdated(session=self.protocol.session))

    def _on_tts_speak(self, event: ev.XTtsSpeak) -> None:
        try:
            output = self.protocol.session.audio.output
            if event.voice is None:  # the session's voice
                event = dataclasses.replace(event, voice=output.voice)
            self.tts_requests.start(event, output.format.rate, output.speed)
        except VoxloopError as exc:  # every request ends with x.tts.done, refused ones too
            self._error(exc, event.event_id)
            self._send(ev.XTtsDone(request_id=event.request_id, status="failed", error=ev.error_info(exc)))

    def _on_tts_cancel(self, event: ev.XTtsCancel) -> None:
        self.tts_requests.cancel(event.request_id)


_HANDLERS: dict[type, Callable[[Session, Any], None]] = {
    ev.SessionUpdate: Session._on_session_update,
    ev.TranscriptionSessionUpdate: Session._on_session_update,
    ev.InputAudioBufferAppend: lambda s, e: s.voice.append(e),
    ev.InputAudioBufferCommit: lambda s, e: s.voice.commit(e),
    ev.InputAudioBufferClear: lambda s, e: s.voice.clear(e),
    ev.ConversationItemCreate: lambda s, e: s.items.create(e),
    ev.ConversationItemDelete: lambda s, e: s.items.delete(e),
    ev.ConversationItemRetrieve: lambda s, e: s.items.retrieve(e),
    ev.OutputAudioBufferClear: lambda s, e: s.conversation.clear_audio(e),
    ev.ConversationItemTruncate: lambda s, e: s.conversation.truncate(e),
    ev.ResponseCreate: lambda s, e: s.conversation.response_create(e),
    ev.ResponseCancel: lambda s, e: s.conversation.response_cancel(e),
    ev.XPlayback: lambda s, e: s.conversation.playback(e),
    ev.XTtsSpeak: Session._on_tts_speak,
    ev.XTtsCancel: Session._on_tts_cancel,
}
