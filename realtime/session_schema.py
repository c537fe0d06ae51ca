"""The session object of the Realtime protocol (GA shape) and ``session.update`` merging.

``SessionConfig`` is the full, effective session sent in ``session.created`` /
``session.updated``. A ``session.update`` carries a *partial* session: only the keys present
change, nested objects merge (``audio.input.turn_detection: {"silence_duration_ms": 800}``
keeps the other VAD settings), and ``null`` clears ``turn_detection`` (push-to-talk) or
``transcription``; ``tools`` is replaced as a whole. Keys we do not implement (``tracing``,
``noise_reduction``…) are accepted and ignored; their paths are reported so the session can log them.

Units: sample rates in Hz, durations in ms.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from realtime.tools import FunctionTool, ToolChoice, check_tools
from realtime.wire import (
    ErrorCode,
    ProtocolError,
    WireObject,
    check,
    decode_value,
    nullable,
    reparent,
)

if typing.TYPE_CHECKING:
    from base.config import Config

#: Sample rates accepted for ``audio/pcm`` input (Hz); the ASR side resamples to 16 kHz.
INPUT_RATES = (16000, 24000)
#: Sample rates accepted for ``audio/pcm`` output (Hz); TTS audio is resampled to it.
OUTPUT_RATES = (16000, 22050, 24000, 48000)
#: G.711 formats (8-bit μ-law and A-law, 8 kHz, as telephony bridges send them), both directions.
G711_FORMATS = ("audio/pcmu", "audio/pcma")
#: Sample rate of G.711 audio (Hz): the only one it has.
G711_RATE = 8000
#: Session keys a client may send but cannot change.
READ_ONLY_KEYS = frozenset({"id", "object", "model"})


@dataclass(frozen=True, kw_only=True)
class AudioFormat(WireObject):
    """``{"type": "audio/pcm", "rate": 24000}``: mono PCM16 little-endian at ``rate`` Hz; or
    ``{"type": "audio/pcmu"}`` / ``{"type": "audio/pcma"}``: G.711 μ-law / A-law at 8000 Hz."""

    type: str = "audio/pcm"
    rate: int = 24000

    def __post_init__(self) -> None:
        check(not self.g711 or self.rate == G711_RATE, "rate", f"{self.type} is {G711_RATE} Hz")

    @property
    def g711(self) -> bool:
        """True for μ-law or A-law (one byte a sample at 8 kHz)."""
        return self.type in G711_FORMATS


@dataclass(frozen=True, kw_only=True)
class TurnDetection(WireObject):
    """Turn detection: ``server_vad`` (webrtcvad, a silence ends the turn) or ``semantic_vad`` (the same
    VAD plus an end-of-turn model, ``eagerness``). ``None`` in place of this object means push-to-talk."""

    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    #: ``semantic_vad``: how soon a turn may end, ``low`` | ``medium`` | ``high`` | ``auto`` (= medium).
    eagerness: Literal["low", "medium", "high", "auto"] | None = None
    #: OpenAI's activation threshold 0.0–1.0, mapped to ``x_aggressiveness`` (see docs).
    threshold: float | None = None
    #: Audio kept before the detected speech start, ms.
    prefix_padding_ms: int = 300
    #: Silence that ends a turn, ms.
    silence_duration_ms: int = 500
    #: Start a response automatically when speech stops.
    create_response: bool = True
    #: Cancel the playing response when the user starts speaking (barge-in).
    interrupt_response: bool = True
    #: Start a response after this much silence following the last response, ms; None is off.
    idle_timeout_ms: int | None = None
    #: Extension: webrtcvad aggressiveness 0–3 actually used (wins over ``threshold``).
    x_aggressiveness: int = 2

    def __post_init__(self) -> None:
        check(self.threshold is None or 0.0 <= self.threshold <= 1.0, "threshold", "must be in 0.0–1.0")
        check(0 <= self.prefix_padding_ms <= 10_000, "prefix_padding_ms", "must be in 0–10000")
        check(0 < self.silence_duration_ms <= 10_000, "silence_duration_ms", "must be in 1–10000")
        check(self.idle_timeout_ms is None or self.idle_timeout_ms > 0, "idle_timeout_ms", "must be > 0")
        check(0 <= self.x_aggressiveness <= 3, "x_aggressiveness", "must be 0, 1, 2 or 3")


def aggressiveness_from_threshold(threshold: float) -> int:
    """webrtcvad aggressiveness for an OpenAI VAD threshold: [0, .25)→0, [.25, .5)→1, [.5, .75)→2, [.75, 1]→3."""
    return min(3, int(threshold * 4))


@dataclass(frozen=True, kw_only=True)
class InputTranscription(WireObject):
    """Transcription of user audio; model is informational (the server's ASR model is used)."""

    model: str | None = None
    #: ISO-639-1 code ("en", "zh"); None lets the ASR detect it.
    language: str | None = None
    #: Text to guide the transcription (whisper initial prompt).
    prompt: str | None = None


@dataclass(frozen=True, kw_only=True)
class AudioInput(WireObject):
    format: AudioFormat = field(default_factory=AudioFormat)
    turn_detection: TurnDetection | None = nullable(default_factory=TurnDetection)
    transcription: InputTranscription | None = nullable(default_factory=InputTranscription)


@dataclass(frozen=True, kw_only=True)
class AudioOutput(WireObject):
    format: AudioFormat = field(default_factory=AudioFormat)
    #: Voice name: one of the server's ``tts.voices`` (``"default"``: the server's own voice).
    voice: str = "default"
    #: Speaking rate multiple, 0.25–1.5 (TTS length_scale = 1 / speed).
    speed: float = 1.0

    def __post_init__(self) -> None:
        check(0.25 <= self.speed <= 1.5, "speed", "must be in 0.25–1.5")


@dataclass(frozen=True, kw_only=True)
class AudioConfig(WireObject):
    input: AudioInput = field(default_factory=AudioInput)
    output: AudioOutput = field(default_factory=AudioOutput)


@dataclass(frozen=True, kw_only=True)
class SessionConfig(WireObject):
    """The effective session, as in ``session.created`` / ``session.updated``."""

    #: ``"realtime"``: a conversation; ``"transcription"``: VAD and transcripts only (no LLM, no TTS).
    type: Literal["realtime", "transcription"] = "realtime"
    object: str = "realtime.session"
    id: str = "sess_local"
    model: str = "voxloop"
    instructions: str = ""
    #: ("audio",): speech plus transcript; ("text",): text only (no TTS).
    output_modalities: tuple[Literal["audio", "text"], ...] = ("audio",)
    audio: AudioConfig = field(default_factory=AudioConfig)
    max_output_tokens: int | Literal["inf"] = "inf"
    #: Functions the model may call (realtime/tools.py); a ``session.update`` replaces the list.
    tools: tuple[FunctionTool, ...] = ()
    #: ``auto`` | ``none`` | ``required`` | ``{"type": "function", "name": …}``.
    tool_choice: ToolChoice = "auto"
    #: Extension: binary WebSocket frames carry audio both ways (see docs/protocol.md).
    x_binary_audio: bool = False
    #: Extension: send the ``x.*`` server events (turn metrics, paused/resumed/cleared playback);
    #: off, a client sees only OpenAI events (``x.tts.*`` answer ``x.tts.speak`` either way).
    x_events: bool = False

    def __post_init__(self) -> None:
        check(len(self.output_modalities) == 1, "output_modalities", 'must be ["audio"] or ["text"]')
        tokens = self.max_output_tokens
        check(tokens == "inf" or 1 <= tokens <= 4096, "max_output_tokens", 'must be 1–4096 or "inf"')

    @property
    def input_rate(self) -> int:
        """Sample rate of client audio (Hz)."""
        return self.audio.input.format.rate

    @property
    def output_rate(self) -> int:
        """Sample rate of audio sent to the client (Hz)."""
        return self.audio.output.format.rate


def default_session(cfg: Config, session_id: str = "sess_local",
                    options: ConnectOptions | None = None) -> SessionConfig:
    """The session a new connection starts with, from the server config (24 kHz both ways) and
    what its URL asked (``?intent=transcription``, ``?x_events=true``)."""
    vad = cfg.vad
    options = options or ConnectOptions()
    return SessionConfig(
        id=session_id,
        type=options.kind,  # type: ignore[arg-type]
        x_events=options.x_events,
        instructions=cfg.llm.system_prompt,
        audio=AudioConfig(
            input=AudioInput(
                turn_detection=TurnDetection(
                    prefix_padding_ms=vad.prefix_padding_ms,
                    silence_duration_ms=vad.silence_duration_ms,
                    x_aggressiveness=vad.aggressiveness,
                ),
                transcription=InputTranscription(model="whisper", language=cfg.asr.language),
            ),
        ),
        max_output_tokens=min(cfg.llm.max_tokens, 4096),
    )


# --------------------------------------------------------------------------- URL parameters
#: Values of a URL parameter that turn an extension on (``?x_events=true``).
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class ConnectOptions:
    """What the WebSocket URL's query asks of the session it opens."""

    #: ``"realtime"``, or ``"transcription"`` for ``?intent=transcription`` (as the OpenAI API).
    kind: str = "realtime"
    #: ``?x_events=true``: send the ``x.*`` server events from the first one on.
    x_events: bool = False


def connect_options(query: Mapping[str, list[str]]) -> ConnectOptions:
    """The session options of a parsed URL query (``urllib.parse.parse_qs``); other parameters
    (``model``, ``token``) are not the session's. Raises ``ProtocolError`` for a bad value."""
    intent = query.get("intent", ["realtime"])[-1]
    if intent not in ("realtime", "transcription"):
        raise ProtocolError(ErrorCode.INVALID_VALUE,
                            f"intent: 'realtime' or 'transcription', got {intent!r}", param="intent")
    flag = query.get("x_events", ["false"])[-1].lower()
    if flag not in (*_TRUE, "0", "false", "no", "off"):
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"x_events: true or false, got {flag!r}", param="x_events")
    return ConnectOptions(kind=intent, x_events=flag in _TRUE)


