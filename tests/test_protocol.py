"""The sans-I/O protocol core: wire round trips, validation errors, binary fast path, SDK compatibility."""

from __future__ import annotations

import base64
import json
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from realtime import events as ev
from realtime.events import (
    CLIENT_EVENTS,
    SERVER_EVENTS,
    ErrorEvent,
    InputAudioBufferAppend,
    ResponseOutputAudioDelta,
    SessionUpdate,
    XTtsAudioDelta,
    parse_client_event,
    parse_server_event,
    serialize,
)
from realtime.protocol import (
    RealtimeProtocol,
    decode_audio_frame,
    encode_audio_frame,
    parse_server_frame,
)
from realtime.session_schema import SessionConfig, default_session
from realtime.wire import ErrorCode, ProtocolError
from base.errors import Overloaded

PCM = np.array([0, 1, -1, 32767, -32768, 1234], dtype=np.int16)
PCM_B64 = base64.b64encode(PCM.astype("<i2").tobytes()).decode()
SESSION = default_session(__import__("base.config", fromlist=["Config"]).Config(), "sess_abc").to_dict()
PART = {"response_id": "resp_1", "item_id": "item_2", "output_index": 0, "content_index": 0}
USER_ITEM = {"type": "message", "role": "user", "id": "item_1", "object": "realtime.item", "status": "completed",
             "content": [{"type": "input_audio", "transcript": "hello there"}]}
ASSISTANT_ITEM = {"type": "message", "role": "assistant", "id": "item_2", "object": "realtime.item",
                  "status": "in_progress", "content": []}
RESPONSE = {"id": "resp_1", "object": "realtime.response", "status": "in_progress", "status_details": None,
            "output": [], "conversation_id": "conv_1", "output_modalities": ["audio"],
            "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "default", "speed": 1.0}},
            "max_output_tokens": 160, "metadata": None}
RESPONSE_CANCELLED = {**RESPONSE, "status": "cancelled",
                      "status_details": {"type": "cancelled", "reason": "turn_detected"},
                      "output": [{**ASSISTANT_ITEM, "status": "incomplete",
                                  "content": [{"type": "output_audio", "transcript": "Sure, the"}]},
                                 {"type": "function_call", "id": "item_5", "object": "realtime.item",
                                  "status": "completed", "call_id": "call_1", "name": "get_weather",
                                  "arguments": '{"city": "Paris"}'}],
                      "usage": {"total_tokens": 30, "input_tokens": 25, "output_tokens": 5}}

CLIENT_SAMPLES: dict[str, dict[str, Any]] = {
    "session.update": {"type": "session.update", "event_id": "c1", "session": {
        "type": "realtime", "instructions": "Be brief.", "output_modalities": ["audio"],
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000},
                            "turn_detection": {"type": "server_vad", "silence_duration_ms": 700,
                                               "x_aggressiveness": 3},
                            "transcription": {"model": "whisper", "language": "en"}},
                  "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "default"}},
        "x_binary_audio": False}},
    "input_audio_buffer.append": {"type": "input_audio_buffer.append", "event_id": "c2", "audio": PCM_B64},
    "input_audio_buffer.commit": {"type": "input_audio_buffer.commit", "event_id": "c3"},
    "input_audio_buffer.clear": {"type": "input_audio_buffer.clear"},
    "response.create": {"type": "response.create", "response": {
        "instructions": "Answer in French.", "output_modalities": ["text"], "conversation": "none",
        "max_output_tokens": 50, "metadata": {"topic": "x"},
        "tools": [{"type": "function", "name": "get_weather", "description": "Weather of a city",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                  "required": ["city"]}}],
        "tool_choice": {"type": "function", "name": "get_weather"}}},
    "response.cancel": {"type": "response.cancel", "response_id": "resp_1"},
    "conversation.item.create": {"type": "conversation.item.create", "previous_item_id": "item_0", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "What time is it?"}]}},
    "conversation.item.truncate": {"type": "conversation.item.truncate", "item_id": "item_2",
                                   "content_index": 0, "audio_end_ms": 1500},
    "conversation.item.delete": {"type": "conversation.item.delete", "event_id": "c4", "item_id": "item_2"},
    "conversation.item.retrieve": {"type": "conversation.item.retrieve", "event_id": "c5", "item_id": "item_2"},
    "output_audio_buffer.clear": {"type": "output_audio_buffer.clear", "event_id": "c6"},
    "transcription_session.update": {"type": "transcription_session.update", "event_id": "c7", "session": {
        "input_audio_format": "g711_ulaw", "input_audio_transcription": {"language": "en", "prompt": "Voxloop"},
        "turn_detection": None}},
    "x.playback": {"type": "x.playback", "item_id": "item_2", "response_id": "resp_1",
                   "audio_end_ms": 2400, "finished": True},
    "x.tts.speak": {"type": "x.tts.speak", "request_id": "tts_1", "text": "Hello world.", "voice": "default",
                    "length_scale": 1.2, "noise_scale": 0.5, "noise_w": 0.6, "speaker_id": 0},
    "x.tts.cancel": {"type": "x.tts.cancel", "request_id": "tts_1"},
}

#: Client events whose wire form is the beta API's: the GA form they are read as.
GA_FORMS = {"transcription_session.update": {"type": "transcription_session.update", "event_id": "c7", "session": {
    "type": "transcription", "audio": {"input": {"format": {"type": "audio/pcmu", "rate": 8000},
                                                 "transcription": {"language": "en", "prompt": "Voxloop"},
                                                 "turn_detection": None}}}}}

