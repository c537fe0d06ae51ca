"""voxloop.client.RealtimeClient against an in-process hub on port 0.

ASR and LLM are tiny fakes in most tests (they test the client's orchestration:
routing, retries, collecting); the TTS is the real CPU engine. ``test_real_models_*``
runs every real model (slow).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from client_fakes import PTT, FakeASR, FakeLLM, start_hub, tone, real_tts_engines, ws_url
from conftest import scaled
from pipeline.engines import Engines
from pipeline.hub import Hub
from voxloop.client import RealtimeClient, RetryPolicy
from base.errors import ConnectionFailed, ModelError, Overloaded, ProtocolError

pytestmark = pytest.mark.timeout(scaled(120))
FAST_RETRY = RetryPolicy(attempts=6, initial_delay_s=0.05, max_delay_s=0.5)


@pytest.fixture(scope="module")
def tts_engines():
    return real_tts_engines()


@pytest.mark.parametrize("binary_audio", [False, True])
async def test_push_to_talk_turn_is_collected(tts_engines, binary_audio):
    asr = FakeASR()
    llm = FakeLLM()
    hub = await start_hub(tts_engines, asr=asr, llm=llm)
    try:
        async with RealtimeClient.connect(ws_url(hub), session=PTT, binary_audio=binary_audio) as c:
            assert c.session.audio.input.turn_detection is None
            assert c.session.x_binary_audio is binary_audio
            await c.send_audio(tone(1.5, 16000), sample_rate=16000)  # resampled to 24 kHz by the client
            await c.commit()
            reply = await c.collect_response(timeout_s=scaled(30))
    # 1.5 s at 16 kHz -> 24 kHz (client) -> 16 kHz (server): the ASR got 1.5 s (less the
        # ~32 ms the server's streaming resampler still holds at commit).
        assert 24000 - 800 <= asr.samples[0] <= 24000
        assert reply.status == "completed" and reply.reason is None
        assert reply.user_transcript == asr.text
        assert reply.transcript == llm.reply
        assert reply.sample_rate == 24000 and reply.pcm.dtype == np.int16
        assert 1.0 < reply.audio_s < 6.0  # two spoken sentences
        assert reply.item_id and reply.response_id.startswith("resp_")
        assert reply.created_at <= reply.first_audio_at <= reply.done_at
        assert reply.metrics.get("status") == "completed"
        assert llm.seen[0][-1] == {"role": "user", "content": asr.text}
    finally:
        await hub.stop()


async def test_stream_audio_is_paced_and_events_arrive_in_order(tts_engines):
    hub = await start_hub(tts_engines)
    try:
        async with RealtimeClient.connect(ws_url(hub), session=PTT) as c:
            await c.update_session(audio={"input": {"format": {"type": "audio/pcm", "rate": 16000}}})
            assert c.session.input_rate == 16000 and c.session.audio.input.turn_detection is None
            t0 = time.monotonic()
            sent_at = await c.stream_audio(tone(0.6, 48000), sample_rate=48000, chunk_ms=20)
            assert 0.55 <= sent_at - t0 < scaled(1.5)  # real time, not all at once
            await c.commit()
            seen = []
            async for event in c.events():
                seen.append(event.type)
                if event.type == "x.turn.metrics":
                    break
        assert seen[0] == "input_audio_buffer.committed"
        assert seen.index("conversation.item.input_audio_transcription.completed") < seen.index("response.created")
        assert seen.index("response.output_audio.delta") < seen.index("response.done") == len(seen) - 2
    finally:
        await hub.stop()


async def test_errors_are_typed(tts_engines):
    hub = await start_hub(tts_engines)
    try:
        async with RealtimeClient.connect(ws_url(hub), session=PTT) as c:
            with pytest.raises(ProtocolError) as info:  # checked by the protocol core before sending
                await c.update_session(audio={"input": {"format": {"type": "audio/pcm", "rate": 44100}}})
            assert info.value.code == "unsupported_audio_format"
            assert info.value.param == "session.audio.input.format.rate"
            await c.commit()  # nothing to commit: the server says so
            with pytest.raises(ProtocolError) as info:
                await c.wait_for("input_audio_buffer.committed", timeout_s=scaled(5))
            assert info.value.code == "input_audio_buffer_commit_empty"
            await c.cancel_response()
            error = await c.wait_for("error", timeout_s=scaled(5))
            assert error.error.code == "response_cancel_not_active"
            with pytest.raises(TimeoutError):
                await c.wait_for("response.done", timeout_s=0.2)
    finally:
        await hub.stop()


async def test_cancel_truncate_and_text_turns(tts_engines):
    llm = FakeLLM(" ".join(["This reply goes on and on, clause after clause."] * 6), delay_s=0.03)
    hub = await start_hub(tts_engines, llm=llm)
    try:
        async with RealtimeClient.connect(ws_url(hub)) as c:
            await c.send_text("Talk for a while.")
            first = await c.wait_for("response.output_audio.delta", timeout_s=scaled(20))
            await c.cancel_response()
            reply = await c.collect_response(timeout_s=scaled(20))  # picks up after the consumed events
            assert reply.response_id == first.response_id
            assert (reply.status, reply.reason) == ("cancelled", "client_cancelled")
            assert len(reply.pcm) > 0 and reply.user_transcript is None
            await c.truncate(reply.item_id, 300)
            truncated = await c.wait_for("conversation.item.truncated", timeout_s=scaled(5))
            assert (truncated.item_id, truncated.audio_end_ms) == (reply.item_id, 300)
            await c.report_playback(reply.item_id, 300, finished=True, response_id=reply.response_id)
            await c.send_text("And now?")
            second = await c.collect_response(timeout_s=scaled(30))
            assert second.status == "completed" and second.response_id != reply.response_id
    finally:
        await hub.stop()


class FailingLLM(FakeLLM):
    def stream(self, messages, cancel=None, max_tokens=None):
        yield from ["It", " is", " sunny", " today.", " Take"]
        raise ModelError("the language model failed")


async def test_a_failed_response_is_a_reply_with_its_error_code(tts_engines):
    hub = await start_hub(tts_engines, llm=FailingLLM())
    try:
        async with RealtimeClient.connect(ws_url(hub)) as c:
            await c.send_text("Hello?")
            reply = await c.collect_response(timeout_s=scaled(30))
        assert (reply.status, reply.reason, reply.transcript) == ("failed", "model_error", "It is sunny today.")
    finally:
        await hub.stop()


async def test_speak_runs_beside_a_conversation_and_retries_when_overloaded(tts_engines):
    hub = await start_hub(tts_engines)
    try:
        async with RealtimeClient.connect(ws_url(hub), retry=FAST_RETRY) as c:
            await c.update_session(audio={"output": {"format": {"type": "audio/pcm", "rate": 16000}}})
            await c.send_text("Hello?")
            # 12 requests at once: the server takes 8 per session, refuses the rest (server_overloaded).
            texts = [f"Request number {i} is here." for i in range(12)]
            results, reply = await asyncio.gather(
                asyncio.gather(*(c.speak(t, request_id=f"r{i}") for i, t in enumerate(texts))),
                c.collect_response(timeout_s=scaled(30)))
        assert reply.status == "completed" and reply.sample_rate == 16000
        assert [r.request_id for r in results] == [f"r{i}" for i in range(12)]
        for r in results:
            assert r.status == "completed" and r.sample_rate == 16000
            assert abs(1000 * len(r.pcm) / 16000 - r.audio_ms) <= 1
            assert 0 < r.first_audio_s <= r.total_s
        assert max(r.attempts for r in results) > 1  # some were refused, retried and served
        retried = [r for r in results if r.attempts > 1]
        assert all(r.total_s >= 2.0 for r in retried)  # waited the server's retry_after_ms (2000)
    finally:
        await hub.stop()


async def test_connect_waits_for_a_free_slot_and_respects_retry_after(tts_engines):
    hub = await start_hub(tts_engines, "limits.max_sessions=1", "limits.retry_after_s=1")
    try:
        first = await RealtimeClient.connect(ws_url(hub))
        with pytest.raises(Overloaded) as info:
            await RealtimeClient.connect(ws_url(hub), retry=RetryPolicy(attempts=1))
        assert info.value.retry_after_ms == 1000
        t0 = time.monotonic()
        second = asyncio.create_task(_open(ws_url(hub)))
        await asyncio.sleep(0.3)
        assert not second.done()
        await first.close()
        client = await asyncio.wait_for(second, scaled(10))
        assert 0.9 <= time.monotonic() - t0  # waited Retry-After, not the 50 ms backoff
        assert client.connected
        await client.close()
    finally:
        await hub.stop()


async def _open(url: str) -> RealtimeClient:
    return await RealtimeClient.connect(url, retry=FAST_RETRY)


async def test_auth_reconnect_and_server_shutdown(tts_engines):
    hub = await start_hub(tts_engines, "server.auth_token=s3cret")
    try:
        with pytest.raises(ConnectionFailed) as info:
            await RealtimeClient.connect(ws_url(hub), token="wrong", retry=FAST_RETRY)
        assert info.value.status == 401
        assert hub.metrics.rejected.labels(reason="auth")._value.get() == 1  # not retried
        c = await RealtimeClient.connect(ws_url(hub), token="s3cret", session={"instructions": "Be terse."})
        assert not c.compressed and c.ended is None  # the client offers no permessage-deflate
        assert c.response_headers is not None and c.response_headers["Upgrade"].lower() == "websocket"
        old_id = c.session.id
        await c.update_session(audio={"input": {"turn_detection": None}})
        await c.reconnect()
        assert c.session.id != old_id
        assert c.session.instructions == "Be terse." and c.session.audio.input.turn_detection is None
        await hub.stop(grace_s=0)  # closes sessions with 1001: the event stream just ends
        assert [e.type async for e in c.events()] == []
        assert not c.connected and c.ended.close_code == 1001
        with pytest.raises(ConnectionFailed):
            await c.commit()
        await c.close()
    finally:
        await hub.stop()


async def test_unreachable_server_fails_after_retries():
    t0 = time.monotonic()
    with pytest.raises(ConnectionFailed) as info:
        await RealtimeClient.connect("ws://127.0.0.1:9/v1/realtime",
                                     retry=RetryPolicy(attempts=3, initial_delay_s=0.05))
    assert info.value.status is None and time.monotonic() - t0 >= 0.15


@pytest.mark.slow
async def test_real_models_voice_turn(cfg):
    from bench.piper_speech import PiperSpeech

    # With room silence around it, as a push-to-talk recording has (whisper base may garble
    # the last word of a clip cut right at the end of speech: "France" -> "friends").
    room = np.zeros(16000 // 4, np.int16)
    question = np.concatenate([room, PiperSpeech(cfg).say("What is the capital of France?"), room])
    cfg = cfg.replace("server", port=0)
    engines = Engines(cfg)
    await engines.load()
    hub = Hub(cfg, engines)
    await hub.start()
    try:
        async with RealtimeClient.connect(ws_url(hub), session=PTT, binary_audio=True) as c:
            await c.stream_audio(question, 16000, realtime=False)
            await c.commit()
            reply = await c.collect_response(timeout_s=scaled(60))
    finally:
        await hub.stop()
    assert "capital" in reply.user_transcript.lower() and "france" in reply.user_transcript.lower()
    assert reply.status == "completed" and reply.transcript.strip()
    assert reply.audio_s > 0.5
    assert reply.metrics["status"] == "completed" and reply.metrics["stages_ms"]["first_audio_sent"] > 0
