"""Wire-form helpers for the Realtime protocol: ids, error codes, and a tiny dataclass codec.

Every protocol object (events, items, session config) is a frozen, keyword-only dataclass
deriving from :class:`WireObject`. Field names are the JSON keys; ``to_dict()`` gives the
wire form and ``from_dict()`` validates one, raising :class:`ProtocolError` with a stable
``code`` and the dotted ``param`` path of the bad field. Unknown keys are ignored (the
OpenAI SDK sends many we do not use); the caller decides about unknown *event types*.

Conventions of the wire form:

* an optional field whose value is ``None`` is omitted, unless its field metadata says
  ``nullable`` (then ``null`` is sent and means something, e.g. ``turn_detection: null``);
* tuples are JSON arrays, nested ``WireObject`` s are JSON objects;
* audio (``np.ndarray`` of int16) is base64 of little-endian PCM16 bytes.

No I/O, no asyncio.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, ClassVar, Literal

import numpy as np
import pybase64

from base.errors import ProtocolError

__all__ = [
    "ErrorCode",
    "PcmEquality",
    "ProtocolError",
    "WireObject",
    "decode_base64",
    "decode_pcm16",
    "encode_pcm16",
    "event_id_of",
    "new_id",
    "nullable",
    "pcm16_from_bytes",
    "wire_name",
]


class ErrorCode:
    """The stable ``error.code`` strings (all listed in docs/protocol.md)."""

    # Raised by the protocol core (realtime/protocol.py, realtime/events.py).
    INVALID_JSON = "invalid_json"
    MESSAGE_TOO_LARGE = "message_too_large"
    UNKNOWN_EVENT_TYPE = "unknown_event_type"
    UNSUPPORTED_EVENT_TYPE = "unsupported_event_type"
    MISSING_FIELD = "missing_field"
    INVALID_VALUE = "invalid_value"
    INVALID_BASE64 = "invalid_base64"
    INVALID_AUDIO_LENGTH = "invalid_audio_length"
    UNSUPPORTED_AUDIO_FORMAT = "unsupported_audio_format"
    BINARY_NOT_NEGOTIATED = "binary_not_negotiated"
    TEXT_TOO_LONG = "text_too_long"
    # Raised by the session (OpenAI's own codes where one exists).
    INPUT_AUDIO_BUFFER_COMMIT_EMPTY = "input_audio_buffer_commit_empty"
    CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE = "conversation_already_has_active_response"
    RESPONSE_CANCEL_NOT_ACTIVE = "response_cancel_not_active"
    ITEM_NOT_FOUND = "item_not_found"
    INPUT_AUDIO_BUFFER_FULL = "input_audio_buffer_full"
    DUPLICATE_REQUEST_ID = "duplicate_request_id"
    REQUEST_NOT_FOUND = "request_not_found"
    #: A ``function_call_output`` whose ``call_id`` is no function call of the conversation.
    UNKNOWN_CALL_ID = "unknown_call_id"
    #: A second ``function_call_output`` for the same call.
    CALL_ALREADY_ANSWERED = "call_already_answered"
    # From base.errors: InvalidInput, Overloaded, ModelError, anything unexpected.
    INVALID_REQUEST_ERROR = "invalid_request_error"
    SERVER_OVERLOADED = "server_overloaded"
    MODEL_ERROR = "model_error"
    INTERNAL_ERROR = "internal_error"


#: Largest integer accepted in a field (JSON-safe, 2**53 - 1).
MAX_SAFE_INT = 2**53 - 1


#: 8 random hex digits per process (read once from the OS) then a 12-hex-digit counter: ids are unique
#: within a process by construction and across processes (front ends) with overwhelming probability,
#: and making one costs no system call (the hot path makes one per audio delta).
_ID_TAG = ""  # set by _new_id_tag() below
_ID_COUNTER = itertools.count(int.from_bytes(os.urandom(3), "big"))


def new_id(prefix: str) -> str:
    """A fresh id like ``event_3f9c0a…`` (prefix, underscore, 20 hex digits); not a secret."""
    return f"{prefix}_{_ID_TAG}{next(_ID_COUNTER) & 0xFFFFFFFFFFFF:012x}"


def _new_id_tag() -> None:
    global _ID_TAG
    _ID_TAG = os.urandom(4).hex()


_new_id_tag()
os.register_at_fork(after_in_child=_new_id_tag)  # a forked process gets its own tag


def event_id_of(data: Mapping[str, Any]) -> str | None:
    """The ``event_id`` of a raw message when it is a string (echoed in errors)."""
    value = data.get("event_id")
    return value if isinstance(value, str) else None


def nullable(**kwargs: Any) -> Any:
    """A dataclass field whose ``None`` is sent as JSON ``null`` instead of being omitted.

    Takes ``default=`` or ``default_factory=``; without either the default is None.
    """
    if "default_factory" not in kwargs:
        kwargs.setdefault("default", None)
    return dataclasses.field(metadata={"nullable": True}, **kwargs)


def wire_name(name: str, default: Any = dataclasses.MISSING) -> Any:
    """A dataclass field sent under another JSON key (e.g. ``pcm`` sent as ``delta``)."""
    return dataclasses.field(default=default, metadata={"wire": name})


# --------------------------------------------------------------------------- audio
def encode_pcm16(pcm: np.ndarray) -> str:
    """Base64 of mono int16 samples as little-endian PCM16 bytes.

    pybase64 (SIMD): ~2 instead of ~20 µs for 200 ms at 24 kHz, the same text as the stdlib's
    (``python -m bench.ws_serialize``); audio deltas are most of what a server sends."""
    return pybase64.b64encode(_pcm16le(pcm)).decode("ascii")


def pcm16_bytes(pcm: np.ndarray) -> bytes:
    """Little-endian PCM16 bytes of mono int16 samples (raises on another dtype)."""
    return _pcm16le(pcm).tobytes()


def _pcm16le(pcm: np.ndarray) -> np.ndarray:
    """Contiguous little-endian int16 samples (a view when they already are); raises on another dtype."""
    if pcm.dtype.kind != "i" or pcm.dtype.itemsize != 2:
        raise TypeError(f"audio must be int16, got {pcm.dtype}")
    return np.ascontiguousarray(pcm, dtype="<i2")


def pcm16_from_bytes(raw: bytes, param: str | None = None) -> np.ndarray:
    """Read-only int16 samples from little-endian PCM16 bytes; odd length is an error."""
    if len(raw) % 2:
        raise ProtocolError(
            ErrorCode.INVALID_AUDIO_LENGTH,
            f"PCM16 audio must be a whole number of 2-byte samples, got {len(raw)} bytes",
            param=param,
        )
    return np.frombuffer(raw, dtype="<i2").astype(np.int16, copy=False)


def decode_base64(text: str, param: str | None = None) -> bytes:
    """Bytes of strict base64 (standard alphabet, padding required, no padding beyond it)."""
    try:
        return pybase64.b64decode(text, validate=True)
    except (ValueError, TypeError):  # binascii.Error is a ValueError
        raise ProtocolError(
            ErrorCode.INVALID_BASE64, "audio is not valid base64", param=param
        ) from None


def decode_pcm16(text: str, param: str | None = None) -> np.ndarray:
    """Int16 samples from base64 PCM16 (strict alphabet, padding required, no padding beyond it)."""
    return pcm16_from_bytes(decode_base64(text, param), param)


# --------------------------------------------------------------------------- codec
def _invalid(param: str, expected: str, value: Any) -> ProtocolError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return ProtocolError(
        ErrorCode.INVALID_VALUE, f"{param}: expected {expected}, got {shown}", param=param
    )


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _decode_scalar(value: Any, tp: type, path: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _invalid(path, "a boolean", value)
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_SAFE_INT:
            return value
        raise _invalid(path, "an integer", value)
    if tp is float:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_SAFE_INT:
            return float(value)
        if isinstance(value, float) and math.isfinite(value):
            return value
        raise _invalid(path, "a finite number", value)
    if tp is str:
        if isinstance(value, str):
            return value
        raise _invalid(path, "a string", value)
    raise TypeError(f"unsupported field type {tp!r} at {path}")


def decode_value(value: Any, tp: Any, path: str) -> Any:
    """Validate/convert one JSON value against a type hint; ``path`` names it in errors."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return decode_value(value, options[0], path)
        tagged = _tagged(tuple(options))
        if tagged and isinstance(value, dict) and "type" in value:  # e.g. an item, by its type
            if isinstance(value["type"], str) and value["type"] in tagged:
                return tagged[value["type"]].from_dict(value, path)
            if len(tagged) == len(options):
                raise _invalid(_join(path, "type"), "one of " + ", ".join(map(repr, tagged)), value["type"])
        for option in options:  # e.g. int | Literal["inf"]
            try:
                return decode_value(value, option, path)
            except ProtocolError:
                pass
        raise _invalid(path, " or ".join(_describe(o) for o in options), value)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if isinstance(value, str | int) and not isinstance(value, bool) and value in allowed:
            return value
        raise _invalid(path, "one of " + ", ".join(map(repr, allowed)), value)
    if origin is tuple:
        if not isinstance(value, list):
            raise _invalid(path, "an array", value)
        inner = typing.get_args(tp)[0]
        return tuple(decode_value(v, inner, _join(path, i)) for i, v in enumerate(value))
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, dict):
            raise _invalid(path, "an object", value)
        args = typing.get_args(tp)
        inner = args[1] if args else Any
        return {str(k): decode_value(v, inner, _join(path, str(k))) for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, WireObject):
        if not isinstance(value, dict):
            raise _invalid(path, "an object", value)
        return tp.from_dict(value, path)
    if value is None:
        raise _invalid(path, _describe(tp), value)
    return _decode_scalar(value, tp, path)


