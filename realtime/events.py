"""Realtime protocol events: a closed set of frozen dataclasses, one per event type.

Client → server events (realtime/client_events.py) derive from :class:`ClientEvent`,
server → client events (realtime/server_events.py) from :class:`ServerEvent`. Each class
has a ``type`` constant (the wire ``"type"``), fields named like the JSON keys,
``to_dict()`` and ``from_dict()``. This module is the one to import: it re-exports them
all, keeps the registries by wire type and parses/serializes messages. GA names of the
OpenAI Realtime API, our ``x.*`` extensions and the error codes are in docs/protocol.md.

Audio fields are ``np.ndarray`` int16 mono (``pcm``); on the wire they are base64 PCM16 LE
(``audio`` / ``delta``) or, with the binary fast path, raw WebSocket frames (see
realtime/protocol.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from realtime.client_events import (
    ClientEvent,
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    InputAudioBufferAppend,
    InputAudioBufferClear,
    InputAudioBufferCommit,
    OutputAudioBufferClear,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
    TranscriptionSessionUpdate,
    XPlayback,
    XTtsCancel,
    XTtsSpeak,
)
from realtime.items import (
    ContentPart,
    ErrorInfo,
    InputItem,
    Item,
    MessageItem,
    ResponseAudio,
    ResponseObject,
    ResponseOptions,
    ResponseStatusDetails,
    ResponseUsage,
)
from realtime.server_events import (
    ConversationItemAdded,
    ConversationItemDeleted,
    ConversationItemDone,
    ConversationItemRetrieved,
    ConversationItemTruncated,
    ErrorDetail,
    ErrorEvent,
    InputAudioBufferCleared,
    InputAudioBufferTimeoutTriggered,
    InputAudioBufferCommitted,
    InputAudioBufferSpeechStarted,
    InputAudioBufferSpeechStopped,
    InputAudioTranscriptionCompleted,
    InputAudioTranscriptionDelta,
    InputAudioTranscriptionFailed,
    OutputAudioBufferCleared,
    ResponseContentPartAdded,
    ResponseContentPartDone,
    ResponseCreated,
    ResponseDone,
    ResponseOutputAudioDelta,
    ResponseOutputAudioDone,
    ResponseOutputAudioTranscriptDelta,
    ResponseOutputAudioTranscriptDone,
    ResponseFunctionCallArgumentsDelta,
    ResponseFunctionCallArgumentsDone,
    ResponseOutputItemAdded,
    ResponseOutputItemDone,
    ResponseOutputTextDelta,
    ResponseOutputTextDone,
    ServerEvent,
    SessionCreated,
    SessionUpdated,
    TranscriptionSessionUpdated,
    TranscriptionUsage,
    XOutputAudioBufferCleared,
    XOutputAudioBufferPaused,
    XOutputAudioBufferResumed,
    XTtsAudioDelta,
    XTtsDone,
    XTurnMetrics,
    error_info,
)
from realtime.tools import FunctionCallItem, FunctionCallOutputItem, FunctionTool, ToolChoiceFunction
from realtime.wire import ErrorCode, ProtocolError, event_id_of

#: What ``RealtimeProtocol.receive_*`` returns for a bad message: an error ready to send.
ProtocolErrorEvent = ErrorEvent

__all__ = [
    "CLIENT_EVENTS", "SERVER_EVENTS", "UNSUPPORTED_CLIENT_EVENTS", "OPT_IN_EVENTS",
    "ClientEvent", "ServerEvent", "ErrorCode", "ProtocolError", "ProtocolErrorEvent",
    "error_info", "parse_client_event", "parse_server_event", "serialize",
    # client events
    "SessionUpdate", "InputAudioBufferAppend", "InputAudioBufferCommit", "InputAudioBufferClear",
    "ResponseCreate", "ResponseCancel", "ConversationItemCreate", "ConversationItemTruncate",
    "ConversationItemDelete", "ConversationItemRetrieve", "OutputAudioBufferClear", "TranscriptionSessionUpdate",
    "XPlayback", "XTtsSpeak", "XTtsCancel",
    # server events
    "SessionCreated", "SessionUpdated", "InputAudioBufferSpeechStarted", "InputAudioBufferSpeechStopped",
    "InputAudioBufferCommitted", "InputAudioBufferCleared", "InputAudioBufferTimeoutTriggered", "ConversationItemAdded", "ConversationItemDone",
    "ConversationItemTruncated", "ConversationItemDeleted", "ConversationItemRetrieved",
    "OutputAudioBufferCleared", "TranscriptionSessionUpdated", "InputAudioTranscriptionDelta", "InputAudioTranscriptionCompleted",
    "InputAudioTranscriptionFailed", "ResponseCreated", "ResponseDone", "ResponseOutputItemAdded",
    "ResponseOutputItemDone", "ResponseContentPartAdded", "ResponseContentPartDone",
    "ResponseOutputAudioDelta", "ResponseOutputAudioDone", "ResponseOutputAudioTranscriptDelta",
    "ResponseOutputAudioTranscriptDone", "ResponseOutputTextDelta", "ResponseOutputTextDone",
    "ErrorEvent", "XTurnMetrics", "XTtsAudioDelta", "XTtsDone", "XOutputAudioBufferPaused",
    "XOutputAudioBufferResumed", "XOutputAudioBufferCleared",
    "ResponseFunctionCallArgumentsDelta", "ResponseFunctionCallArgumentsDone",
    # nested objects
    "ContentPart", "ErrorDetail", "ErrorInfo", "InputItem", "Item", "MessageItem", "FunctionCallItem",
    "FunctionCallOutputItem", "FunctionTool", "ToolChoiceFunction", "ResponseAudio", "ResponseObject",
    "ResponseOptions", "ResponseStatusDetails", "ResponseUsage", "TranscriptionUsage",
]


def _registry(base: type) -> dict[str, type]:
    out: dict[str, type] = {}
    stack = list(base.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if isinstance(cls.__dict__.get("type"), str):
            out[cls.type] = cls
    return out


#: Every client event type we implement, by wire ``type``.
CLIENT_EVENTS: Mapping[str, type[ClientEvent]] = _registry(ClientEvent)
#: Every server event type, by wire ``type``.
SERVER_EVENTS: Mapping[str, type[ServerEvent]] = _registry(ServerEvent)
#: Extension server events sent only to clients that ask (``session.x_events`` / ``?x_events=true``);
#: ``x.tts.*`` events answer a client's own ``x.tts.speak`` and are always sent.
OPT_IN_EVENTS = (XTurnMetrics, XOutputAudioBufferPaused, XOutputAudioBufferResumed, XOutputAudioBufferCleared)
#: GA client event types we recognise but do not implement (error ``unsupported_event_type``).
UNSUPPORTED_CLIENT_EVENTS: frozenset[str] = frozenset()


def _event_type(data: Any, known: Mapping[str, type], unsupported: frozenset[str]) -> type:
    if not isinstance(data, dict):
        raise ProtocolError(ErrorCode.INVALID_JSON, "a message must be a JSON object")
    kind = data.get("type")
    if kind is None:
        raise ProtocolError(ErrorCode.MISSING_FIELD, "missing field type", param="type")
    if not isinstance(kind, str):
        raise ProtocolError(ErrorCode.INVALID_VALUE, "type: expected a string", param="type")
    if kind in known:
        return known[kind]
    if kind in unsupported:
        raise ProtocolError(ErrorCode.UNSUPPORTED_EVENT_TYPE,
                            f"event type {kind!r} is not supported by this server", param="type")
    raise ProtocolError(ErrorCode.UNKNOWN_EVENT_TYPE, f"unknown event type {kind!r}", param="type")


def parse_client_event(
    data: Any, *, input_rate: int = 24000, max_text_chars: int | None = None,
    input_format: str = "audio/pcm",
) -> ClientEvent:
    """Validate one decoded JSON message from a client.

    ``input_rate`` (Hz) labels decoded audio, ``input_format`` says how its bytes are coded
    (PCM16 or G.711); ``max_text_chars`` bounds text inputs.
    Raises :class:`ProtocolError` (with the client's ``event_id`` when readable).
    """
    try:
        cls = _event_type(data, CLIENT_EVENTS, UNSUPPORTED_CLIENT_EVENTS)
        if cls is InputAudioBufferAppend:
            event: ClientEvent = InputAudioBufferAppend.from_dict(data, sample_rate=input_rate,
                                                                  audio_format=input_format)
        else:
            event = cls.from_dict(data)
        if max_text_chars is not None:
            _check_text_length(event, max_text_chars)
        return event
    except ProtocolError as exc:
        if exc.event_id is None and isinstance(data, dict):
            exc.event_id = event_id_of(data)
        raise


def _check_text_length(event: ClientEvent, limit: int) -> None:
    if isinstance(event, XTtsSpeak):
        texts = [("text", event.text)]
    elif isinstance(event, ConversationItemCreate):
        item = event.item
        if isinstance(item, FunctionCallOutputItem):
            texts = [("item.output", item.output)]
        elif isinstance(item, FunctionCallItem):
            texts = [("item.arguments", item.arguments)]
        else:
            texts = [(f"item.content[{i}].text", p.text or "") for i, p in enumerate(item.content)]
    elif isinstance(event, ResponseCreate) and event.response and event.response.instructions:
        texts = [("response.instructions", event.response.instructions)]
    else:
        return
    for param, text in texts:
        if len(text) > limit:
            raise ProtocolError(ErrorCode.TEXT_TOO_LONG,
                                f"{param}: {len(text)} characters, limit is {limit}", param=param)


def parse_server_event(data: Any) -> ServerEvent:
    """Validate one decoded JSON message from the server (client side)."""
    return _event_type(data, SERVER_EVENTS, frozenset()).from_dict(data)


def serialize(event: ClientEvent | ServerEvent) -> str:
    """The JSON text of an event (compact, UTF-8 kept as is)."""
    return json.dumps(event.to_dict(), separators=(",", ":"), ensure_ascii=False)
