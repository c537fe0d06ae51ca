"""Client → server events of the Realtime protocol (frozen dataclasses; see realtime/events.py).

Audio arrives as ``np.ndarray`` int16 mono (``InputAudioBufferAppend.pcm``) labelled with
the session input rate it was decoded at (Hz).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from realtime.audio_formats import bytes_to_pcm
from realtime.items import CLIENT_CONTENT_TYPES, Item, MessageItem, ResponseOptions
from realtime.session_schema import G711_FORMATS, validate_session_update
from realtime.wire import (
    ErrorCode,
    PcmEquality,
    ProtocolError,
    WireObject,
    check,
    decode_base64,
    decode_value,
    wire_name,
)


@dataclass(frozen=True, kw_only=True)
class ClientEvent(WireObject):
    """Base of client events; ``event_id`` is optional and echoed in errors about the event."""

    event_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class SessionUpdate(ClientEvent):
    """Change part of the session (partial GA session object; see session_schema)."""

    type: ClassVar[str] = "session.update"
    #: The validated partial session: only keys we implement, JSON values.
    session: Mapping[str, Any]
    #: Dotted paths of keys that were accepted but ignored (not on the wire).
    ignored: tuple[str, ...] = field(default=(), metadata={"wire": False}, compare=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str = "") -> SessionUpdate:
        if "session" not in data:
            raise ProtocolError(ErrorCode.MISSING_FIELD, "missing field session", param="session")
        event_id = decode_value(data.get("event_id"), str | None, "event_id")
        update, ignored = validate_session_update(data["session"])
        return cls(session=update, ignored=ignored, event_id=event_id)


#: ``transcription_session.update``'s (beta) audio format names -> the GA format objects.
BETA_AUDIO_FORMATS: Mapping[str, dict[str, Any]] = {
    "pcm16": {"type": "audio/pcm", "rate": 24000},
    "g711_ulaw": {"type": "audio/pcmu"},
    "g711_alaw": {"type": "audio/pcma"},
}
#: Its keys that have a GA place in the session (the others are ignored, as unknown keys are).
_BETA_KEYS = {"input_audio_format": "format", "input_audio_transcription": "transcription",
              "turn_detection": "turn_detection"}


@dataclass(frozen=True, kw_only=True)
class TranscriptionSessionUpdate(SessionUpdate):
    """The beta API's ``transcription_session.update``: the same as a ``session.update`` with
    ``session.type: "transcription"`` and the beta keys moved to their GA places
    (``input_audio_format`` -> ``audio.input.format``, ``input_audio_transcription`` ->
    ``audio.input.transcription``, ``turn_detection`` -> ``audio.input.turn_detection``)."""

    type: ClassVar[str] = "transcription_session.update"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str = "") -> TranscriptionSessionUpdate:
        if "session" not in data:
            raise ProtocolError(ErrorCode.MISSING_FIELD, "missing field session", param="session")
        beta = data["session"]
        if not isinstance(beta, dict):
            raise ProtocolError(ErrorCode.INVALID_VALUE, "session: expected an object", param="session")
        audio_input: dict[str, Any] = {ga: beta[key] for key, ga in _BETA_KEYS.items() if key in beta}
        if "format" in audio_input:
            fmt = audio_input["format"]
            if not isinstance(fmt, str) or fmt not in BETA_AUDIO_FORMATS:
                raise ProtocolError(ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
                                    f"session.input_audio_format: one of {', '.join(BETA_AUDIO_FORMATS)}, got {fmt!r}",
                                    param="session.input_audio_format")
            audio_input["format"] = dict(BETA_AUDIO_FORMATS[fmt])
        event_id = decode_value(data.get("event_id"), str | None, "event_id")
        update, ignored = validate_session_update({"type": "transcription", "audio": {"input": audio_input}})
        ignored += tuple(f"session.{k}" for k in beta if k not in _BETA_KEYS)
        return cls(session=update, ignored=ignored, event_id=event_id)


@dataclass(frozen=True, kw_only=True, eq=False)
class InputAudioBufferAppend(PcmEquality, ClientEvent):
    """Append user audio: ``pcm`` int16 mono at ``sample_rate`` Hz (the session input rate)."""

    type: ClassVar[str] = "input_audio_buffer.append"
    pcm: np.ndarray = wire_name("audio")
    #: Sample rate of ``pcm`` when it was decoded, Hz (not on the wire).
    sample_rate: int = field(default=24000, metadata={"wire": False})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str = "", sample_rate: int = 24000,
                  audio_format: str = "audio/pcm") -> InputAudioBufferAppend:
        """``audio_format``: the session's input format (``audio/pcmu`` / ``audio/pcma``: G.711 bytes)."""
        if audio_format in G711_FORMATS and isinstance(data.get("audio"), str):
            event_id = decode_value(data.get("event_id"), str | None, "event_id")
            pcm = bytes_to_pcm(decode_base64(data["audio"], "audio"), audio_format)
            return cls(pcm=pcm, sample_rate=sample_rate, event_id=event_id)
        event = super().from_dict(data, path)
        return dataclasses.replace(event, sample_rate=sample_rate)


