"""``x.tts.speak``: text in, audio out, no LLM and no history (custom frontends, load tests).

Requests of one session run concurrently up to ``MAX_CONCURRENT``; each streams
``x.tts.audio.delta`` events and ends with one ``x.tts.done``. They never touch the
conversation's turn, so speaking a notification does not interrupt the assistant.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pipeline.respond import split_pcm
from pipeline.speech import FirstAudioTiming
from pipeline.trace import Metrics
from pipeline.workers import NORMAL
from realtime import events as ev
from realtime.wire import ErrorCode
from tts_engine.engine import SynthesisOptions
from base.errors import InvalidInput, Overloaded, VoxloopError

#: Requests in flight per session; more get ``server_overloaded``.
MAX_CONCURRENT = 8


def synthesis_options(event: ev.XTtsSpeak, sample_rate: int | None = None, speed: float = 1.0) -> SynthesisOptions:
    """The engine settings of an ``x.tts.speak``; ``sample_rate`` (Hz) is the session output rate,
    ``speed`` the session's ``audio.output.speed`` (it divides the length scale)."""
    return SynthesisOptions(
        length_scale=event.length_scale, noise_scale=event.noise_scale, noise_w=event.noise_w,
        speaker_id=event.speaker_id, sample_rate=sample_rate, speed=None if speed == 1.0 else speed,
    )


class TtsRequests:
    def __init__(self, engines: Any, send: Callable[[Any], None], metrics: Metrics,
                 room: Callable[[], Awaitable[bool]] | None = None) -> None:
        """``room``: awaited before each audio delta (``Session.audio_room``); False stops the
        request (the session is closing). None: deltas never wait."""
        self.engines = engines
        self._send = send
        self._room = room
        self.metrics = metrics
        self._active: dict[str, tuple[threading.Event, asyncio.Task]] = {}
        #: Called with a request id whose audio not yet on the socket must not be sent.
        self.on_audio_stopped: Callable[[str], None] = lambda request_id: None

    def start(self, event: ev.XTtsSpeak, output_rate: int, speed: float = 1.0) -> None:
        """Speak ``event`` at ``output_rate`` Hz and the session's ``speed``."""
        if event.request_id in self._active:
            raise InvalidInput(f"request {event.request_id} is already in progress", code=ErrorCode.DUPLICATE_REQUEST_ID)
        if len(self._active) >= MAX_CONCURRENT:
            raise Overloaded(f"at most {MAX_CONCURRENT} x.tts.speak requests per session at once")
        cancel = threading.Event()
        voice = self.engines.voice(event.voice)
        task = asyncio.create_task(self._run(event, voice, voice.request(synthesis_options(event, output_rate, speed)),
                                             cancel))
        self._active[event.request_id] = (cancel, task)
        self.metrics.tts_requests.inc()

    async def _run(self, event: ev.XTtsSpeak, voice: Any, options: SynthesisOptions, cancel: threading.Event) -> None:
        """Speak ``event`` in ``voice`` (``pipeline.voices.Voice``) with ``options``."""
        rid = event.request_id
        rate = options.sample_rate or 24000
        sent, start, first_ms = 0, time.monotonic(), None
        status, error = "completed", None
        timing = FirstAudioTiming()
        try:
            async for chunk in voice.speech.stream(event.text, options, cancel, NORMAL, timing):
                for piece in split_pcm(chunk.pcm, chunk.sample_rate, self.engines.cfg.server.audio_delta_ms):
                    if self._room is not None and not await self._room():
                        return  # the client stopped reading: the session is closing
                    if cancel.is_set():  # perhaps while its audio waited for room: the stream ends soon
                        break
                    self._send(ev.XTtsAudioDelta(request_id=rid, pcm=piece))
                    sent += len(piece)
                if first_ms is None and sent:
                    first_ms = round(1000 * (time.monotonic() - start), 1)
                    if "engine" in timing.parts:  # a batching stage marked the way there
                        timing.mark("out")
                        for part, seconds in timing.parts.items():
                            self.metrics.tts_first_audio_parts.labels(part).observe(seconds)
            if cancel.is_set():
                status = "cancelled"
            elif (last := timing.last_parts(time.monotonic())) is not None:
                for part, seconds in last.items():
                    self.metrics.tts_last_audio_parts.labels(part).observe(seconds)
        except asyncio.CancelledError:
            status = "cancelled"
        except VoxloopError as exc:
            status, error = "failed", ev.error_info(exc)
            if isinstance(exc, Overloaded):
                self._send(ev.ErrorEvent.from_exception(exc, event.event_id))
        finally:
            self._active.pop(rid, None)
            self._send(ev.XTtsDone(request_id=rid, status=status, audio_ms=round(1000 * sent / rate),
                                   first_audio_ms=first_ms, error=error))

    def cancel(self, request_id: str) -> None:
        entry = self._active.get(request_id)
        if entry is None:
            raise InvalidInput(f"no x.tts.speak request {request_id} in progress", code=ErrorCode.REQUEST_NOT_FOUND)
        entry[0].set()
        self.on_audio_stopped(request_id)

    def cancel_all(self) -> None:
        for cancel, task in list(self._active.values()):
            cancel.set()
            task.cancel()
