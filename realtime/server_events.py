"""Server → client events of the Realtime protocol (frozen dataclasses; see realtime/events.py).

Audio goes out as ``np.ndarray`` int16 mono at the session output rate (``pcm``), sent as
base64 ``delta`` or, on the binary fast path, as a binary frame (realtime/protocol.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from realtime.items import ContentPart, ErrorInfo, Item, ResponseObject
from realtime.session_schema import SessionConfig
from realtime.wire import (
    ErrorCode,
    PcmEquality,
    ProtocolError,
    WireObject,
    new_id,
    nullable,
    wire_name,
)
from base.errors import InvalidInput, Overloaded, VoxloopError


@dataclass(frozen=True, kw_only=True)
class ServerEvent(WireObject):
    """Base of server events; ``event_id`` is generated (``event_…``)."""

    event_id: str = field(default_factory=lambda: new_id("event"))


@dataclass(frozen=True, kw_only=True)
class SessionCreated(ServerEvent):
    type: ClassVar[str] = "session.created"
    session: SessionConfig


@dataclass(frozen=True, kw_only=True)
class SessionUpdated(ServerEvent):
    type: ClassVar[str] = "session.updated"
    session: SessionConfig


@dataclass(frozen=True, kw_only=True)
class TranscriptionSessionUpdated(ServerEvent):
    """Answers the beta ``transcription_session.update``; ``session`` is the GA session object."""

    type: ClassVar[str] = "transcription_session.updated"
    session: SessionConfig


@dataclass(frozen=True, kw_only=True)
class InputAudioBufferSpeechStarted(ServerEvent):
    """Server VAD heard speech; ``audio_start_ms`` counts from the session's first input audio."""

    type: ClassVar[str] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