SERVER_SAMPLES: dict[str, dict[str, Any]] = {
    "session.created": {"type": "session.created", "event_id": "event_1", "session": SESSION},
    "session.updated": {"type": "session.updated", "event_id": "event_2", "session": {
        **SESSION, "x_binary_audio": True,
        "audio": {**SESSION["audio"], "input": {**SESSION["audio"]["input"], "turn_detection": None}}}},
    "input_audio_buffer.speech_started": {"type": "input_audio_buffer.speech_started", "event_id": "event_3",
                                          "audio_start_ms": 1000, "item_id": "item_1"},
    "input_audio_buffer.speech_stopped": {"type": "input_audio_buffer.speech_stopped", "event_id": "event_4",
                                          "audio_end_ms": 2500, "item_id": "item_1"},
    "input_audio_buffer.committed": {"type": "input_audio_buffer.committed", "event_id": "event_5",
                                     "item_id": "item_1", "previous_item_id": None},
    "input_audio_buffer.cleared": {"type": "input_audio_buffer.cleared", "event_id": "event_6"},
    "input_audio_buffer.timeout_triggered": {"type": "input_audio_buffer.timeout_triggered", "event_id": "event_6b",
                                             "audio_start_ms": 4000, "audio_end_ms": 10000, "item_id": "item_9"},
    "conversation.item.added": {"type": "conversation.item.added", "event_id": "event_7",
                                "item": {**USER_ITEM, "status": "in_progress",
                                         "content": [{"type": "input_audio"}]}, "previous_item_id": None},
    "conversation.item.done": {"type": "conversation.item.done", "event_id": "event_8", "item": USER_ITEM,
                               "previous_item_id": None},
    "conversation.item.truncated": {"type": "conversation.item.truncated", "event_id": "event_9",
                                    "item_id": "item_2", "content_index": 0, "audio_end_ms": 1500},
    "conversation.item.deleted": {"type": "conversation.item.deleted", "event_id": "event_9b", "item_id": "item_2"},
    "conversation.item.retrieved": {"type": "conversation.item.retrieved", "event_id": "event_9c", "item": USER_ITEM},
    "output_audio_buffer.cleared": {"type": "output_audio_buffer.cleared", "event_id": "event_9d",
                                    "response_id": "resp_1"},
    "transcription_session.updated": {"type": "transcription_session.updated", "event_id": "event_9e",
                                      "session": {**SESSION, "type": "transcription"}},
    "conversation.item.input_audio_transcription.delta": {
        "type": "conversation.item.input_audio_transcription.delta", "event_id": "event_10",
        "item_id": "item_1", "content_index": 0, "delta": "hello"},
    "conversation.item.input_audio_transcription.completed": {
        "type": "conversation.item.input_audio_transcription.completed", "event_id": "event_11",
        "item_id": "item_1", "content_index": 0, "transcript": "hello there",
        "usage": {"type": "duration", "seconds": 1.5}},
    "conversation.item.input_audio_transcription.failed": {
        "type": "conversation.item.input_audio_transcription.failed", "event_id": "event_12",
        "item_id": "item_1", "content_index": 0,
        "error": {"type": "server_error", "code": "model_error", "message": "ASR failed"}},
    "response.created": {"type": "response.created", "event_id": "event_13", "response": RESPONSE},
    "response.done": {"type": "response.done", "event_id": "event_14", "response": RESPONSE_CANCELLED},
    "response.output_item.added": {"type": "response.output_item.added", "event_id": "event_15",
                                   "response_id": "resp_1", "output_index": 0, "item": ASSISTANT_ITEM},
    "response.output_item.done": {"type": "response.output_item.done", "event_id": "event_16",
                                  "response_id": "resp_1", "output_index": 0,
                                  "item": RESPONSE_CANCELLED["output"][0]},
    "response.content_part.added": {"type": "response.content_part.added", "event_id": "event_17", **PART,
                                    "part": {"type": "audio", "transcript": ""}},
    "response.content_part.done": {"type": "response.content_part.done", "event_id": "event_18", **PART,
                                   "part": {"type": "audio", "transcript": "Sure, the"}},
    "response.output_audio.delta": {"type": "response.output_audio.delta", "event_id": "event_19", **PART,
                                    "delta": PCM_B64},
    "response.output_audio.done": {"type": "response.output_audio.done", "event_id": "event_20", **PART},
    "response.output_audio_transcript.delta": {"type": "response.output_audio_transcript.delta",
                                               "event_id": "event_21", **PART, "delta": "Sure, "},
    "response.output_audio_transcript.done": {"type": "response.output_audio_transcript.done",
                                              "event_id": "event_22", **PART, "transcript": "Sure, the"},
    "response.output_text.delta": {"type": "response.output_text.delta", "event_id": "event_23", **PART,
                                   "delta": "Bon"},
    "response.output_text.done": {"type": "response.output_text.done", "event_id": "event_24", **PART,
                                  "text": "Bonjour"},
    "response.function_call_arguments.delta": {
        "type": "response.function_call_arguments.delta", "event_id": "event_50", "response_id": "resp_1",
        "item_id": "item_5", "output_index": 1, "call_id": "call_1", "delta": '{"city": "Pa'},
    "response.function_call_arguments.done": {
        "type": "response.function_call_arguments.done", "event_id": "event_51", "response_id": "resp_1",
        "item_id": "item_5", "output_index": 1, "call_id": "call_1", "name": "get_weather",
        "arguments": '{"city": "Paris"}'},
    "error": {"type": "error", "event_id": "event_25", "error": {
        "type": "server_error", "code": "server_overloaded", "message": "TTS queue full", "param": None,
        "event_id": "c9", "retry_after_ms": 2000}},
    "x.turn.metrics": {"type": "x.turn.metrics", "event_id": "event_26", "response_id": "resp_1",
                       "item_id": "item_1", "metrics": {"asr_ms": 540.5, "llm_first_token_ms": 101.0,
                                                        "first_audio_ms": 812.25, "status": "completed"}},
    "x.output_audio_buffer.paused": {"type": "x.output_audio_buffer.paused", "event_id": "event_40",
                                     "response_id": "resp_1", "item_id": "item_1", "audio_end_ms": 1240},
    "x.output_audio_buffer.cleared": {"type": "x.output_audio_buffer.cleared", "event_id": "event_42",
                                      "response_id": "resp_1", "item_id": "item_1", "audio_end_ms": 1240},
    "x.output_audio_buffer.resumed": {"type": "x.output_audio_buffer.resumed", "event_id": "event_41",
                                      "response_id": "resp_1", "item_id": "item_1"},
    "x.tts.audio.delta": {"type": "x.tts.audio.delta", "event_id": "event_27", "request_id": "tts_1",
                          "delta": PCM_B64},
    "x.tts.done": {"type": "x.tts.done", "event_id": "event_28", "request_id": "tts_1", "status": "failed",
                   "audio_ms": 0, "error": {"type": "invalid_request_error", "code": "invalid_value",
                                            "message": "no phonemes"}},
}


