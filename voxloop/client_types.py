"""Results, retry policy and error mapping of the Realtime client (voxloop/client.py).

Times are ``time.monotonic()`` seconds; audio is mono int16 at ``sample_rate`` Hz.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from realtime import events as ev
from realtime.wire import ErrorCode
from base.errors import ModelError, Overloaded, ProtocolError, VoxloopError

_EMPTY = np.zeros(0, np.int16)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff for connecting and for ``server_overloaded`` answers."""

    #: Tries in all (1 = never retry).
    attempts: int = 5
    #: Delay before the second try, s; doubled (``multiplier``) per try up to ``max_delay_s``.
    initial_delay_s: float = 0.25
    max_delay_s: float = 10.0
    multiplier: float = 2.0
    #: Random extra delay, as a fraction of the delay (spreads out many clients retrying at once).
    jitter: float = 0.1

    def delay_s(self, attempt: int, retry_after_s: float | None = None) -> float:
        """Seconds to wait after failed try number ``attempt`` (0-based); never less than the
        server's ``Retry-After`` / ``retry_after_ms``."""
        backoff = min(self.max_delay_s, self.initial_delay_s * self.multiplier ** attempt)
        backoff *= 1 + self.jitter * random.random()
        return max(backoff, retry_after_s or 0.0)


@dataclass
class Reply:
    """One assistant response as collected by ``RealtimeClient.collect_response``."""

    response_id: str
    #: The assistant item (None for a response that produced none).
    item_id: str | None
    #: What the assistant said (audio transcript) or wrote (text responses).
    transcript: str
    #: Assistant speech, int16 mono at ``sample_rate`` Hz (empty for text responses).
    pcm: np.ndarray
    sample_rate: int
    #: completed | cancelled | failed | incomplete, or no_response (the user's transcript was empty).
    status: str
    #: Why it was cancelled/incomplete: turn_detected (barge-in), client_cancelled, max_output_tokens…;
    #: for a failed response the error code (model_error…).
    reason: str | None = None
    user_transcript: str | None = None
    user_item_id: str | None = None
    #: ``x.turn.metrics`` of the turn (ms per stage), {} when the server sends none.
    metrics: dict[str, Any] = field(default_factory=dict)
    #: Monotonic times (s) when ``response.created``, the first audio delta and ``response.done`` arrived.
    created_at: float | None = None
    first_audio_at: float | None = None
    done_at: float | None = None
    #: The function calls the reply made (``function_call`` items whose arguments were complete).
    calls: list[Any] = field(default_factory=list)
    #: ``RealtimeClient.collect_turn``: every call of the turn with its output (``CallResult``).
    tool_results: list[Any] = field(default_factory=list)

    @property
    def audio_s(self) -> float:
        """Length of the received speech, s."""
        return len(self.pcm) / self.sample_rate


@dataclass
class TtsResult:
    """The outcome of ``RealtimeClient.speak`` (``x.tts.speak``)."""

    request_id: str
    #: Hz of ``pcm`` (the session output rate).
    sample_rate: int
    #: Monotonic time (s) the first attempt was sent.
    sent_at: float
    pcm: np.ndarray = field(default_factory=lambda: _EMPTY)
    #: completed | cancelled (| in_progress until done).
    status: str = "in_progress"
    #: Audio the server says it sent, ms.
    audio_ms: int = 0
    #: Tries made (more than 1 after ``server_overloaded`` retries).
    attempts: int = 0
    first_audio_at: float | None = None
    done_at: float | None = None

    @property
    def first_audio_s(self) -> float | None:
        """Seconds from sending the request to its first audio."""
        return None if self.first_audio_at is None else self.first_audio_at - self.sent_at

    @property
    def total_s(self) -> float | None:
        """Seconds from sending the request to ``x.tts.done``."""
        return None if self.done_at is None else self.done_at - self.sent_at


def error_from_event(event: ev.ErrorEvent) -> VoxloopError:
    """The ``base.errors`` exception for a server ``error`` event.

    ``server_overloaded`` -> ``Overloaded`` (with ``retry_after_ms``); other client-side
    errors (``invalid_request_error``) -> ``ProtocolError`` (``code``, ``param``, ``event_id``);
    ``model_error`` -> ``ModelError``; anything else -> ``VoxloopError`` with the server's code.
    """
    e = event.error
    if e.code == ErrorCode.SERVER_OVERLOADED:
        return Overloaded(e.message, retry_after_ms=e.retry_after_ms if e.retry_after_ms is not None else 1000)
    if e.type == "invalid_request_error":
        return ProtocolError(e.code, e.message, param=e.param, event_id=e.event_id)
    if e.code == ErrorCode.MODEL_ERROR:
        return ModelError(e.message)
    return VoxloopError(e.message, code=e.code)


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``update`` merged in key by key, as ``session.update`` does (None replaces)."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