@cache
def _tagged(options: tuple) -> dict[str, type]:
    """The ``WireObject`` options of a union whose ``type`` field is one literal, by that literal."""
    out: dict[str, type] = {}
    for option in options:
        if isinstance(option, type) and issubclass(option, WireObject):
            hint = _hints(option).get("type")
            if typing.get_origin(hint) is Literal and len(typing.get_args(hint)) == 1:
                out[typing.get_args(hint)[0]] = option
    return out


def _describe(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(tp)))
    return getattr(tp, "__name__", str(tp))


def encode_value(value: Any) -> Any:
    """The JSON form of a field value."""
    if isinstance(value, WireObject):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [encode_value(v) for v in value]
    if isinstance(value, Mapping):
        return {k: encode_value(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return encode_pcm16(value)
    return value


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


class WireObject:
    """Base of every protocol dataclass: field names are JSON keys (see module docstring).

    Subclasses with a ``type: ClassVar[str]`` write it first as ``"type"`` (events);
    nested objects whose ``type`` varies keep it as an ordinary field.
    """

    type: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready wire form (a fresh dict)."""
        out: dict[str, Any] = {}
        if _is_event_class(type(self)):
            out["type"] = self.type
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.metadata.get("wire") is False:
                continue
            value = getattr(self, f.name)
            if value is None and not f.metadata.get("nullable"):
                continue
            out[f.metadata.get("wire", f.name)] = encode_value(value)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str = "") -> typing.Self:
        """Validate ``data`` (a decoded JSON object) into an instance; unknown keys are ignored."""
        hints = _hints(cls)
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.metadata.get("wire") is False or not f.init:
                continue
            key = f.metadata.get("wire", f.name)
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if key not in data:
                if required:
                    raise ProtocolError(
                        ErrorCode.MISSING_FIELD, f"missing field {_join(path, key)}",
                        param=_join(path, key),
                    )
                continue
            kwargs[f.name] = cls._decode_field(f, data[key], hints[f.name], _join(path, key))
        try:
            return cls(**kwargs)
        except ProtocolError as exc:  # __post_init__ checks name fields relative to the object
            raise reparent(exc, path) from None

    @classmethod
    def _decode_field(cls, f: dataclasses.Field, value: Any, tp: Any, path: str) -> Any:
        if tp is np.ndarray:
            if not isinstance(value, str):
                raise _invalid(path, "a base64 string", value)
            return decode_pcm16(value, path)
        return decode_value(value, tp, path)


@cache
def _is_event_class(cls: type) -> bool:
    """True when ``type`` is a class constant (events), not a data field (nested objects)."""
    return isinstance(getattr(cls, "type", None), str) and "type" not in {
        f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
    }


class PcmEquality:
    """``==`` for events holding an ndarray (dataclass eq would compare arrays elementwise)."""

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            a, b = getattr(self, f.name), getattr(other, f.name)
            same = np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
            if not same:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]


def reparent(exc: ProtocolError, path: str) -> ProtocolError:
    """``exc`` with its ``param`` (and message) made relative to the enclosing ``path``."""
    if not path or exc.param is None:
        return exc
    if exc.args and str(exc.args[0]).startswith(f"{exc.param}:"):
        exc.args = (f"{path}.{exc.args[0]}",)
    exc.param = _join(path, exc.param)
    return exc


def check(condition: bool, param: str, message: str) -> None:
    """Raise ``invalid_value`` for ``param`` unless ``condition`` holds (for ``__post_init__``)."""
    if not condition:
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"{param}: {message}", param=param)
