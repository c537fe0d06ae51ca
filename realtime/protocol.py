"""Sans-I/O core of the Realtime WebSocket protocol: frames in, events out; events in, frames out.

One :class:`RealtimeProtocol` per connection (like python-websockets' ``Protocol``): the hub
feeds it each received message and sends whatever :meth:`RealtimeProtocol.send` returns. It
never touches a socket or an event loop, so it is tested byte by byte.

It keeps the negotiated session (formats, binary fast path) because decoding depends on it:
a ``session.update`` is applied to :attr:`RealtimeProtocol.session` before the
``SessionUpdate`` event is returned, so the next ``input_audio_buffer.append`` is labelled
with the new input rate. Resampling is not done here (the session does it with soxr).

Binary fast path (negotiated with ``session.x_binary_audio: true``, see docs/protocol.md):

* client → server: a binary frame is raw PCM16 LE mono at the input rate, i.e. an
  ``input_audio_buffer.append`` without base64;
* server → client: ``response.output_audio.delta`` and ``x.tts.audio.delta`` become binary
  frames ``[u16 LE n][n bytes: JSON of the event without "delta", space-padded so the audio
  starts at an even offset][PCM16 LE]``; every other event stays JSON text.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from functools import cache
from typing import Any

import orjson
import pybase64

from realtime.events import (
    ClientEvent,
    ErrorEvent,
    InputAudioBufferAppend,
    ResponseOutputAudioDelta,
    ServerEvent,
    SessionUpdate,
    XTtsAudioDelta,
    XTtsSpeak,
    parse_client_event,
    parse_server_event,
    serialize,
)
from realtime.audio_formats import bytes_to_pcm, pcm_to_bytes
from realtime.session_schema import SessionConfig, apply_session_update
from realtime.wire import ErrorCode, ProtocolError, encode_pcm16
from base.config import LimitsConfig

__all__ = [
    "BINARY_AUDIO_EVENTS",
    "RealtimeProtocol",
    "decode_audio_frame",
    "encode_audio_frame",
    "encode_audio_json",
    "parse_server_frame",
]

#: Server events sent as binary frames when the fast path is on.
BINARY_AUDIO_EVENTS = (ResponseOutputAudioDelta, XTtsAudioDelta)
_HEADER_LEN = struct.Struct("<H")
_DEFAULT_LIMITS = LimitsConfig()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class RealtimeProtocol:
    """Protocol state of one connection: validation, the negotiated session, framing."""

    def __init__(
        self,
        *,
        max_message_bytes: int = _DEFAULT_LIMITS.max_message_bytes,
        max_text_chars: int = _DEFAULT_LIMITS.max_text_chars,
        session: SessionConfig | None = None,
    ) -> None:
        """``max_message_bytes`` bounds one received message (bytes, base64 included);
        ``max_text_chars`` bounds text inputs; ``session`` is the initial session (also the
        base for objects a client re-enables after setting them to null)."""
        self.max_message_bytes = max_message_bytes
        self.max_text_chars = max_text_chars
        self._defaults = session or SessionConfig()
        self._session = self._defaults
        self._updated = False  # any session.update applied yet
        #: The voice names a client may choose (``audio.output.voice``, ``x.tts.speak``); None: any.
        self.voices: tuple[str, ...] | None = None

    @classmethod
    def from_limits(cls, limits: LimitsConfig, session: SessionConfig | None = None) -> RealtimeProtocol:
        return cls(max_message_bytes=limits.max_message_bytes,
                   max_text_chars=limits.max_text_chars, session=session)

    # ------------------------------------------------------------------ state
    @property
    def session(self) -> SessionConfig:
        """The effective session (after every accepted ``session.update``)."""
        return self._session

    @session.setter
    def session(self, value: SessionConfig) -> None:
        """Replace the session (initial setup, or vetoing part of an update).

        Until the first accepted ``session.update`` this also replaces the initial session,
        which is the base for settings a client re-enables after setting them to null.
        """
        self._session = value
        if not self._updated:
            self._defaults = value

    @property
    def binary_audio(self) -> bool:
        """True when the binary fast path is negotiated (both directions)."""
        return self._session.x_binary_audio

    @property
    def input_rate(self) -> int:
        """Sample rate of client audio, Hz."""
        return self._session.input_rate

    # ------------------------------------------------------------------ receive
    def receive_text(self, text: str) -> list[ClientEvent | ErrorEvent]:
        """Parse one text frame: ``[event]``, or ``[ErrorEvent]`` to send back when invalid."""
        try:
            self._check_size(len(text))  # UTF-8 never has fewer bytes than characters
            if not text.isascii():
                self._check_size(len(text.encode("utf-8", "surrogatepass")))
            try:
                data = json.loads(text, parse_constant=_reject_constant)
            except (ValueError, RecursionError) as exc:
                raise ProtocolError(ErrorCode.INVALID_JSON, f"malformed JSON: {exc}") from None
            event = parse_client_event(data, input_rate=self.input_rate, max_text_chars=self.max_text_chars,
                                       input_format=self._session.audio.input.format.type)
            self._check_voice(event)
            if isinstance(event, SessionUpdate):
                self._session = apply_session_update(self._session, event.session, self._defaults)
                self._updated = True
        except ProtocolError as exc:
            return [ErrorEvent.from_exception(exc)]
        return [event]

    def receive_bytes(self, data: bytes) -> list[ClientEvent | ErrorEvent]:
        """Parse one binary frame (raw PCM16 LE at the input rate) into an audio append."""
        try:
            if not self.binary_audio:
                raise ProtocolError(
                    ErrorCode.BINARY_NOT_NEGOTIATED,
                    "binary frames need session.x_binary_audio = true; send base64 "
                    "input_audio_buffer.append events instead",
                )
            self._check_size(len(data))
            pcm = bytes_to_pcm(bytes(data), self._session.audio.input.format.type)
        except ProtocolError as exc:
            return [ErrorEvent.from_exception(exc)]
        return [InputAudioBufferAppend(pcm=pcm, sample_rate=self.input_rate)]

    def _check_voice(self, event: ClientEvent) -> None:
        """``invalid_value`` (listing the names) for a voice the server does not have."""
        if isinstance(event, SessionUpdate):
            name, param = event.session.get("audio", {}).get("output", {}).get("voice"), "session.audio.output.voice"
        elif isinstance(event, XTtsSpeak):
            name, param = event.voice, "voice"
        else:
            return
        if name is not None and self.voices is not None and name not in self.voices:
            raise ProtocolError(ErrorCode.INVALID_VALUE,
                                f"{param}: no voice {name!r} on this server; voices: {', '.join(self.voices)}",
                                param=param, event_id=event.event_id)

    def _check_size(self, size: int) -> None:
        if size > self.max_message_bytes:
            raise ProtocolError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"message of {size} bytes exceeds the limit of {self.max_message_bytes} bytes",
            )

    # ------------------------------------------------------------------ send
    def send(self, event: ServerEvent) -> str | bytes:
        """The frame for ``event``: bytes for audio deltas on the fast path, else JSON text; audio in
        the session's output format (PCM16, or G.711 bytes for ``audio/pcmu`` / ``audio/pcma``)."""
        if isinstance(event, BINARY_AUDIO_EVENTS):
            fmt = self._session.audio.output.format.type
            return encode_audio_frame(event, fmt) if self.binary_audio else encode_audio_json(event, fmt)
        return serialize(event)