# --------------------------------------------------------------------------- round trips
def test_samples_cover_every_event_type():
    assert set(CLIENT_SAMPLES) == set(CLIENT_EVENTS)
    assert set(SERVER_SAMPLES) == set(SERVER_EVENTS)


@pytest.mark.parametrize("kind", sorted(CLIENT_SAMPLES))
def test_client_event_round_trip(kind):
    wire = CLIENT_SAMPLES[kind]
    event = parse_client_event(wire)
    assert type(event) is CLIENT_EVENTS[kind]
    assert event.to_dict() == GA_FORMS.get(kind, wire)
    if kind not in GA_FORMS:  # a beta event is read into its GA form: no way back
        assert parse_client_event(json.loads(serialize(event))) == event  # dataclass -> text -> dataclass


@pytest.mark.parametrize("kind", sorted(SERVER_SAMPLES))
def test_server_event_round_trip(kind):
    wire = SERVER_SAMPLES[kind]
    event = parse_server_event(wire)
    assert type(event) is SERVER_EVENTS[kind]
    assert event.to_dict() == wire
    assert parse_server_event(json.loads(serialize(event))) == event


def test_audio_is_decoded_to_int16_at_the_session_rate():
    event = parse_client_event(CLIENT_SAMPLES["input_audio_buffer.append"], input_rate=16000)
    assert event.pcm.dtype == np.int16 and event.sample_rate == 16000
    np.testing.assert_array_equal(event.pcm, PCM)
    out = parse_server_event(SERVER_SAMPLES["response.output_audio.delta"])
    np.testing.assert_array_equal(out.pcm, PCM)
    assert out != ResponseOutputAudioDelta(**{**PART, "event_id": "event_19"}, pcm=PCM[:-1])


def test_server_events_get_fresh_ids():
    a, b = ev.InputAudioBufferCleared(), ev.InputAudioBufferCleared()
    assert a.event_id.startswith("event_") and a.event_id != b.event_id


def test_error_event_from_exceptions():
    err = ErrorEvent.from_exception(Overloaded("busy", retry_after_ms=1500), client_event_id="c7").error
    assert (err.type, err.code, err.retry_after_ms, err.event_id) == ("server_error", "server_overloaded", 1500, "c7")
    err = ErrorEvent.from_exception(RuntimeError("secret detail")).error
    assert (err.type, err.code) == ("server_error", "internal_error") and "secret" not in err.message
    err = ErrorEvent.from_exception(ProtocolError("missing_field", "m", param="item", event_id="c1")).error
    assert (err.type, err.param, err.event_id) == ("invalid_request_error", "item", "c1")


def test_tts_speak_gives_synthesis_options():
    from pipeline.tts_requests import synthesis_options

    opts = synthesis_options(parse_client_event(CLIENT_SAMPLES["x.tts.speak"]), sample_rate=24000)
    assert (opts.length_scale, opts.noise_scale, opts.noise_w, opts.speaker_id, opts.sample_rate) == (
        1.2, 0.5, 0.6, 0, 24000)