# --------------------------------------------------------------------------- updates
def validate_session_update(raw: Any, path: str = "session") -> tuple[dict[str, Any], tuple[str, ...]]:
    """Check a partial session from ``session.update``.

    Returns ``(update, ignored)``: ``update`` holds only the keys we implement, with
    validated JSON values; ``ignored`` lists the dotted paths of keys that were dropped.
    Raises :class:`ProtocolError` (``invalid_value``, ``unsupported_audio_format``…).
    """
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"{path}: expected an object", param=path)
    if raw.get("type", "realtime") not in ("realtime", "transcription"):
        raise ProtocolError(
            ErrorCode.INVALID_VALUE,
            f"{path}.type: 'realtime' or 'transcription', got {raw.get('type')!r}",
            param=f"{path}.type",
        )
    ignored: list[str] = []
    update = _validate_partial(SessionConfig, raw, path, ignored, top=True)
    _check_formats(update, path)
    apply_session_update(SessionConfig(), update, path=path, whole=False)  # value ranges (__post_init__)
    return update, tuple(ignored)


def _validate_partial(
    cls: type, raw: Mapping[str, Any], path: str, ignored: list[str], top: bool = False
) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        sub = f"{path}.{key}"
        if key not in fields or (top and key in READ_ONLY_KEYS):
            ignored.append(sub)
            continue
        nested = _wire_object_type(hints[key])
        if value is None:
            if not (fields[key].metadata.get("nullable") or type(None) in typing.get_args(hints[key])):
                raise ProtocolError(ErrorCode.INVALID_VALUE, f"{sub}: must not be null", param=sub)
            out[key] = None
        elif nested is not None:
            if not isinstance(value, dict):
                raise ProtocolError(ErrorCode.INVALID_VALUE, f"{sub}: expected an object", param=sub)
            out[key] = _validate_partial(nested, value, sub, ignored)
        else:
            decoded = decode_value(value, hints[key], sub)
            out[key] = list(decoded) if isinstance(decoded, tuple) else decoded
    return out


