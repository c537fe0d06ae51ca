"""The hub and session over a real WebSocket on port 0.

ASR and LLM are tiny fakes here (this file tests orchestration: routes, admission,
turn flow, barge-in, bad input); the TTS is the real CPU engine. End-to-end runs with
every real model are in test_voice_e2e.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time

import numpy as np
import pytest
import websockets
from client_fakes import slow_link
from conftest import scaled
from rt import append, http_get, recv, speech_24k, until, url, user_text

from pipeline.engines import Engines
from pipeline.hub import Hub
from tts_engine.factory import create_engines
from base.config import load_config

pytestmark = pytest.mark.timeout(scaled(120))


class FakeTranscript:
    def __init__(self, text: str, language: str | None = "en") -> None:
        self.text = text
        self.language = language


class FakeASR:
    """Says what it was told; records the audio it got (16 kHz int16)."""

    def __init__(self, text: str = "what is the weather like") -> None:
        self.text = text
        self.calls: list[int] = []

    def transcribe(self, pcm, language=None):
        self.calls.append(len(pcm))
        time.sleep(0.05)
        return FakeTranscript(self.text)


class FakeLLM:
    """Streams a fixed reply, ``delay_s`` per token, honouring ``cancel``."""

    def __init__(self, reply: str = "It is sunny. Bring a hat, and drink some water today.", delay_s: float = 0.01):
        self.tokens = [t if i == 0 else " " + t for i, t in enumerate(reply.split(" "))]
        self.delay_s = delay_s
        self.seen: list[list[dict]] = []
        self.cancelled = threading.Event()

    def stream(self, messages, cancel=None, max_tokens=None):
        """Sets ``cancelled`` when stopped before the end (cancel flag or generator closed)."""
        self.seen.append(messages)
        finished = False
        try:
            for tok in self.tokens:
                if cancel is not None and cancel.is_set():
                    return
                time.sleep(self.delay_s)
                yield tok
            finished = True
        finally:
            if not finished:
                self.cancelled.set()


@pytest.fixture(scope="module")
def tts_engines():
    return create_engines(load_config(None, [], environ={}))


async def start_hub(tts_engines, *overrides, asr=None, llm=None):
    cfg = load_config(None, ["server.port=0", "trace.path=none", *overrides], environ={})
    engines = Engines.from_parts(cfg, asr or FakeASR(), llm or FakeLLM(), tts_engines)
    hub = Hub(cfg, engines)
    await hub.start()
    return hub


async def test_http_routes(tts_engines):
    hub = await start_hub(tts_engines)
    try:
        assert (await asyncio.to_thread(http_get, hub, "/health"))[0] == 200
        status, body, _ = await asyncio.to_thread(http_get, hub, "/ready")
        assert status == 200 and "16 session slots free" in body
        status, body, headers = await asyncio.to_thread(http_get, hub, "/metrics")
        assert status == 200 and "voxloop_sessions_active" in body
        assert headers["Content-Type"].startswith("text/plain")
        assert (await asyncio.to_thread(http_get, hub, "/nope.js"))[0] == 404
        assert (await asyncio.to_thread(http_get, hub, "/../pyproject.toml"))[0] == 404
        status, body, _ = await asyncio.to_thread(http_get, hub, "/v1/realtime")
        assert status == 426
    finally:
        await hub.stop()


async def test_full_server_gets_503_with_retry_after(tts_engines):
    hub = await start_hub(tts_engines, "limits.max_sessions=1", "limits.retry_after_s=7")
    try:
        async with websockets.connect(url(hub)) as ws:
            assert (await recv(ws))["type"] == "session.created"
            with pytest.raises(websockets.InvalidStatus) as info:
                async with websockets.connect(url(hub)):
                    pass
            assert info.value.response.status_code == 503
            assert info.value.response.headers["Retry-After"] == "7"
            status, body, _ = await asyncio.to_thread(http_get, hub, "/ready")
            assert status == 503 and "full" in body
        # The slot frees when the first client leaves.
        await asyncio.sleep(0.2)
        async with websockets.connect(url(hub)) as ws:
            assert (await recv(ws))["type"] == "session.created"
    finally:
        await hub.stop()


async def test_bearer_token_and_origin(tts_engines):
    hub = await start_hub(tts_engines, "server.auth_token=s3cret", "server.allowed_origins=http://ok.example")
    try:
        with pytest.raises(websockets.InvalidStatus) as info:
            async with websockets.connect(url(hub)):
                pass
        assert info.value.response.status_code == 401
        headers = {"Authorization": "Bearer s3cret"}
        with pytest.raises(websockets.InvalidStatus) as info:
            async with websockets.connect(url(hub), additional_headers=headers, origin="http://evil.example"):
                pass
        assert info.value.response.status_code == 403
        async with websockets.connect(url(hub, "/realtime?model=x"), additional_headers=headers,
                                      origin="http://ok.example") as ws:
            assert (await recv(ws))["type"] == "session.created"
        async with websockets.connect(url(hub, "/v1/realtime?token=s3cret")) as ws:  # browsers
            assert (await recv(ws))["type"] == "session.created"
        with pytest.raises(websockets.InvalidStatus):
            async with websockets.connect(url(hub, "/v1/realtime?token=wrong")):
                pass
    finally:
        await hub.stop()


async def test_text_turn_streams_audio_and_metrics(tts_engines):
    llm = FakeLLM()
    hub = await start_hub(tts_engines, llm=llm)
    try:
        async with websockets.connect(url(hub)) as ws:
            await recv(ws)
            for m in user_text("How is the weather?"):
                await ws.send(m)
            metrics, seen = await until(ws, "x.turn.metrics")
            types = [m["type"] for m in seen]
            assert types.index("response.created") < types.index("response.output_audio.delta")
            done = next(m for m in seen if m["type"] == "response.done")
            assert done["response"]["status"] == "completed"
            audio = b"".join(base64.b64decode(m["delta"]) for m in seen if m["type"] == "response.output_audio.delta")
            deltas = [m for m in seen if m["type"] == "response.output_audio.delta"]
            # 24 kHz int16 by default; deltas of at most 100 ms (4800 bytes).
            assert max(len(base64.b64decode(m["delta"])) for m in deltas) <= 4800
            assert len(audio) / 2 / 24000 > 1.5
            transcript = next(m for m in seen if m["type"] == "response.output_audio_transcript.done")["transcript"]
            assert transcript == "It is sunny. Bring a hat, and drink some water today."
            stages = metrics["metrics"]["stages_ms"]
            assert stages["llm_first_token"] <= stages["first_clause"] <= stages["first_audio_sent"]
            # History: the second turn's LLM input holds the first exchange.
            for m in user_text("And tomorrow?"):
                await ws.send(m)
            await until(ws, "response.done")
            roles = [m["role"] for m in llm.seen[-1]]
            assert roles == ["system", "user", "assistant", "user"]
            assert llm.seen[-1][2]["content"] == transcript
    finally:
        await hub.stop()


async def test_text_only_modality(tts_engines):
    hub = await start_hub(tts_engines)
    try:
        async with websockets.connect(url(hub)) as ws:
            await recv(ws)
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}}))
            assert (await until(ws, "session.updated"))[0]["session"]["output_modalities"] == ["text"]
            for m in user_text("hi"):
                await ws.send(m)
            _, seen = await until(ws, "response.done")
            types = {m["type"] for m in seen}
            assert "response.output_text.delta" in types and "response.output_audio.delta" not in types
    finally:
        await hub.stop()


async def test_push_to_talk_commit(tts_engines):
    asr = FakeASR("tell me a joke")
    hub = await start_hub(tts_engines, asr=asr)
    try:
        async with websockets.connect(url(hub)) as ws:
            await recv(ws)
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
                "input": {"turn_detection": None, "format": {"type": "audio/pcm", "rate": 16000}}}}}))
            await until(ws, "session.updated")
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            err, _ = await until(ws, "error")
            assert err["error"]["code"] == "input_audio_buffer_commit_empty"
            pcm = np.zeros(16000, np.int16)  # 1 s at 16 kHz: PTT does not need VAD-speech
            await ws.send(append(pcm))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            committed, _ = await until(ws, "input_audio_buffer.committed")
            done, _ = await until(ws, "conversation.item.input_audio_transcription.completed")
            assert done["transcript"] == "tell me a joke" and done["item_id"] == committed["item_id"]
            await until(ws, "response.done")
            assert asr.calls == [16000]
    finally:
        await hub.stop()


async def test_client_cancel_and_barge_in_by_voice(tts_engines):
    llm = FakeLLM(" ".join(["word"] * 200) + ".", delay_s=0.03)
    hub = await start_hub(tts_engines, "vad.barge_in_min_ms=150", llm=llm)
    try:
        async with websockets.connect(url(hub)) as ws:
            await recv(ws)
            # 1) response.cancel
            for m in user_text("talk a lot"):
                await ws.send(m)
            await until(ws, "response.output_audio.delta")
            await ws.send(json.dumps({"type": "response.cancel"}))
            done, seen = await until(ws, "response.done")
            assert done["response"]["status"] == "cancelled"
            assert done["response"]["status_details"]["reason"] == "client_cancelled"
            # At once, not after the reply (200 tokens, 6 s of LLM alone): the item ends short.
            spoken = done["response"]["output"][0]["content"][0]["transcript"]
            assert 0 < len(spoken.split()) < 200
            assert llm.cancelled.wait(scaled(2))
            await ws.send(json.dumps({"type": "response.cancel"}))
            err, _ = await until(ws, "error")
            assert err["error"]["code"] == "response_cancel_not_active"
            # 2) the user talks over the reply (server VAD): cancelled with turn_detected
            llm.cancelled.clear()
            for m in user_text("talk a lot again"):
                await ws.send(m)
            await until(ws, "response.output_audio.delta")
            speech = speech_24k(1.0)
            sent_at = None
            for i in range(0, len(speech), 480):
                await ws.send(append(speech[i:i + 480]))
                await asyncio.sleep(0.02)
                sent_at = sent_at or time.monotonic()
            done, seen = await until(ws, "response.done")
            assert done["response"]["status"] == "cancelled"
            assert done["response"]["status_details"]["reason"] == "turn_detected"
            assert "input_audio_buffer.speech_started" in [m["type"] for m in seen]
            # No more audio of the cancelled response after its response.done.
            ws_msgs = []
            try:
                while True:
                    ws_msgs.append(await recv(ws, 0.5))
            except TimeoutError:
                pass
            stale = [m for m in ws_msgs if m.get("response_id") == done["response"]["id"]
                     and m["type"] == "response.output_audio.delta"]
            assert stale == []
    finally:
        await hub.stop()


async def test_bad_input_gets_errors_and_session_survives(tts_engines):
    hub = await start_hub(tts_engines, "limits.max_message_bytes=65536")
    try:
        async with websockets.connect(url(hub)) as ws, websockets.connect(url(hub)) as other:
            await recv(ws)
            await recv(other)
            cases = [
                ("{not json", "invalid_json"),
                (json.dumps({"type": "no.such.event"}), "unknown_event_type"),
                (json.dumps({"type": "input_audio_buffer.append", "audio": "!!!"}), "invalid_base64"),
                (json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}),
                 "invalid_audio_length"),
                (json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
                    "format": {"type": "audio/pcm", "rate": 44100}}}}}), "unsupported_audio_format"),
                (json.dumps({"type": "conversation.item.truncate", "item_id": "item_x", "content_index": 0,
                             "audio_end_ms": 5}), "item_not_found"),
                (json.dumps({"type": "x.tts.cancel", "request_id": "nope"}), "request_not_found"),
            ]
            for raw, code in cases:
                await ws.send(raw)
                err, _ = await until(ws, "error")
                assert err["error"]["code"] == code, raw
            await ws.send(b"\x00\x01" * 10)
            err, _ = await until(ws, "error")
            assert err["error"]["code"] == "binary_not_negotiated"
            await ws.send("x" * 70000)  # over max_message_bytes but under the socket max
            err, _ = await until(ws, "error")
            assert err["error"]["code"] in ("message_too_large",)
            # Still usable, and the other session never saw any of it.
            for m in user_text("still there?"):
                await ws.send(m)
            assert (await until(ws, "response.done"))[0]["response"]["status"] == "completed"
            with pytest.raises(TimeoutError):
                await recv(other, 0.3)
            status, body, _ = await asyncio.to_thread(http_get, hub, "/metrics")
            assert 'voxloop_errors_total{code="invalid_json"} 1.0' in body
    finally:
        await hub.stop()


async def test_binary_fast_path(tts_engines):
    from realtime.protocol import parse_server_frame

    hub = await start_hub(tts_engines)
    try:
        async with websockets.connect(url(hub)) as ws:
            await recv(ws)
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "x_binary_audio": True}}))
            await until(ws, "session.updated")
            await ws.send(json.dumps({"type": "x.tts.speak", "request_id": "r1", "text": "Binary frames are faster."}))
            got = 0
            while True:
                frame = await asyncio.wait_for(ws.recv(), scaled(20))
                if isinstance(frame, bytes):
                    event = parse_server_frame(frame)
                    assert event.type == "x.tts.audio.delta" and event.request_id == "r1"
                    got += len(event.pcm)
                    continue
                m = json.loads(frame)
                if m["type"] == "x.tts.done":
                    assert m["status"] == "completed" and abs(m["audio_ms"] - got / 24) < 2
                    break
            assert got > 24000
            await ws.send(b"\x00\x00" * 480)  # binary audio in is accepted now
            with pytest.raises(TimeoutError):
                await recv(ws, 0.3)
    finally:
        await hub.stop()


async def test_client_that_never_reads_is_closed(tts_engines, monkeypatch):
    slow_link(monkeypatch, asyncio.Event().wait)  # nothing reaches the client
    hub = await start_hub(tts_engines, "limits.send_queue_messages=32", "limits.send_stall_s=1")
    try:
        ws = await websockets.connect(url(hub), max_queue=1)
        for i in range(4):
            await ws.send(json.dumps({"type": "x.tts.speak", "request_id": f"r{i}",
                                      "text": "This client will never read its audio, not a single frame."}))
        deadline = time.monotonic() + scaled(30)
        while hub.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not hub.sessions
        ws.transport.abort()
        monkeypatch.undo()
        async with websockets.connect(url(hub)) as ok:  # the server still serves others
            assert (await recv(ok))["type"] == "session.created"
    finally:
        await hub.stop()


async def test_shutdown_drains_turn_then_closes_1001(tts_engines):
    llm = FakeLLM("One short reply for the drain test.", delay_s=0.05)
    hub = await start_hub(tts_engines, llm=llm)
    async with websockets.connect(url(hub)) as ws:
        await recv(ws)
        for m in user_text("hi"):
            await ws.send(m)
        await until(ws, "response.created")
        stopper = asyncio.create_task(hub.stop(grace_s=scaled(10)))
        done, _ = await until(ws, "response.done")
        assert done["response"]["status"] == "completed"
        with pytest.raises(websockets.ConnectionClosed) as info:
            while True:
                await recv(ws)
        assert info.value.rcvd.code == 1001
        await stopper


async def test_session_time_limit_closes_with_1008(tts_engines):
    hub = await start_hub(tts_engines, "limits.max_session_minutes=0.01")  # 0.6 s
    try:
        async with websockets.connect(url(hub)) as ws:
            await recv(ws)
            t0 = time.monotonic()
            with pytest.raises(websockets.ConnectionClosed) as info:
                while True:
                    await recv(ws, 5)
            assert info.value.rcvd.code == 1008 and "session limit" in info.value.rcvd.reason
            assert 0.5 < time.monotonic() - t0 < scaled(3)
    finally:
        await hub.stop()


async def test_upgrade_refused_while_models_load(tts_engines):
    from base.config import load_config

    cfg = load_config(None, ["server.port=0", "trace.path=none"], environ={})
    hub = Hub(cfg, Engines(cfg))  # nothing loaded yet
    await hub.start()
    try:
        assert (await asyncio.to_thread(http_get, hub, "/health"))[0] == 200
        status, body, _ = await asyncio.to_thread(http_get, hub, "/ready")
        assert status == 503 and "loading" in body
        with pytest.raises(websockets.InvalidStatus) as info:
            async with websockets.connect(url(hub)):
                pass
        assert info.value.response.status_code == 503 and "Retry-After" in info.value.response.headers
    finally:
        await hub.stop()