# --------------------------------------------------------------------------- validation errors
AUDIO_FMT = "session.audio.input.format"
BAD_MESSAGES = [
    ("{not json", ErrorCode.INVALID_JSON, None),
    ('{"type": "input_audio_buffer.commit", "x": NaN}', ErrorCode.INVALID_JSON, None),
    ("[1, 2]", ErrorCode.INVALID_JSON, None),
    ('{"event_id": "c1"}', ErrorCode.MISSING_FIELD, "type"),
    ('{"type": 7}', ErrorCode.INVALID_VALUE, "type"),
    ('{"type": "response.explode"}', ErrorCode.UNKNOWN_EVENT_TYPE, "type"),
    ('{"type": "transcription_session.update", "session": {"input_audio_format": "opus"}}',
     ErrorCode.UNSUPPORTED_AUDIO_FORMAT, "session.input_audio_format"),
    ('{"type": "conversation.item.delete"}', ErrorCode.MISSING_FIELD, "item_id"),
    ('{"type": "input_audio_buffer.append"}', ErrorCode.MISSING_FIELD, "audio"),
    ('{"type": "input_audio_buffer.append", "audio": 5}', ErrorCode.INVALID_VALUE, "audio"),
    ('{"type": "input_audio_buffer.append", "audio": "AAA"}', ErrorCode.INVALID_BASE64, "audio"),
    ('{"type": "input_audio_buffer.append", "audio": "AA$A"}', ErrorCode.INVALID_BASE64, "audio"),
    ('{"type": "input_audio_buffer.append", "audio": "AAAA\\n"}', ErrorCode.INVALID_BASE64, "audio"),
    ('{"type": "input_audio_buffer.append", "audio": "AA-_"}', ErrorCode.INVALID_BASE64, "audio"),
    ('{"type": "input_audio_buffer.append", "audio": "AA=="}', ErrorCode.INVALID_AUDIO_LENGTH, "audio"),
    ('{"type": "input_audio_buffer.append", "audio": "AAA=="}', ErrorCode.INVALID_BASE64, "audio"),
    ('{"type": "input_audio_buffer.append", "audio": "AAAA===="}', ErrorCode.INVALID_BASE64, "audio"),
    ('{"type": "input_audio_buffer.append", "audio": "AAA\u00e9"}', ErrorCode.INVALID_BASE64, "audio"),
    ('{"type": "input_audio_buffer.append", "audio": "AAAA"}', ErrorCode.INVALID_AUDIO_LENGTH, "audio"),
    ('{"type": "session.update"}', ErrorCode.MISSING_FIELD, "session"),
    ('{"type": "session.update", "session": []}', ErrorCode.INVALID_VALUE, "session"),
    ('{"type": "session.update", "session": {"type": "translation"}}', ErrorCode.INVALID_VALUE, "session.type"),
    ('{"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/opus"}}}}}',
     ErrorCode.UNSUPPORTED_AUDIO_FORMAT, f"{AUDIO_FMT}.type"),
    ('{"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcmu", "rate": 16000}}}}}',
     ErrorCode.UNSUPPORTED_AUDIO_FORMAT, f"{AUDIO_FMT}.rate"),
    ('{"type": "response.create", "response": {"conversation": "other"}}', ErrorCode.INVALID_VALUE,
     "response.conversation"),
    ('{"type": "response.create", "response": {"input": [{"type": "item_reference"}]}}', ErrorCode.INVALID_VALUE,
     "response.input[0].id"),
    ('{"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 44100}}}}}',
     ErrorCode.UNSUPPORTED_AUDIO_FORMAT, f"{AUDIO_FMT}.rate"),
    ('{"type": "session.update", "session": {"audio": {"input": {"format": {"rate": "fast"}}}}}',
     ErrorCode.INVALID_VALUE, f"{AUDIO_FMT}.rate"),
    ('{"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"silence_duration_ms": -5}}}}}',
     ErrorCode.INVALID_VALUE, "session.audio.input.turn_detection.silence_duration_ms"),
    ('{"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"threshold": 1.5}}}}}',
     ErrorCode.INVALID_VALUE, "session.audio.input.turn_detection.threshold"),
    ('{"type": "session.update", "session": {"audio": {"output": {"speed": 3}}}}',
     ErrorCode.INVALID_VALUE, "session.audio.output.speed"),
    ('{"type": "session.update", "session": {"audio": {"output": {"voice": null}}}}',
     ErrorCode.INVALID_VALUE, "session.audio.output.voice"),
    ('{"type": "session.update", "session": {"output_modalities": ["audio", "text"]}}',
     ErrorCode.INVALID_VALUE, "session.output_modalities"),
    ('{"type": "session.update", "session": {"x_binary_audio": "yes"}}', ErrorCode.INVALID_VALUE,
     "session.x_binary_audio"),
    ('{"type": "conversation.item.create"}', ErrorCode.MISSING_FIELD, "item"),
    ('{"type": "conversation.item.create", "item": {"type": "message", "role": "user"}}',
     ErrorCode.INVALID_VALUE, "item.content"),
    ('{"type": "conversation.item.create", "item": {"type": "message", "role": "robot", "content": []}}',
     ErrorCode.INVALID_VALUE, "item.role"),
    ('{"type": "conversation.item.create", "item": {"type": "mcp_call", "role": "user"}}',
     ErrorCode.INVALID_VALUE, "item.type"),
    ('{"type": "conversation.item.create", "item": {"type": {"type": null}, "role": "user"}}',
     ErrorCode.INVALID_VALUE, "item.type"),
    ('{"type": "conversation.item.create", "item": {"type": "function_call_output", "output": "{}"}}',
     ErrorCode.MISSING_FIELD, "item.call_id"),
    ('{"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "c", "output": "'
     + "a" * 101 + '"}}', ErrorCode.TEXT_TOO_LONG, "item.output"),
    ('{"type": "session.update", "session": {"tools": [{"type": "function", "name": "f", "parameters": '
     '{"type": "object", "properties": {"a": {"type": "strin"}}}}]}}', ErrorCode.INVALID_VALUE,
     "session.tools[0].parameters.properties.a.type"),
    ('{"type": "session.update", "session": {"tools": [{"type": "function", "name": "f", "parameters": '
     '{"type": "array"}}]}}', ErrorCode.INVALID_VALUE, "session.tools[0].parameters.type"),
    ('{"type": "session.update", "session": {"tools": [{"type": "mcp", "name": "f"}]}}', ErrorCode.INVALID_VALUE,
     "session.tools[0].type"),
    ('{"type": "session.update", "session": {"tools": [{"type": "function", "name": "get time"}]}}',
     ErrorCode.INVALID_VALUE, "session.tools[0].name"),
    ('{"type": "session.update", "session": {"tools": [{"type": "function", "name": "f"}, '
     '{"type": "function", "name": "f"}]}}', ErrorCode.INVALID_VALUE, "session.tools[1].name"),
    ('{"type": "session.update", "session": {"tool_choice": {"type": "function", "name": "f"}}}',
     ErrorCode.INVALID_VALUE, "session.tool_choice.name"),
    ('{"type": "session.update", "session": {"tool_choice": "sometimes"}}', ErrorCode.INVALID_VALUE,
     "session.tool_choice"),
    ('{"type": "response.create", "response": {"tools": [], "tool_choice": "required"}}', ErrorCode.INVALID_VALUE,
     "response.tool_choice"),
    ('{"type": "conversation.item.create", "item": {"type": "message", "role": "user", '
     '"content": [{"type": "input_audio", "audio": "AAAA"}]}}', ErrorCode.INVALID_VALUE, "item.content[0].type"),
    ('{"type": "conversation.item.create", "item": {"type": "message", "role": "user", '
     '"content": [{"type": "input_text"}]}}', ErrorCode.INVALID_VALUE, "item.content[0].text"),
    ('{"type": "conversation.item.create", "item": {"type": "message", "role": "user", '
     '"content": [{"type": "input_text", "text": "' + "a" * 101 + '"}]}}', ErrorCode.TEXT_TOO_LONG,
     "item.content[0].text"),
    ('{"type": "conversation.item.truncate", "item_id": "i", "content_index": 0}', ErrorCode.MISSING_FIELD,
     "audio_end_ms"),
    ('{"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": -1}',
     ErrorCode.INVALID_VALUE, "audio_end_ms"),
    ('{"type": "conversation.item.truncate", "item_id": "i", "content_index": true, "audio_end_ms": 1}',
     ErrorCode.INVALID_VALUE, "content_index"),
    ('{"type": "response.create", "response": {"output_modalities": ["video"]}}', ErrorCode.INVALID_VALUE,
     "response.output_modalities[0]"),
    ('{"type": "response.cancel", "response_id": 3}', ErrorCode.INVALID_VALUE, "response_id"),
    ('{"type": "x.tts.speak", "request_id": "t", "text": "   "}', ErrorCode.INVALID_VALUE, "text"),
    ('{"type": "x.tts.speak", "text": "hi"}', ErrorCode.MISSING_FIELD, "request_id"),
    ('{"type": "x.tts.speak", "request_id": "t", "text": "hi", "length_scale": 0}', ErrorCode.INVALID_VALUE,
     "length_scale"),
    ('{"type": "x.tts.speak", "request_id": "t", "text": "' + "b" * 101 + '"}', ErrorCode.TEXT_TOO_LONG, "text"),
    ('{"type": "x.playback", "item_id": "i"}', ErrorCode.MISSING_FIELD, "audio_end_ms"),
]