@dataclass(frozen=True, kw_only=True)
class InputAudioBufferSpeechStopped(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


@dataclass(frozen=True, kw_only=True)
class InputAudioBufferCommitted(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None = nullable()


@dataclass(frozen=True, kw_only=True)
class InputAudioBufferTimeoutTriggered(ServerEvent):
    """``turn_detection.idle_timeout_ms`` of no speech after the last response played: the silent
    stretch (stream ms), committed as ``item_id``; a response follows."""

    type: ClassVar[str] = "input_audio_buffer.timeout_triggered"
    audio_start_ms: int
    audio_end_ms: int
    item_id: str


@dataclass(frozen=True, kw_only=True)
class InputAudioBufferCleared(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.cleared"


@dataclass(frozen=True, kw_only=True)
class ConversationItemAdded(ServerEvent):
    """An item entered the conversation (assistant items start empty, ``in_progress``)."""

    type: ClassVar[str] = "conversation.item.added"
    item: Item
    previous_item_id: str | None = nullable()


@dataclass(frozen=True, kw_only=True)
class ConversationItemDone(ServerEvent):
    """An item is final (user audio item: with its transcript)."""

    type: ClassVar[str] = "conversation.item.done"
    item: Item
    previous_item_id: str | None = nullable()


@dataclass(frozen=True, kw_only=True)
class ConversationItemDeleted(ServerEvent):
    """An item left the conversation (``conversation.item.delete``, or the first part of a mended turn
    and the reply it got)."""

    type: ClassVar[str] = "conversation.item.deleted"
    item_id: str


@dataclass(frozen=True, kw_only=True)
class ConversationItemTruncated(ServerEvent):
    type: ClassVar[str] = "conversation.item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True, kw_only=True)
class ConversationItemRetrieved(ServerEvent):
    """An item as the conversation holds it (speech items: their transcript; audio is not kept)."""

    type: ClassVar[str] = "conversation.item.retrieved"
    item: Item


@dataclass(frozen=True, kw_only=True)
class OutputAudioBufferCleared(ServerEvent):
    """The audio of response ``response_id`` stopped (``output_audio_buffer.clear``)."""

    type: ClassVar[str] = "output_audio_buffer.cleared"
    response_id: str


@dataclass(frozen=True, kw_only=True)
class TranscriptionUsage(WireObject):
    """Usage of one transcription: seconds of input audio."""

    type: Literal["duration"] = "duration"
    seconds: float


@dataclass(frozen=True, kw_only=True)
class InputAudioTranscriptionDelta(ServerEvent):
    type: ClassVar[str] = "conversation.item.input_audio_transcription.delta"
    item_id: str
    content_index: int = 0
    delta: str


@dataclass(frozen=True, kw_only=True)
class InputAudioTranscriptionCompleted(ServerEvent):
    type: ClassVar[str] = "conversation.item.input_audio_transcription.completed"
    item_id: str
    content_index: int = 0
    transcript: str
    usage: TranscriptionUsage


@dataclass(frozen=True, kw_only=True)
class InputAudioTranscriptionFailed(ServerEvent):
    type: ClassVar[str] = "conversation.item.input_audio_transcription.failed"
    item_id: str
    content_index: int = 0
    error: ErrorInfo


@dataclass(frozen=True, kw_only=True)
class ResponseCreated(ServerEvent):
    type: ClassVar[str] = "response.created"
    response: ResponseObject


@dataclass(frozen=True, kw_only=True)
class ResponseDone(ServerEvent):
    """A response ended: ``response.status`` completed | cancelled | failed | incomplete."""

    type: ClassVar[str] = "response.done"
    response: ResponseObject


@dataclass(frozen=True, kw_only=True)
class ResponseOutputItemAdded(ServerEvent):
    type: ClassVar[str] = "response.output_item.added"
    response_id: str
    output_index: int = 0
    item: Item


@dataclass(frozen=True, kw_only=True)
class ResponseOutputItemDone(ServerEvent):
    type: ClassVar[str] = "response.output_item.done"
    response_id: str
    output_index: int = 0
    item: Item


@dataclass(frozen=True, kw_only=True)
class _PartEvent(ServerEvent):
    """Fields shared by events about one content part of one response output item."""

    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


@dataclass(frozen=True, kw_only=True)
class ResponseContentPartAdded(_PartEvent):
    type: ClassVar[str] = "response.content_part.added"
    part: ContentPart


@dataclass(frozen=True, kw_only=True)
class ResponseContentPartDone(_PartEvent):
    type: ClassVar[str] = "response.content_part.done"
    part: ContentPart


@dataclass(frozen=True, kw_only=True, eq=False)
class ResponseOutputAudioDelta(PcmEquality, _PartEvent):
    """Assistant speech: ``pcm`` int16 mono at the session output rate (wire: base64 ``delta``)."""

    type: ClassVar[str] = "response.output_audio.delta"
    pcm: np.ndarray = wire_name("delta")


@dataclass(frozen=True, kw_only=True)
class ResponseOutputAudioDone(_PartEvent):
    type: ClassVar[str] = "response.output_audio.done"


@dataclass(frozen=True, kw_only=True)
class ResponseOutputAudioTranscriptDelta(_PartEvent):
    type: ClassVar[str] = "response.output_audio_transcript.delta"
    delta: str


@dataclass(frozen=True, kw_only=True)
class ResponseOutputAudioTranscriptDone(_PartEvent):
    type: ClassVar[str] = "response.output_audio_transcript.done"
    transcript: str


@dataclass(frozen=True, kw_only=True)
class ResponseOutputTextDelta(_PartEvent):
    type: ClassVar[str] = "response.output_text.delta"
    delta: str


@dataclass(frozen=True, kw_only=True)
class ResponseOutputTextDone(_PartEvent):
    type: ClassVar[str] = "response.output_text.done"
    text: str


@dataclass(frozen=True, kw_only=True)
class ResponseFunctionCallArgumentsDelta(ServerEvent):
    """A piece of a function call's arguments (JSON text, concatenated in order)."""

    type: ClassVar[str] = "response.function_call_arguments.delta"
    response_id: str
    item_id: str
    output_index: int = 0
    call_id: str
    delta: str


@dataclass(frozen=True, kw_only=True)
class ResponseFunctionCallArgumentsDone(ServerEvent):
    """A function call's arguments are complete (also sent, with what came, when the response is cut)."""

    type: ClassVar[str] = "response.function_call_arguments.done"
    response_id: str
    item_id: str
    output_index: int = 0
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, kw_only=True)
class ErrorDetail(WireObject):
    """The ``error`` object: ``type`` is invalid_request_error or server_error; ``code`` is stable."""

    type: str
    code: str
    message: str
    param: str | None = nullable()
    #: The client event this error is about, when known.
    event_id: str | None = nullable()
    #: Extension: retry after this many ms (overload).
    retry_after_ms: int | None = None


@dataclass(frozen=True, kw_only=True)
class ErrorEvent(ServerEvent):
    type: ClassVar[str] = "error"
    error: ErrorDetail

    @classmethod
    def from_exception(cls, exc: BaseException, client_event_id: str | None = None) -> ErrorEvent:
        """The error event for ``exc``: protocol/input errors are the client's, others the server's."""
        if isinstance(exc, ProtocolError):
            client_event_id = client_event_id or exc.event_id
        info = error_info(exc)
        retry = exc.retry_after_ms if isinstance(exc, Overloaded) else None
        return cls(error=ErrorDetail(type=info.type, code=info.code, message=info.message,
                                     param=getattr(exc, "param", None), event_id=client_event_id,
                                     retry_after_ms=retry))


def error_info(exc: BaseException) -> ErrorInfo:
    """``{type, code, message}`` of ``exc``: ``invalid_request_error`` for the client's input
    (``InvalidInput``), else ``server_error``; an unexpected exception says nothing more."""
    if isinstance(exc, VoxloopError):
        code, message = exc.code, exc.message
    else:
        code, message = ErrorCode.INTERNAL_ERROR, "internal server error"
    kind = "invalid_request_error" if isinstance(exc, InvalidInput) else "server_error"
    return ErrorInfo(type=kind, code=code, message=message)


@dataclass(frozen=True, kw_only=True)
class XTurnMetrics(ServerEvent):
    """Extension: per-turn timings, ms, keyed by stage (see pipeline/trace.py)."""

    type: ClassVar[str] = "x.turn.metrics"
    response_id: str | None = None
    item_id: str | None = None
    metrics: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class XOutputAudioBufferPaused(ServerEvent):
    """Extension: the user spoke over the reply; stop playing it at once and keep what is buffered.

    ``audio_end_ms``: how much of the item's audio the server counts as heard. More audio of
    the response may still arrive while paused: buffer it behind the paused position.
    """

    type: ClassVar[str] = "x.output_audio_buffer.paused"
    response_id: str
    item_id: str
    audio_end_ms: int = 0


@dataclass(frozen=True, kw_only=True)
class XOutputAudioBufferResumed(ServerEvent):
    """Extension: the speech over the reply was no interruption (a cough, "mm-hm"): play on from
    where playback paused. A real interruption ends the response (``response.done`` cancelled) instead."""

    type: ClassVar[str] = "x.output_audio_buffer.resumed"
    response_id: str
    item_id: str


@dataclass(frozen=True, kw_only=True)
class XOutputAudioBufferCleared(ServerEvent):
    """Extension: the speech over the paused reply was a real interruption: drop its buffered audio.

    ``audio_end_ms``: what the history keeps as heard.
    """

    type: ClassVar[str] = "x.output_audio_buffer.cleared"
    response_id: str
    item_id: str
    audio_end_ms: int = 0


@dataclass(frozen=True, kw_only=True, eq=False)
class XTtsAudioDelta(PcmEquality, ServerEvent):
    """Extension: audio of an ``x.tts.speak`` request, int16 mono at the session output rate."""

    type: ClassVar[str] = "x.tts.audio.delta"
    request_id: str
    pcm: np.ndarray = wire_name("delta")


@dataclass(frozen=True, kw_only=True)
class XTtsDone(ServerEvent):
    """Extension: an ``x.tts.speak`` request ended; ``audio_ms`` of audio were sent."""

    type: ClassVar[str] = "x.tts.done"
    request_id: str
    status: Literal["completed", "cancelled", "failed"] = "completed"
    audio_ms: int = 0
    #: Server side: ms from receiving the request to its first audio delta queued for the socket
    #: (None if no audio was sent). A client's own first-audio time minus this is the network and
    #: its own reading.
    first_audio_ms: float | None = None
    error: ErrorInfo | None = None