def _wire_object_type(tp: Any) -> type | None:
    """The WireObject class ``X`` of ``X`` or ``X | None``, else None (a tuple or a union of others too)."""
    if typing.get_origin(tp) is tuple:
        return None
    options = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    if len(options) == 1 and isinstance(options[0], type) and issubclass(options[0], WireObject):
        return options[0]
    return None


def _check_formats(update: Mapping[str, Any], path: str) -> None:
    audio = update.get("audio", {})
    for direction, rates in (("input", INPUT_RATES), ("output", OUTPUT_RATES)):
        fmt = audio.get(direction, {}).get("format")
        if fmt is None:
            continue
        where = f"{path}.audio.{direction}.format"
        if fmt.get("type", "audio/pcm") not in ("audio/pcm", *G711_FORMATS):
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
                f"{where}.type: 'audio/pcm' (PCM16 LE mono), 'audio/pcmu' or 'audio/pcma' (G.711 at 8 kHz), "
                f"got {fmt['type']!r}", param=f"{where}.type")
        if fmt.get("type") in G711_FORMATS:
            if fmt.setdefault("rate", G711_RATE) != G711_RATE:
                raise ProtocolError(
                    ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
                    f"{where}.rate: {fmt['type']} is {G711_RATE} Hz, got {fmt['rate']}", param=f"{where}.rate")
            continue
        if "rate" in fmt and fmt["rate"] not in rates:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
                f"{where}.rate: supported {direction} rates are {', '.join(map(str, rates))} Hz, "
                f"got {fmt['rate']}",
                param=f"{where}.rate",
            )