@pytest.mark.parametrize(("text", "code", "param"), BAD_MESSAGES)
def test_invalid_messages_give_error_events(text, code, param):
    proto = RealtimeProtocol(max_text_chars=100)
    before = proto.session
    [out] = proto.receive_text(text)
    assert isinstance(out, ErrorEvent), out
    assert (out.error.code, out.error.param, out.error.type) == (code, param, "invalid_request_error")
    assert out.error.message
    assert proto.session == before  # a rejected update changes nothing
    assert DOCUMENTED_CODES[code] == "invalid_request_error"  # listed in docs/protocol.md with this type


def test_error_echoes_client_event_id():
    [out] = RealtimeProtocol().receive_text('{"type": "input_audio_buffer.append", "audio": "!", "event_id": "c42"}')
    assert out.error.event_id == "c42"
    assert json.loads(serialize(out))["error"]["event_id"] == "c42"


def test_message_size_limit_counts_utf8_bytes():
    proto = RealtimeProtocol(max_message_bytes=64)
    ok = '{"type": "input_audio_buffer.commit", "event_id": "' + "é" * 5 + '"}'
    assert not isinstance(proto.receive_text(ok)[0], ErrorEvent)
    big = '{"type": "input_audio_buffer.commit", "event_id": "' + "é" * 8 + '"}'  # 61 chars, 69 bytes
    assert len(big) <= 64
    [out] = proto.receive_text(big)
    assert out.error.code == ErrorCode.MESSAGE_TOO_LARGE


def test_parse_client_event_raises_protocol_error():
    with pytest.raises(ProtocolError) as info:
        parse_client_event({"type": "conversation.item.truncate", "item_id": "i", "event_id": "c5"})
    assert (info.value.code, info.value.param, info.value.event_id) == ("missing_field", "content_index", "c5")


# --------------------------------------------------------------------------- session.update
def _update(proto: RealtimeProtocol, session: dict) -> SessionUpdate:
    [out] = proto.receive_text(json.dumps({"type": "session.update", "session": session}))
    assert isinstance(out, SessionUpdate), out
    return out


def test_session_update_merges_and_push_to_talk_round_trip(cfg):
    initial = default_session(cfg)
    proto = RealtimeProtocol(session=initial)
    _update(proto, {"type": "realtime", "audio": {"input": {"turn_detection": {"silence_duration_ms": 900}}}})
    td = proto.session.audio.input.turn_detection
    assert td.silence_duration_ms == 900 and td.prefix_padding_ms == cfg.vad.prefix_padding_ms
    _update(proto, {"audio": {"input": {"turn_detection": None}}})
    assert proto.session.audio.input.turn_detection is None
    assert proto.session.to_dict()["audio"]["input"]["turn_detection"] is None  # null is sent, not omitted
    _update(proto, {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 0.9}}}})
    td = proto.session.audio.input.turn_detection
    assert td.x_aggressiveness == 3 and td.silence_duration_ms == initial.audio.input.turn_detection.silence_duration_ms
    _update(proto, {"audio": {"input": {"turn_detection": {"x_aggressiveness": 0}}}})
    assert proto.session.audio.input.turn_detection.x_aggressiveness == 0
    assert proto.session.audio.input.turn_detection.threshold is None