class ReplyBuilder:
    """Accumulates the events of one response (the first one seen) into a :class:`Reply`."""

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self.response_id: str | None = None
        self.item_id: str | None = None
        self.user_transcript: str | None = None
        self.user_item_id: str | None = None
        self.chunks: list[np.ndarray] = []
        self.deltas: list[str] = []
        self.transcript: str | None = None
        self.status: str | None = None
        self.reason: str | None = None
        self.created_at = self.first_audio_at = self.done_at = None
        self.calls: list[Any] = []

    @property
    def finished(self) -> bool:
        return self.status is not None

    def feed(self, event: ev.ServerEvent, now: float) -> None:
        """Take one event (events of other responses are ignored)."""
        if isinstance(event, ev.InputAudioTranscriptionCompleted | ev.InputAudioTranscriptionFailed):
            self._user(event, now)
            return
        if isinstance(event, ev.XTurnMetrics):
            return  # follows its response's response.done: one left unread (e.g. after a barge-in) is stale
        rid = event.response.id if isinstance(event, ev.ResponseCreated | ev.ResponseDone) \
            else getattr(event, "response_id", None)
        if rid is None:
            return
        if self.response_id is None:
            self.response_id = rid
        if rid != self.response_id:
            return
        self.item_id = self.item_id or getattr(event, "item_id", None)  # part events name the item
        if isinstance(event, ev.ResponseCreated):
            self.created_at = now
        elif isinstance(event, ev.ResponseOutputItemAdded) and isinstance(event.item, ev.MessageItem):
            self.item_id = event.item.id
        elif isinstance(event, ev.ResponseOutputItemDone) and isinstance(event.item, ev.FunctionCallItem):
            if event.item.status == "completed":
                self.calls.append(event.item)
        elif isinstance(event, ev.ResponseOutputAudioDelta):
            self.first_audio_at = self.first_audio_at or now
            self.chunks.append(event.pcm)
        elif isinstance(event, ev.ResponseOutputAudioTranscriptDelta | ev.ResponseOutputTextDelta):
            self.deltas.append(event.delta)
        elif isinstance(event, ev.ResponseOutputAudioTranscriptDone):
            self.transcript = event.transcript
        elif isinstance(event, ev.ResponseOutputTextDone):
            self.transcript = event.text
        elif isinstance(event, ev.ResponseDone):
            self._done(event, now)

    def _user(self, event: Any, now: float) -> None:
        if self.response_id is not None:
            return  # a later user turn: not part of this response
        self.user_item_id = event.item_id
        if isinstance(event, ev.InputAudioTranscriptionFailed):
            self.status, self.reason, self.done_at = "no_response", "transcription_failed", now
            return
        self.user_transcript = event.transcript
        if not event.transcript.strip():  # the server does not answer an empty transcript
            self.status, self.reason, self.done_at = "no_response", "empty_transcript", now

    def _done(self, event: ev.ResponseDone, now: float) -> None:
        response = event.response
        self.status, self.done_at = response.status, now
        details = response.status_details
        self.reason = details.reason if details else None
        if details is not None and details.error is not None and self.reason is None:
            self.reason = details.error.code  # failed: e.g. model_error
        message = next((o for o in response.output if isinstance(o, ev.MessageItem)), None)
        if self.transcript is None and message is not None:
            self.transcript = message.text
            self.item_id = self.item_id or message.id

    def progress(self) -> str:
        ms = 1000 * sum(len(c) for c in self.chunks) / self.sample_rate
        return (f"response {self.response_id}, user transcript {self.user_transcript!r}, "
                f"text {''.join(self.deltas)!r}, {ms:.0f} ms of audio")

    def reply(self) -> Reply:
        text = self.transcript if self.transcript is not None else "".join(self.deltas)
        return Reply(
            response_id=self.response_id or "", item_id=self.item_id, transcript=text,
            pcm=np.concatenate(self.chunks) if self.chunks else _EMPTY.copy(), sample_rate=self.sample_rate,
            status=self.status or "in_progress", reason=self.reason, user_transcript=self.user_transcript,
            user_item_id=self.user_item_id, created_at=self.created_at, first_audio_at=self.first_audio_at,
            done_at=self.done_at, calls=list(self.calls),
        )


class Connecting:
    """What ``RealtimeClient.connect`` returns: awaitable, or an async context manager."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __await__(self):
        return self._open().__await__()

    async def _open(self) -> Any:
        await self.client.open()
        return self.client

    async def __aenter__(self) -> Any:
        return await self._open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.client.close()


def retry_after_s(value: str | None) -> float:
    """Seconds in an HTTP ``Retry-After`` header (1 s when absent or a date)."""
    try:
        return max(0.0, float(value)) if value else 1.0
    except ValueError:  # an HTTP date: not worth parsing, retry soon
        return 1.0


def event_matches(event: ev.ServerEvent, wanted: str | type | tuple[type, ...]) -> bool:
    if isinstance(wanted, str):
        return event.type == wanted
    return isinstance(event, wanted)


def event_type_name(wanted: str | type | tuple[type, ...]) -> str:
    if isinstance(wanted, str):
        return wanted
    classes = wanted if isinstance(wanted, tuple) else (wanted,)
    return " or ".join(getattr(c, "type", c.__name__) for c in classes)


def drain(q: asyncio.Queue[Any]) -> None:
    while not q.empty():
        q.get_nowait()