def apply_session_update(
    current: SessionConfig,
    update: Mapping[str, Any],
    defaults: SessionConfig | None = None,
    path: str = "session",
    whole: bool = True,
) -> SessionConfig:
    """Merge a validated partial session (from :func:`validate_session_update`) into ``current``.

    An object that was ``null`` (turn detection, transcription) and is set again starts from
    ``defaults`` (the server's initial session), not from the dataclass defaults. ``whole``: also
    check what spans keys (``tool_choice`` names one of ``tools``) in the merged session.
    """
    defaults = defaults or SessionConfig()
    merged = _merge(current, update, defaults, path)
    if whole:
        try:
            check_tools(merged.tools, merged.tool_choice)
        except ProtocolError as exc:
            raise reparent(exc, path) from None
    return merged


def _merge(obj: WireObject, update: Mapping[str, Any], defaults: WireObject | None, path: str) -> Any:
    hints = typing.get_type_hints(type(obj))
    changes: dict[str, Any] = {}
    for key, value in update.items():
        sub = f"{path}.{key}"
        nested = _wire_object_type(hints[key])
        if nested is None or value is None:
            changes[key] = tuple(value) if isinstance(value, list) else value
            continue
        base = getattr(obj, key)
        default_sub = getattr(defaults, key, None) if defaults is not None else None
        if base is None:
            base = default_sub if default_sub is not None else nested()
        changes[key] = _merge(base, value, default_sub, sub)
    if isinstance(obj, TurnDetection):
        _normalize_aggressiveness(changes)
    if isinstance(obj, AudioFormat) and obj.g711 and changes.get("type") == "audio/pcm" and "rate" not in changes:
        changes["rate"] = AudioFormat().rate  # back from G.711 (8 kHz only) to PCM: its default rate
    try:
        return dataclasses.replace(obj, **changes)
    except ProtocolError as exc:
        raise reparent(exc, path) from None


def _normalize_aggressiveness(changes: dict[str, Any]) -> None:
    """``x_aggressiveness`` wins; a ``threshold`` alone sets it; an explicit one alone clears threshold."""
    if "x_aggressiveness" in changes:
        changes.setdefault("threshold", None)
    elif changes.get("threshold") is not None:
        changes["x_aggressiveness"] = aggressiveness_from_threshold(changes["threshold"])