def test_session_set_before_updates_is_the_base_for_reenabled_settings(cfg):
    proto = RealtimeProtocol()  # as the hub builds it; the session then sets its own start
    tuned = default_session(cfg.replace("vad", silence_duration_ms=1234), "sess_x")
    proto.session = tuned
    _update(proto, {"audio": {"input": {"turn_detection": None, "transcription": None}}})
    _update(proto, {"audio": {"input": {"turn_detection": {"type": "server_vad"}, "transcription": {}}}})
    assert proto.session.audio.input.turn_detection.silence_duration_ms == 1234
    assert proto.session.audio.input.transcription.language == cfg.asr.language
    proto.session = SessionConfig()  # a later replacement (veto) keeps the base
    _update(proto, {"audio": {"input": {"turn_detection": None}}})
    _update(proto, {"audio": {"input": {"turn_detection": {"prefix_padding_ms": 10}}}})
    assert proto.session.audio.input.turn_detection.silence_duration_ms == 1234


@pytest.mark.parametrize(("threshold", "aggressiveness"), [(0.0, 0), (0.3, 1), (0.5, 2), (0.74, 2), (1.0, 3)])
def test_threshold_maps_to_webrtcvad_aggressiveness(threshold, aggressiveness):
    proto = RealtimeProtocol()
    _update(proto, {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": threshold}}}})
    assert proto.session.audio.input.turn_detection.x_aggressiveness == aggressiveness


def test_semantic_vad_keeps_its_type_and_eagerness():
    proto = RealtimeProtocol()
    _update(proto, {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}})
    td = proto.session.audio.input.turn_detection
    assert (td.type, td.eagerness, td.silence_duration_ms) == ("semantic_vad", "high", 500)
    assert td.to_dict()["eagerness"] == "high"
    bad = {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}}}
    [out] = proto.receive_text(json.dumps({"type": "session.update", "session": bad}))
    assert isinstance(out, ev.ErrorEvent) and out.error.param == "session.audio.input.turn_detection.eagerness"


def test_unknown_session_keys_are_ignored_and_reported():
    proto = RealtimeProtocol()
    event = _update(proto, {"type": "realtime", "model": "gpt-realtime", "tracing": "auto",
                            "audio": {"input": {"noise_reduction": {"type": "far_field"}}},
                            "instructions": "Hi"})
    assert set(event.ignored) == {"session.model", "session.tracing", "session.audio.input.noise_reduction"}
    assert proto.session.instructions == "Hi" and proto.session.model == "voxloop"


def test_input_rate_change_applies_to_following_appends():
    proto = RealtimeProtocol()
    first = proto.receive_text(serialize(InputAudioBufferAppend(pcm=PCM)))[0]
    _update(proto, {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}})
    second = proto.receive_text(serialize(InputAudioBufferAppend(pcm=PCM)))[0]
    assert (first.sample_rate, second.sample_rate, proto.input_rate) == (24000, 16000, 16000)


# --------------------------------------------------------------------------- binary fast path
def test_binary_frames_need_negotiation():
    proto = RealtimeProtocol()
    [out] = proto.receive_bytes(PCM.tobytes())
    assert out.error.code == ErrorCode.BINARY_NOT_NEGOTIATED
    delta = parse_server_event(SERVER_SAMPLES["response.output_audio.delta"])
    assert proto.send(delta) == serialize(delta)  # base64 JSON while off


def test_binary_input_is_an_audio_append():
    proto = RealtimeProtocol(max_message_bytes=200)
    _update(proto, {"x_binary_audio": True, "audio": {"input": {"format": {"rate": 16000}}}})
    assert proto.binary_audio
    [out] = proto.receive_bytes(PCM.astype("<i2").tobytes())
    assert isinstance(out, InputAudioBufferAppend) and out.sample_rate == 16000
    np.testing.assert_array_equal(out.pcm, PCM)
    assert proto.receive_bytes(b"\x01\x02\x03")[0].error.code == ErrorCode.INVALID_AUDIO_LENGTH
    assert proto.receive_bytes(bytes(202))[0].error.code == ErrorCode.MESSAGE_TOO_LARGE
    # base64 appends keep working on the fast path
    assert isinstance(proto.receive_text(serialize(InputAudioBufferAppend(pcm=PCM)))[0], InputAudioBufferAppend)