# --------------------------------------------------------------------------- audio frames
# Audio deltas are most of what a server sends (one per ``server.audio_delta_ms`` of speech per
# listener), so they skip the generic codec: the small header is JSON-encoded alone and the
# audio is added as bytes (binary frame) or as base64 spliced into the JSON text. Both put
# ``"type"`` first, like every event, which the hub's compression policy relies on.
@cache
def _header_fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name != "pcm")


def audio_header(event: ResponseOutputAudioDelta | XTtsAudioDelta) -> bytes:
    """An audio delta's message without its audio: the header as compact UTF-8 JSON. orjson: the same text as ``json.dumps`` with compact
    separators and ``ensure_ascii=False``, in 0.5 instead of 4 µs (bench/ws_serialize.py)."""
    return orjson.dumps({"type": event.type, **{name: getattr(event, name) for name in _header_fields(type(event))}})


def encode_audio_json(event: ResponseOutputAudioDelta | XTtsAudioDelta, fmt: str = "audio/pcm") -> str:
    """The JSON text of an audio delta (same wire form as ``serialize``, built without the codec);
    ``fmt``: the wire audio format (G.711 formats: base64 of its bytes)."""
    audio = encode_pcm16(event.pcm) if fmt == "audio/pcm" else pybase64.b64encode(pcm_to_bytes(event.pcm, fmt)).decode()
    return f'{audio_header(event)[:-1].decode()},"delta":"{audio}"}}'


def encode_audio_frame(event: ResponseOutputAudioDelta | XTtsAudioDelta, fmt: str = "audio/pcm") -> bytes:
    """``[u16 LE n][n bytes JSON header][audio]`` (PCM16 LE, or G.711 bytes); the audio starts at an even offset."""
    head = audio_header(event)
    if len(head) % 2:  # 2 + n even, so an Int16Array view of the audio is aligned
        head += b" "
    return _HEADER_LEN.pack(len(head)) + head + pcm_to_bytes(event.pcm, fmt)


def decode_audio_frame(frame: bytes, fmt: str = "audio/pcm") -> ResponseOutputAudioDelta | XTtsAudioDelta:
    """Client side: the audio event carried by a binary frame from the server (audio in ``fmt``)."""
    if len(frame) < _HEADER_LEN.size:
        raise ProtocolError(ErrorCode.INVALID_VALUE, "binary frame shorter than its header")
    (n,) = _HEADER_LEN.unpack_from(frame)
    end = _HEADER_LEN.size + n
    try:
        header = json.loads(frame[_HEADER_LEN.size:end].decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"bad binary frame header: {exc}") from None
    if not isinstance(header, dict) or header.get("type") not in {c.type for c in BINARY_AUDIO_EVENTS}:
        raise ProtocolError(ErrorCode.INVALID_VALUE, "binary frame header is not an audio delta")
    cls = ResponseOutputAudioDelta if header["type"] == ResponseOutputAudioDelta.type else XTtsAudioDelta
    event = cls.from_dict({**header, "delta": ""})  # validates the header fields
    return dataclasses.replace(event, pcm=bytes_to_pcm(frame[end:], fmt))


def parse_server_frame(frame: str | bytes) -> ServerEvent:
    """Client side: the server event of one WebSocket frame (JSON text or binary audio)."""
    if isinstance(frame, bytes | bytearray | memoryview):
        return decode_audio_frame(bytes(frame))
    try:
        data = json.loads(frame, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"malformed JSON: {exc}") from None
    return parse_server_event(data)
