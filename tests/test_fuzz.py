"""Hostile frames, seeded: the protocol core alone, then 10 000 against a live session.

Frames come from :class:`HostileFrames` (malformed and non-object JSON, wrong types,
missing and extra fields, deep nesting, huge and negative numbers, bad and huge base64,
odd-length PCM, unknown types, binary frames before and after negotiation, oversize
messages) interleaved with valid silence and session updates.

The live test knows what every frame must get: a second ``RealtimeProtocol`` fed the same
frames says which the protocol core rejects (with which code), and a small table says what
the session answers to the events it accepts (docs/protocol.md). Frames that would start a
turn (and non-silent audio, which the VAD may call speech) are left out of the hostile stream
(their answer depends on timing), so the expected
answers are exact: the same error codes in the same order, one ``session.updated`` per
accepted update, no traceback in the log. Meanwhile a victim session holds a conversation
(text turns, ``x.tts.speak``), and the hostile session still answers a turn at the end.
ASR and LLM are fakes (orchestration is under test); the TTS is the real CPU engine.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
import time

import pytest
import websockets

from client_fakes import real_tts_engines, start_hub, ws_url
from conftest import scaled
from realtime import events as ev
from realtime.protocol import RealtimeProtocol
from realtime.wire import ErrorCode
from rt import recv, until, user_text
from base.config import LimitsConfig

SEED = 17
LIVE_FRAMES = 10_000
CORE_FRAMES = 60_000
MAX_MESSAGE_BYTES = 65_536  # the live server's limits.max_message_bytes: oversize frames stay cheap
_CODES = {v for k, v in vars(ErrorCode).items() if k.isupper()}

TEMPLATES: list[dict] = [
    {"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief.",
                                           "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000},
                                                               "turn_detection": {"type": "server_vad",
                                                                                  "silence_duration_ms": 500}}},
                                           "output_modalities": ["audio"], "x_binary_audio": False}},
    {"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(640)).decode()},
    {"type": "input_audio_buffer.commit"},
    {"type": "input_audio_buffer.clear"},
    {"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "hi"}]}},
    {"type": "conversation.item.truncate", "item_id": "item_123", "content_index": 0, "audio_end_ms": 1500},
    {"type": "response.create", "response": {"instructions": "x", "output_modalities": ["text"],
                                             "conversation": "none", "max_output_tokens": 20}},
    {"type": "response.cancel", "response_id": "resp_1"},
    {"type": "x.playback", "item_id": "item_1", "audio_end_ms": 250, "finished": False},
    {"type": "x.tts.speak", "request_id": "r1", "text": "Hello.", "length_scale": 1.0, "speaker_id": 0},
    {"type": "x.tts.cancel", "request_id": "r1"},
]
UNKNOWN_TYPES = ["no.such.event", "", "session.created", "response.done", "error", "x.", "SESSION.UPDATE",
                 "input_audio_buffer.append ", "conversation.item.delete", "transcription_session.update"]
WEIRD_VALUES = [None, True, False, 0, -1, 1.5, -1e308, 1e308, 2**53, -(2**63), 10**30, "", "x" * 300,
                "\u0000\u202e\U0001f600", [], [1, [2, [3]]], {}, {"type": None}, {"a": {"b": {"c": {}}}}]


class HostileFrames:
    """A seeded stream of hostile (and some valid) frames: ``str`` for text, ``bytes`` for binary."""

    def __init__(self, seed: int, max_message_bytes: int) -> None:
        self.rng = random.Random(seed)
        self.max_bytes = max_message_bytes
        kinds = [(self.malformed_json, 8), (self.not_an_object, 3), (self.wrong_type, 14),
                 (self.missing_field, 6), (self.extra_field, 5), (self.deep_nesting, 3),
                 (self.huge_number, 5), (self.bad_base64, 6), (self.odd_audio, 5), (self.unknown_type, 5),
                 (self.binary, 8), (self.oversize, 1), (self.valid_audio, 14), (self.valid_update, 4),
                 (self.valid_no_answer, 6), (self.template, 7)]
        self.kinds = [k for k, _ in kinds]
        self.weights = [w for _, w in kinds]

    def __next__(self) -> str | bytes:
        return self.rng.choices(self.kinds, self.weights)[0]()

    def __iter__(self):
        return self

    # ------------------------------------------------------------------ helpers
    def _event(self) -> dict:
        return json.loads(json.dumps(self.rng.choice(TEMPLATES)))

    def _paths(self, obj, prefix=()) -> list[tuple]:
        out = []
        if isinstance(obj, dict):
            for k, v in obj.items():
                out.append((*prefix, k))
                out += self._paths(v, (*prefix, k))
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                out.append((*prefix, i))
                out += self._paths(v, (*prefix, i))
        return out

    def _set(self, obj, path: tuple, value, delete: bool = False) -> None:
        for key in path[:-1]:
            obj = obj[key]
        if delete:
            del obj[path[-1]]
        else:
            obj[path[-1]] = value

    def _pcm(self, samples: int) -> bytes:
        return bytes(2 * samples)  # silence: never speech, so the VAD stays quiet

    # ------------------------------------------------------------------ kinds
    def malformed_json(self) -> str:
        text = json.dumps(self._event())
        choice = self.rng.randrange(5)
        if choice == 0:
            return text[: self.rng.randrange(len(text))]
        if choice == 1:
            i = self.rng.randrange(len(text))
            return text[:i] + self.rng.choice("{}[]\",:\\'") + text[i + 1:]
        if choice == 2:
            return self.rng.choice(["", " ", "{", "}", "{{}", "[1,2", "nul", "NaN", "Infinity", "-Infinity",
                                    '{"type": NaN}', '{"type": Infinity}', "{'type': 'x'}", "\ufeff{}",
                                    '{"type":"x",}', '{"a":1 "b":2}', "\u2028", '"\\ud800"x'])
        if choice == 3:
            return "".join(chr(self.rng.randrange(32, 0xD7FF)) for _ in range(self.rng.randrange(1, 60)))
        return text + self.rng.choice(["x", "}", " 1", "{}", "\x00"])

    def not_an_object(self) -> str:
        return json.dumps(self.rng.choice([None, 1, -5.5, "session.update", [], [{"type": "session.update"}],
                                           True, "x" * 1000, [[[]]]]))

    def wrong_type(self) -> str:
        event = self._event()
        path = self.rng.choice(self._paths(event))
        self._set(event, path, self.rng.choice(WEIRD_VALUES))
        return json.dumps(event)

    def missing_field(self) -> str:
        event = self._event()
        path = self.rng.choice(self._paths(event))
        self._set(event, path, None, delete=True)
        return json.dumps(event)

    def extra_field(self) -> str:
        event = self._event()
        targets = [()] + [p for p in self._paths(event) if isinstance(self._get(event, p), dict)]
        target = self._get(event, self.rng.choice(targets))
        target[self.rng.choice(["extra", "event_id", "__proto__", "type2", "audio", "x" * 100])] = \
            self.rng.choice(WEIRD_VALUES)
        return json.dumps(event)

    def _get(self, obj, path: tuple):
        for key in path:
            obj = obj[key]
        return obj

    def deep_nesting(self) -> str:
        depth = self.rng.choice([50, 500, 999, 1001, 5000, 20_000])
        open_, close = self.rng.choice([("[", "]"), ('{"a":', "}")])
        inner = open_ * depth + "1" + close * depth
        return self.rng.choice([inner, '{"type":"session.update","session":' + inner + "}",
                                '{"type":"x.tts.speak","request_id":"d","text":' + inner + "}"])

    def huge_number(self) -> str:
        event = json.loads(json.dumps(self.rng.choice(TEMPLATES[5:10])))
        key = self.rng.choice([k for k, v in event.items() if k != "type" and not isinstance(v, str)] or ["x"])
        event[key] = "@@NUMBER@@"
        number = self.rng.choice(["1e400", "-1e400", "1" * 5000, "-" + "9" * 40, "123456789012345678901234567890",
                                  "0.0000000000001", "-0", "1E+2", "9007199254740993", "-1", "2.5", "1e-400"])
        return json.dumps(event).replace('"@@NUMBER@@"', number)

    def bad_base64(self) -> str:
        audio = self.rng.choice([
            "!!!", "AAA", "A", "====", "AA==AA==", "\u00e9\u00e9", " " * 8, "data:audio/pcm;base64,AAAA",
            base64.b64encode(self._pcm(self.rng.randrange(1, 800))).decode()[:-1],
            base64.urlsafe_b64encode(bytes([251, 255] * 300)).decode(),
            "A" * (self.max_bytes // 2 + 1),  # decodes past the limit in base64 chars
        ])
        return json.dumps({"type": "input_audio_buffer.append", "audio": audio})

    def odd_audio(self) -> str:
        raw = bytes(2 * self.rng.randrange(0, 400) + 1)
        return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(raw).decode()})

    def unknown_type(self) -> str:
        return json.dumps({"type": self.rng.choice(UNKNOWN_TYPES + WEIRD_VALUES[:6]), "event_id": "evt_u"})

    def binary(self) -> bytes:
        n = self.rng.choice([0, 1, 3, 2 * self.rng.randrange(1, 2000), 2 * self.rng.randrange(1, 2000) + 1])
        if self.rng.random() < 0.5:
            return self._pcm(n // 2) + (b"\x01" if n % 2 else b"")
        return self.rng.randbytes(n)

    def oversize(self) -> str | bytes:
        n = self.max_bytes + self.rng.randrange(1, self.max_bytes // 2)
        if self.rng.random() < 0.3:
            return bytes(n)
        return json.dumps({"type": "x.tts.speak", "request_id": "big", "text": "a" * n})

    def valid_audio(self) -> str:
        samples = self.rng.choice([160, 320, 480, 960])
        return json.dumps({"type": "input_audio_buffer.append",
                           "audio": base64.b64encode(self._pcm(samples)).decode()})

    def valid_update(self) -> str:
        session: dict = {"type": "realtime", "x_binary_audio": self.rng.random() < 0.5}
        if self.rng.random() < 0.5:
            td = None if self.rng.random() < 0.5 else {"type": "server_vad"}
            rate = self.rng.choice([16000, 24000])
            session["audio"] = {"input": {"turn_detection": td, "format": {"type": "audio/pcm", "rate": rate}}}
        return json.dumps({"type": "session.update", "session": session})

    def valid_no_answer(self) -> str:
        return json.dumps(self.rng.choice([TEMPLATES[3], TEMPLATES[5], TEMPLATES[7], TEMPLATES[8], TEMPLATES[10],
                                           {"type": "response.cancel"}]))

    def template(self) -> str:
        return json.dumps(self._event())


# --------------------------------------------------------------------------- protocol core alone
def test_protocol_core_answers_every_hostile_frame():
    """Every frame gives exactly one event, a client event or an error with a documented code;
    nothing raises, and every error serializes (the server sends it)."""
    protocol = RealtimeProtocol(max_message_bytes=MAX_MESSAGE_BYTES, max_text_chars=LimitsConfig().max_text_chars)
    frames = HostileFrames(SEED, MAX_MESSAGE_BYTES)
    rng = random.Random(SEED + 1)
    codes: dict[str, int] = {}
    t0 = time.monotonic()
    for i in range(CORE_FRAMES):
        frame = next(frames)
        if i % 3 == 0 and isinstance(frame, str) and frame:  # random byte-level damage too
            j = rng.randrange(len(frame))
            frame = frame[:j] + chr(rng.randrange(1, 0xD7FF)) + frame[j + 1:]
        out = protocol.receive_bytes(frame) if isinstance(frame, bytes) else protocol.receive_text(frame)
        assert len(out) == 1, frame[:200]
        event = out[0]
        if isinstance(event, ev.ErrorEvent):
            assert event.error.code in _CODES, (event.error.code, frame[:200])
            json.loads(protocol.send(event))
            codes[event.error.code] = codes.get(event.error.code, 0) + 1
        else:
            assert isinstance(event, ev.ClientEvent), event
    assert time.monotonic() - t0 < scaled(60)
    # The generator reaches the protocol's error paths (a regression would show as a missing code).
    for code in ("invalid_json", "unknown_event_type", "missing_field", "invalid_value", "invalid_base64",
                 "invalid_audio_length", "binary_not_negotiated", "message_too_large"):
        assert codes.get(code, 0) > 20, codes


# --------------------------------------------------------------------------- live server
#: What the session answers to each client event the protocol core accepts, on a session that
#: never starts a turn: an error code, or None (no error; ``session.updated``/``cleared`` or nothing).
SESSION_ERRORS: dict[type, str | None] = {
    ev.SessionUpdate: None,
    ev.InputAudioBufferAppend: None,
    ev.InputAudioBufferClear: None,
    ev.ConversationItemTruncate: ErrorCode.ITEM_NOT_FOUND,  # no item was ever created
    ev.ResponseCancel: ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE,
    ev.XTtsCancel: "request_not_found",
    ev.XPlayback: ErrorCode.ITEM_NOT_FOUND,  # no item was ever created
}
#: Events that start a turn or a request: left out of the hostile stream (timing-dependent answers).
STARTS_WORK = (ev.InputAudioBufferCommit, ev.ConversationItemCreate, ev.ResponseCreate, ev.XTtsSpeak)
BATCH = 200
PTT_CLEAR_SAMPLES = 16000 * 20  # clear the push-to-talk buffer well before its 30 s limit


class Expectation:
    """Frames in, the answers a correct server gives: error codes in order and counts of acks."""

    def __init__(self) -> None:
        self.mirror = RealtimeProtocol(max_message_bytes=MAX_MESSAGE_BYTES,
                                       max_text_chars=LimitsConfig().max_text_chars)
        self.errors: list[str] = []
        self.updated = self.cleared = 0
        self.ptt_samples = 0  # upper bound of what the push-to-talk buffer holds (16 kHz)

    def accept(self, frame: str | bytes) -> bool:
        """Record the answers ``frame`` must get; False for a frame that would start work (not sent)."""
        before = self.mirror.session
        out = self.mirror.receive_bytes(frame) if isinstance(frame, bytes) else self.mirror.receive_text(frame)
        event = out[0]
        if isinstance(event, STARTS_WORK) or (isinstance(event, ev.InputAudioBufferAppend) and event.pcm.any()):
            assert self.mirror.session is before  # noise could be speech: the VAD would start a turn
            return False
        if isinstance(event, ev.ErrorEvent):
            self.errors.append(event.error.code)
            return True
        code = SESSION_ERRORS[type(event)]
        if code is not None:
            self.errors.append(code)
        elif isinstance(event, ev.SessionUpdate):
            self.updated += 1
        elif isinstance(event, ev.InputAudioBufferClear):
            self.cleared += 1
            self.ptt_samples = 0
        elif isinstance(event, ev.InputAudioBufferAppend):
            self.ptt_samples += len(event.pcm) * 16000 // event.sample_rate + 16
        return True


async def victim(ws, stop: asyncio.Event) -> dict[str, int]:
    """A conversation that goes on beside the fuzz: text turns and x.tts.speak, each must complete."""
    done = {"turns": 0, "speak": 0}
    while not stop.is_set() or done["turns"] == 0 or done["speak"] == 0:
        for m in user_text(f"Question number {done['turns']}?"):
            await ws.send(m)
        reply, _ = await until(ws, "response.done", timeout=60)
        assert reply["response"]["status"] == "completed", reply
        done["turns"] += 1
        await ws.send(json.dumps({"type": "x.tts.speak", "request_id": f"v{done['speak']}", "text": "Still here."}))
        finished, seen = await until(ws, "x.tts.done", timeout=60)
        assert finished["status"] == "completed" and any(m["type"] == "x.tts.audio.delta" for m in seen)
        done["speak"] += 1
        assert not [m for m in seen if m["type"] == "error"]
    return done


async def read_until_sync(ws, sync_id: str, answers: dict) -> None:
    """Collect answers up to the error that echoes ``sync_id`` (frames are answered in order)."""
    while True:
        frame = await asyncio.wait_for(ws.recv(), scaled(30))
        if isinstance(frame, bytes):
            answers["binary"] += 1
            continue
        m = json.loads(frame)
        if m["type"] == "error":
            if m["error"].get("event_id") == sync_id:
                return
            answers["errors"].append(m["error"]["code"])
        elif m["type"] in ("session.updated", "input_audio_buffer.cleared"):
            answers[m["type"]] += 1
        else:
            answers["other"].append(m["type"])


@pytest.fixture(scope="module")
def tts_engines():
    return real_tts_engines()


@pytest.mark.timeout(scaled(120))
async def test_live_session_survives_10000_hostile_frames(tts_engines, caplog):
    hub = await start_hub(tts_engines, f"limits.max_message_bytes={MAX_MESSAGE_BYTES}")
    caplog.set_level(logging.WARNING)
    t0 = time.monotonic()
    try:
        async with websockets.connect(ws_url(hub)) as bad, websockets.connect(ws_url(hub)) as good:
            assert (await recv(bad))["type"] == "session.created"
            assert (await recv(good))["type"] == "session.created"
            stop = asyncio.Event()
            conversation = asyncio.create_task(victim(good, stop))
            frames, expect = HostileFrames(SEED, MAX_MESSAGE_BYTES), Expectation()
            answers = {"errors": [], "session.updated": 0, "input_audio_buffer.cleared": 0, "binary": 0,
                       "other": []}
            sent = 0
            while sent < LIVE_FRAMES:
                for _ in range(min(BATCH, LIVE_FRAMES - sent)):
                    frame = next(frames)
                    while not expect.accept(frame):
                        frame = next(frames)
                    await bad.send(frame)
                    sent += 1
                    if expect.ptt_samples > PTT_CLEAR_SAMPLES:
                        clear = json.dumps({"type": "input_audio_buffer.clear"})
                        expect.accept(clear)
                        await bad.send(clear)
                sync = f"sync_{sent}"
                await bad.send(json.dumps({"type": "x.tts.cancel", "request_id": sync, "event_id": sync}))
                await read_until_sync(bad, sync, answers)
                assert answers["errors"] == expect.errors, f"after {sent} frames"
            fuzz_s = time.monotonic() - t0
            stop.set()
            done = await asyncio.wait_for(conversation, scaled(60))
            assert answers["session.updated"] == expect.updated
            assert answers["input_audio_buffer.cleared"] == expect.cleared
            assert answers["other"] == [] and answers["binary"] == 0
            assert len(expect.errors) > LIVE_FRAMES // 2  # most frames are hostile
            # The hostile session itself still holds a conversation.
            await bad.send(json.dumps({"type": "session.update", "session": {
                "type": "realtime", "x_binary_audio": False, "output_modalities": ["text"]}}))
            await until(bad, "session.updated")
            for m in user_text("Are you still there?"):
                await bad.send(m)
            reply, _ = await until(bad, "response.done", timeout=60)
            assert reply["response"]["status"] == "completed"
    finally:
        await hub.stop()
    assert done["turns"] >= 1 and done["speak"] >= 1, done
    problems = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not problems, [r.getMessage() for r in problems[:5]]
    assert fuzz_s < scaled(60), f"{LIVE_FRAMES} frames took {fuzz_s:.1f} s"