@pytest.mark.parametrize("fmt", ["audio/pcmu", "audio/pcma"])
def test_g711_audio_in_and_out_json_and_binary(fmt):
    """G.711 sessions: appends (base64 and binary) carry one byte a sample at 8 kHz, decoded to int16;
    audio deltas go out as G.711 bytes; the codec agrees with the standard library's audioop."""
    from realtime.audio_formats import bytes_to_pcm, pcm_to_bytes

    tone = (9000 * np.sin(np.arange(800) / 3)).astype(np.int16)
    wire = pcm_to_bytes(tone, fmt)
    assert len(wire) == 800
    decoded = bytes_to_pcm(wire, fmt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")  # the standard library's (to 3.12): the ITU tables
    encode, decode = {"audio/pcmu": (audioop.lin2ulaw, audioop.ulaw2lin),
                      "audio/pcma": (audioop.lin2alaw, audioop.alaw2lin)}[fmt]
    np.testing.assert_array_equal(decoded, np.frombuffer(decode(wire, 2), "<i2"))  # the same decoding table
    # Encoding: a sample at a level boundary may take the neighbouring code (<1 % of them), never a worse one.
    ours = np.abs(decoded.astype(int) - tone)
    theirs = np.abs(np.frombuffer(decode(encode(tone.astype("<i2").tobytes(), 2), 2), "<i2").astype(int) - tone)
    assert np.mean(np.frombuffer(wire, np.uint8) != np.frombuffer(encode(tone.astype("<i2").tobytes(), 2), np.uint8)) < 0.01
    assert ours.max() <= theirs.max()
    assert np.abs(decoded.astype(int) - tone).max() <= 9000 // 16  # 8-bit companding: within 1/16 of the peak
    proto = RealtimeProtocol()
    _update(proto, {"x_binary_audio": True, "audio": {"input": {"format": {"type": fmt}},
                                                      "output": {"format": {"type": fmt}}}})
    assert proto.input_rate == 8000 and proto.session.audio.output.format.rate == 8000
    [binary] = proto.receive_bytes(wire[:101])  # odd lengths are whole samples here
    [text] = proto.receive_text(json.dumps({"type": "input_audio_buffer.append",
                                            "audio": base64.b64encode(wire).decode()}))
    assert binary.sample_rate == text.sample_rate == 8000
    np.testing.assert_array_equal(text.pcm, decoded)
    np.testing.assert_array_equal(binary.pcm, decoded[:101])
    delta = ResponseOutputAudioDelta(response_id="resp_1", item_id="item_1", pcm=decoded)
    frame = proto.send(delta)
    np.testing.assert_array_equal(decode_audio_frame(frame, fmt).pcm, decoded)
    _update(proto, {"x_binary_audio": False})
    sent = json.loads(proto.send(delta))
    assert base64.b64decode(sent["delta"]) == pcm_to_bytes(decoded, fmt)
    _update(proto, {"audio": {"input": {"format": {"type": "audio/pcm"}}}})  # back to PCM: its default rate
    assert proto.input_rate == 24000


@pytest.mark.parametrize("kind", ["response.output_audio.delta", "x.tts.audio.delta"])
def test_binary_output_frames_round_trip(kind):
    proto = RealtimeProtocol()
    _update(proto, {"x_binary_audio": True})
    event = parse_server_event(SERVER_SAMPLES[kind])
    frame = proto.send(event)
    assert isinstance(frame, bytes)
    (n,) = np.frombuffer(frame[:2], dtype="<u2")
    assert (2 + n) % 2 == 0  # audio starts at an even offset (Int16Array-friendly)
    header = json.loads(frame[2:2 + n])
    assert header == {k: v for k, v in SERVER_SAMPLES[kind].items() if k != "delta"}
    assert frame[2 + n:] == PCM.astype("<i2").tobytes()
    assert decode_audio_frame(frame) == event
    assert parse_server_frame(frame) == event
    # other events stay JSON text
    assert isinstance(proto.send(ev.InputAudioBufferCleared()), str)


def test_binary_frame_header_parity():
    # one-char id difference flips header length parity; both must stay aligned
    for rid in ("r", "rr"):
        frame = encode_audio_frame(XTtsAudioDelta(request_id=rid, pcm=PCM, event_id="e"))
        assert (2 + int.from_bytes(frame[:2], "little")) % 2 == 0
        assert decode_audio_frame(frame).request_id == rid


def test_bad_binary_frames_from_server_raise():
    with pytest.raises(ProtocolError):
        decode_audio_frame(b"\x01")
    with pytest.raises(ProtocolError):
        decode_audio_frame(b"\x04\x00nope")
    with pytest.raises(ProtocolError):
        decode_audio_frame(b"\x10\x00" + b'{"type":"error"}' + b"\x00\x00")


# --------------------------------------------------------------------------- openai SDK compatibility
openai = pytest.importorskip("openai")


def _sdk_server_adapter():
    from openai.types.realtime import RealtimeServerEvent
    from pydantic import TypeAdapter

    return TypeAdapter(RealtimeServerEvent)


#: Server events the GA SDK has no model of: the beta API's answer to its ``transcription_session.update``
#: (its beta session requires an OpenAI ``client_secret``; voxloop sends the GA session object).
NOT_GA = {"transcription_session.updated"}


@pytest.mark.parametrize("kind", sorted(k for k in SERVER_SAMPLES if not k.startswith("x.") and k not in NOT_GA))
def test_server_events_validate_as_sdk_models(kind):
    wire = json.loads(serialize(parse_server_event(SERVER_SAMPLES[kind])))
    if kind.startswith("session."):  # the SDK types PCM rate as Literal[24000]; ours defaults to it
        wire["session"]["audio"]["input"]["format"]["rate"] = 24000
    model = _sdk_server_adapter().validate_python(wire)
    assert model.type == kind


def test_default_session_validates_strictly_as_sdk_session(cfg):
    wire = json.loads(serialize(ev.SessionCreated(session=default_session(cfg))))
    assert _sdk_server_adapter().validate_python(wire).session.audio.output.format.rate == 24000


class _FakeSocket:
    """Stands in for the SDK's websocket: records sent text, replays queued frames."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.inbox: list[bytes] = []

    def send(self, data: str | bytes) -> None:
        self.sent.append(data if isinstance(data, str) else data.decode())

    def recv(self, decode: bool = False) -> bytes:
        return self.inbox.pop(0)

    def close(self, code: int = 1000, reason: str = "") -> None:
        pass


def test_sdk_client_events_parse_and_server_events_reach_sdk_types():
    from openai.resources.realtime.realtime import RealtimeConnection

    sock = _FakeSocket()
    conn = RealtimeConnection(sock)  # type: ignore[arg-type]
    conn.session.update(session={
        "type": "realtime", "instructions": "Be brief.", "output_modalities": ["audio"], "tracing": "auto",
        "tools": [{"type": "function", "name": "f", "parameters": {}}], "tool_choice": "auto",
        "include": ["item.input_audio_transcription.logprobs"], "max_output_tokens": "inf",
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "noise_reduction": None,
                            "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                            "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                                               "silence_duration_ms": 500, "create_response": True,
                                               "interrupt_response": True, "idle_timeout_ms": 6000}},
                  "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin", "speed": 1.0}}})
    conn.input_audio_buffer.append(audio=PCM_B64)
    conn.input_audio_buffer.commit()
    conn.input_audio_buffer.clear()
    conn.conversation.item.create(item={"type": "message", "role": "user",
                                        "content": [{"type": "input_text", "text": "hello"}]})
    conn.response.create()
    conn.response.create(response={"instructions": "x", "output_modalities": ["text"], "conversation": "none"})
    conn.response.cancel()
    conn.conversation.item.truncate(item_id="item_2", content_index=0, audio_end_ms=1500)
    proto = RealtimeProtocol()
    parsed = [out for text in sock.sent for out in proto.receive_text(text)]
    assert not [e for e in parsed if isinstance(e, ErrorEvent)], parsed
    assert [e.type for e in parsed] == [json.loads(t)["type"] for t in sock.sent]
    assert proto.session.audio.input.turn_detection.idle_timeout_ms == 6000

    # server -> SDK: every event (extensions too) must go through the SDK's parser without error
    sock.inbox = [proto.send(parse_server_event(w)).encode() for w in SERVER_SAMPLES.values()]
    received = [conn.recv() for _ in SERVER_SAMPLES]
    for wire, got in zip(SERVER_SAMPLES.values(), received):
        got_type = got.get("type") if isinstance(got, dict) else got.type
        assert got_type == wire["type"]
    delta = received[list(SERVER_SAMPLES).index("response.output_audio.delta")]
    assert type(delta).__name__ == "ResponseAudioDeltaEvent" and base64.b64decode(delta.delta) == PCM.tobytes()


def test_protocol_config_defaults_match_limits(cfg):
    proto = RealtimeProtocol.from_limits(cfg.limits, session=default_session(cfg))
    assert proto.max_message_bytes == cfg.limits.max_message_bytes
    assert proto.session.audio.input.turn_detection.x_aggressiveness == cfg.vad.aggressiveness
    assert isinstance(proto.session, SessionConfig)


# --------------------------------------------------------------------------- docs stay in sync
ROOT = Path(__file__).resolve().parent.parent
PROTOCOL_DOC = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
#: code -> type, from the error table of docs/protocol.md.
DOCUMENTED_CODES = dict(re.findall(r"^\| `([a-z0-9_]+)` \| (invalid_request_error|server_error) \|", PROTOCOL_DOC, re.M))
#: Packages whose errors can reach a client (the server side; not the client or CLI).
SERVER_PACKAGES = ("realtime", "pipeline", "asr", "llm", "tts_engine")
#: Codes the server code can produce that never reach a client, and why.
NEVER_SENT = {
    "invalid_config": "ConfigError stops the server at start-up; what a client can set is validated first",
    "cancelled": "Cancelled only settles futures of interrupted turns, whose tasks are cancelled first",
}


def _error_codes_in_server_code() -> set[str]:
    """Every error code the server's code can produce: ``ErrorCode`` constants it uses,
    ``code=`` string literals, and the default code of each ``VoxloopError`` it raises."""
    import ast

    from base import errors

    classes = {name: cls for name, cls in vars(errors).items()
               if isinstance(cls, type) and issubclass(cls, errors.VoxloopError)}
    codes: set[str] = set()
    for package in SERVER_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                        and node.value.id == "ErrorCode" and node.attr.isupper()):
                    codes.add(getattr(ErrorCode, node.attr))
                elif isinstance(node, ast.keyword) and node.arg == "code" and isinstance(node.value, ast.Constant):
                    codes.add(node.value.value)
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in classes
                      and node.func.id != "ProtocolError" and not any(k.arg == "code" for k in node.keywords)):
                    codes.add(classes[node.func.id].code)
    return codes


def test_docs_list_every_event_and_error_code():
    reachable = _error_codes_in_server_code() - set(NEVER_SENT)
    assert {"internal_error", "model_error", "server_overloaded", "request_not_found"} <= reachable  # the scan works
    assert sorted(reachable - set(DOCUMENTED_CODES)) == []  # sent but not documented
    assert sorted(set(DOCUMENTED_CODES) - reachable) == []  # documented but never sent
    assert sorted({v for k, v in vars(ErrorCode).items() if k.isupper()} - set(DOCUMENTED_CODES)) == []
    assert documented_events("Client → server") == set(CLIENT_EVENTS)
    assert documented_events("Server → client") == set(SERVER_EVENTS)


def documented_events(section: str) -> set[str]:
    """The event types in the first column of the table under ``## {section}`` of docs/protocol.md."""
    text = PROTOCOL_DOC.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([^|]+) \|", text, re.M)
    return {t for row in rows for t in re.findall(r"`([a-z_.]+)`", row)}


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4800, 4801])
def test_audio_base64_is_the_standard_alphabet_with_padding(n):
    """The server's base64 (pybase64) writes the same text as the standard library and reads it back,
    for any length (padding 0, 1 or 2 characters), strided and big-endian arrays included."""
    from realtime.wire import decode_pcm16, encode_pcm16

    pcm = np.random.default_rng(n).integers(-32768, 32767, 2 * n, dtype=np.int16)
    for view in (pcm[:n], pcm[::2], pcm[:n].astype(">i2")):
        text = encode_pcm16(view)
        assert text == base64.b64encode(np.asarray(view, dtype="<i2").tobytes()).decode("ascii")
        np.testing.assert_array_equal(decode_pcm16(text), np.asarray(view, dtype=np.int16))