@dataclass(frozen=True, kw_only=True)
class InputAudioBufferCommit(ClientEvent):
    type: ClassVar[str] = "input_audio_buffer.commit"


@dataclass(frozen=True, kw_only=True)
class InputAudioBufferClear(ClientEvent):
    type: ClassVar[str] = "input_audio_buffer.clear"


@dataclass(frozen=True, kw_only=True)
class ResponseCreate(ClientEvent):
    type: ClassVar[str] = "response.create"
    response: ResponseOptions | None = None


@dataclass(frozen=True, kw_only=True)
class ResponseCancel(ClientEvent):
    """Cancel ``response_id`` (default: the active response)."""

    type: ClassVar[str] = "response.cancel"
    response_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class ConversationItemCreate(ClientEvent):
    """Add a text message (user/system ``input_text``, assistant ``output_text``), a function call or
    a function call's output to history."""

    type: ClassVar[str] = "conversation.item.create"
    item: Item
    previous_item_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.item, MessageItem):
            return  # the function-call items check their own fields
        allowed = CLIENT_CONTENT_TYPES[self.item.role]
        check(len(self.item.content) > 0, "item.content", "must not be empty")
        for i, part in enumerate(self.item.content):
            where = f"item.content[{i}]"
            check(part.type in allowed, f"{where}.type",
                  f"{self.item.role} messages accept {', '.join(sorted(allowed))}, not {part.type!r}")
            check(part.text is not None, f"{where}.text", "is required")


@dataclass(frozen=True, kw_only=True)
class ConversationItemTruncate(ClientEvent):
    """The client played only ``audio_end_ms`` ms of an assistant item's audio (barge-in)."""

    type: ClassVar[str] = "conversation.item.truncate"
    item_id: str
    content_index: int
    audio_end_ms: int

    def __post_init__(self) -> None:
        check(self.content_index >= 0, "content_index", "must be >= 0")
        check(self.audio_end_ms >= 0, "audio_end_ms", "must be >= 0")


@dataclass(frozen=True, kw_only=True)
class ConversationItemDelete(ClientEvent):
    """Remove an item from the conversation (answered by ``conversation.item.deleted``)."""

    type: ClassVar[str] = "conversation.item.delete"
    item_id: str


@dataclass(frozen=True, kw_only=True)
class ConversationItemRetrieve(ClientEvent):
    """Ask for an item of the conversation (answered by ``conversation.item.retrieved``)."""

    type: ClassVar[str] = "conversation.item.retrieve"
    item_id: str


@dataclass(frozen=True, kw_only=True)
class OutputAudioBufferClear(ClientEvent):
    """Stop the audio of the current reply: its unsent audio is dropped, a reply still being made
    is cancelled, the history keeps what was heard (answered by ``output_audio_buffer.cleared``)."""

    type: ClassVar[str] = "output_audio_buffer.clear"


@dataclass(frozen=True, kw_only=True)
class XPlayback(ClientEvent):
    """Extension: ``audio_end_ms`` ms of an assistant item's audio have been played so far."""

    type: ClassVar[str] = "x.playback"
    item_id: str
    response_id: str | None = None
    audio_end_ms: int
    #: True once the client has played all audio it received for the item.
    finished: bool = False

    def __post_init__(self) -> None:
        check(self.audio_end_ms >= 0, "audio_end_ms", "must be >= 0")


@dataclass(frozen=True, kw_only=True)
class XTtsSpeak(ClientEvent):
    """Extension: speak ``text`` (no LLM, not added to history); answered by x.tts.* events."""

    type: ClassVar[str] = "x.tts.speak"
    request_id: str
    text: str
    voice: str | None = None
    #: >1 speaks slower.
    length_scale: float | None = None
    noise_scale: float | None = None
    noise_w: float | None = None
    speaker_id: int | None = None

    def __post_init__(self) -> None:
        check(bool(self.request_id), "request_id", "must not be empty")
        check(bool(self.text.strip()), "text", "must not be empty")
        check(self.length_scale is None or 0.1 <= self.length_scale <= 10, "length_scale", "must be in 0.1–10")
        check(self.noise_scale is None or 0 <= self.noise_scale <= 2, "noise_scale", "must be in 0–2")
        check(self.noise_w is None or 0 <= self.noise_w <= 2, "noise_w", "must be in 0–2")
        check(self.speaker_id is None or self.speaker_id >= 0, "speaker_id", "must be >= 0")


@dataclass(frozen=True, kw_only=True)
class XTtsCancel(ClientEvent):
    """Extension: stop an ``x.tts.speak`` request (answered by ``x.tts.done`` status cancelled)."""

    type: ClassVar[str] = "x.tts.cancel"
    request_id: str
