"""Every field and event of docs/protocol.md does what the docs say, checked through the WebSocket.

The extension events reach only clients that ask for them; ``response.done`` always carries
``usage``; ``response.create``'s options are honoured and reported; items are created after a given
item, deleted and retrieved; ``output_audio_buffer.clear`` stops the reply's audio; the transcription
settings reach the ASR; unknown items are ``item_not_found``. The TTS is the real CPU engine, the
ASR and LLM are fakes that record what they were given (this is orchestration).
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import websockets

from client_fakes import FakeASR, FakeLLM, FakeTranscript, real_tts_engines
from conftest import scaled
from test_contract import CLAUSES, CountingLLM, quiet, serving, session, types
from rt import append, recv, speech_24k, until, url, user_text

pytestmark = pytest.mark.timeout(scaled(120))
PTT = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}


class PromptASR(FakeASR):
    """Records the ``prompt`` each call got (whisper's initial prompt)."""

    def __init__(self, text: str = "tell me about the weather") -> None:
        super().__init__(text)
        self.prompts: list[str | None] = []

    def transcribe(self, pcm, language=None, prompt=None):
        self.prompts.append(prompt)
        return FakeTranscript(self.text)


@pytest.fixture(scope="module")
def tts_engines():
    return real_tts_engines()


def item(role: str, text: str, **extra) -> dict:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}], **extra}


async def create(ws, role: str, text: str, **fields) -> dict:
    """``conversation.item.create``; the ``conversation.item.done`` that answers it."""
    await ws.send(json.dumps({"type": "conversation.item.create", "item": item(role, text), **fields}))
    done, _ = await until(ws, "conversation.item.done")
    return done


async def error_of(ws, event: dict) -> dict:
    await ws.send(json.dumps({**event, "event_id": "c_err"}))
    err, _ = await until(ws, "error")
    assert err["error"]["event_id"] == "c_err"
    return err["error"]


# --------------------------------------------------------------------------- extension events, usage
async def test_x_events_reach_only_clients_that_ask_and_every_response_done_has_usage(tts_engines):
    async with serving(tts_engines, llm=FakeLLM(" ".join(CLAUSES * 3), delay_s=0.02)) as hub:
        strict = await websockets.connect(url(hub, x_events=False))
        created = await recv(strict)
        assert created["type"] == "session.created" and created["session"]["x_events"] is False
        for m in user_text("Hello?"):
            await strict.send(m)
        await until(strict, "response.output_audio.delta")
        await strict.send(json.dumps({"type": "response.cancel"}))
        done, seen = await until(strict, "response.done")
        assert done["response"]["status"] == "cancelled"
        usage = done["response"]["usage"]  # the tokens streamed before the cancel
        assert usage["output_tokens"] > 0 and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        assert not [e for e in seen + await quiet(strict, 1.0) if e["type"].startswith("x.")]
        # The same client asks in a session.update: the next turn's metrics arrive.
        await strict.send(json.dumps({"type": "session.update", "session": {"x_events": True}}))
        assert (await until(strict, "session.updated"))[0]["session"]["x_events"] is True
        for m in user_text("Again?"):
            await strict.send(m)
        done, _ = await until(strict, "response.done")
        assert done["response"]["usage"]["output_tokens"] > 0
        metrics, _ = await until(strict, "x.turn.metrics")
        assert metrics["response_id"] == done["response"]["id"]
        await strict.close()
        # ?x_events=true on the URL: from session.created on.
        ws = await websockets.connect(url(hub))
        assert (await recv(ws))["session"]["x_events"] is True
        await ws.close()


async def test_bad_url_parameters_refuse_the_upgrade(tts_engines):
    async with serving(tts_engines) as hub:
        for query in ("intent=translation", "x_events=maybe"):
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(url(hub, x_events=False) + "?" + query)
            assert refused.value.response.status_code == 400


# --------------------------------------------------------------------------- response.create options
async def test_response_options_are_applied_and_reported(tts_engines):
    llm = CountingLLM(" ".join(CLAUSES[:2]))  # 9 tokens
    async with serving(tts_engines, llm=llm) as hub:
        ws = await session(hub)
        await create(ws, "user", "How is the weather?")
        await ws.send(json.dumps({"type": "response.create", "response": {
            "output_modalities": ["text"], "max_output_tokens": 3, "metadata": {"topic": "weather"}}}))
        created, _ = await until(ws, "response.created")
        reported = {k: created["response"][k] for k in ("output_modalities", "max_output_tokens", "metadata")}
        assert reported == {"output_modalities": ["text"], "max_output_tokens": 3, "metadata": {"topic": "weather"}}
        assert "audio" not in created["response"]  # a text response has no voice
        done, seen = await until(ws, "response.done")
        assert "response.output_text.delta" in types(seen) and "response.output_audio.delta" not in types(seen)
        assert done["response"]["status"] == "incomplete" and done["response"]["metadata"] == {"topic": "weather"}
        assert done["response"]["usage"]["output_tokens"] == 3
        # Without options: the session's audio, no metadata, its voice reported.
        await ws.send(json.dumps({"type": "response.create"}))
        created, _ = await until(ws, "response.created")
        assert created["response"]["output_modalities"] == ["audio"] and created["response"]["metadata"] is None
        assert created["response"]["audio"]["output"]["voice"] == "default"
        await until(ws, "response.done")
        await ws.close()


async def test_out_of_band_response_reads_only_its_input(tts_engines):
    llm = FakeLLM("It is sunny today.")
    async with serving(tts_engines, llm=llm) as hub:
        ws = await session(hub)
        first = (await create(ws, "user", "Remember the number seven."))["item"]["id"]
        await create(ws, "user", "And the colour blue.")
        await ws.send(json.dumps({"type": "response.create", "response": {
            "conversation": "none", "instructions": "Classify.",
            "input": [{"type": "item_reference", "id": first}, item("user", "Is this about numbers?")]}}))
        done, _ = await until(ws, "response.done")
        assert done["response"]["status"] == "completed"
        assert llm.seen[-1] == [{"role": "system", "content": "Classify."},
                                {"role": "user", "content": "Remember the number seven."},
                                {"role": "user", "content": "Is this about numbers?"}]
        err = await error_of(ws, {"type": "response.create", "response": {
            "input": [{"type": "item_reference", "id": "item_nope"}]}})
        assert err["code"] == "item_not_found"
        # Not added to the conversation: the next response reads the two user items only.
        await ws.send(json.dumps({"type": "response.create"}))
        await until(ws, "response.done")
        assert [m["content"] for m in llm.seen[-1][1:]] == ["Remember the number seven.", "And the colour blue."]
        await ws.close()


# --------------------------------------------------------------------------- items
async def test_items_are_created_after_a_given_item_deleted_and_retrieved(tts_engines):
    llm = FakeLLM("Fine.")
    async with serving(tts_engines, llm=llm) as hub:
        ws = await session(hub)
        a = (await create(ws, "user", "First."))["item"]["id"]
        c = await create(ws, "user", "Third.")
        assert c["previous_item_id"] == a
        b = await create(ws, "user", "Second.", previous_item_id=a)
        assert b["previous_item_id"] == a
        root = await create(ws, "system", "Speak English.", previous_item_id="root")
        assert root["previous_item_id"] is None
        assert (await error_of(ws, {"type": "conversation.item.create", "item": item("user", "x"),
                                    "previous_item_id": "item_nope"}))["code"] == "item_not_found"
        assert (await error_of(ws, {"type": "conversation.item.create",
                                    "item": item("user", "again", id=a)}))["code"] == "invalid_value"
        await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": b["item"]["id"]}))
        got, _ = await until(ws, "conversation.item.retrieved")
        assert got["item"] == b["item"]
        await ws.send(json.dumps({"type": "conversation.item.delete", "item_id": c["item"]["id"]}))
        deleted, _ = await until(ws, "conversation.item.deleted")
        assert deleted["item_id"] == c["item"]["id"]
        for event in ("conversation.item.delete", "conversation.item.retrieve"):
            assert (await error_of(ws, {"type": event, "item_id": c["item"]["id"]}))["code"] == "item_not_found"
        await ws.send(json.dumps({"type": "response.create"}))
        await until(ws, "response.done")
        assert [(m["role"], m["content"]) for m in llm.seen[-1][1:]] == [
            ("system", "Speak English."), ("user", "First."), ("user", "Second.")]
        await ws.close()


async def test_unknown_items_in_truncate_and_playback_are_item_not_found(tts_engines):
    async with serving(tts_engines) as hub:
        ws = await session(hub)
        for event in ({"type": "conversation.item.truncate", "item_id": "item_nope", "content_index": 0,
                       "audio_end_ms": 10},
                      {"type": "x.playback", "item_id": "item_nope", "audio_end_ms": 10}):
            err = await error_of(ws, event)
            assert (err["code"], err["type"]) == ("item_not_found", "invalid_request_error")
        await ws.close()


async def test_output_audio_buffer_clear_stops_the_reply_and_keeps_what_was_heard(tts_engines):
    llm = FakeLLM(" ".join(CLAUSES * 4), delay_s=0.03)
    async with serving(tts_engines, llm=llm) as hub:
        ws = await session(hub)
        for m in user_text("Talk a lot."):
            await ws.send(m)
        delta, _ = await until(ws, "response.output_audio.delta")
        rid, item_id = delta["response_id"], delta["item_id"]
        await ws.send(json.dumps({"type": "x.playback", "item_id": item_id, "audio_end_ms": 0}))
        await ws.send(json.dumps({"type": "output_audio_buffer.clear"}))
        done, seen = await until(ws, "response.done")
        assert (done["response"]["status"], done["response"]["status_details"]["reason"]) == ("cancelled",
                                                                                            "client_cancelled")
        cleared, after = await until(ws, "output_audio_buffer.cleared")
        assert cleared["response_id"] == rid
        assert not [e for e in after + await quiet(ws) if e["type"] == "response.output_audio.delta"]
        # History keeps what was heard: nothing of the reply (played 0 ms).
        await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": item_id}))
        err, _ = await until(ws, "error")
        assert err["error"]["code"] == "item_not_found"
        await ws.close()


# --------------------------------------------------------------------------- transcription settings
async def test_transcription_prompt_reaches_the_asr_and_null_stops_transcripts(tts_engines):
    asr, llm = PromptASR("what is the weather like"), FakeLLM("Sunny.")
    async with serving(tts_engines, "asr.partial_interval_ms=0", asr=asr, llm=llm) as hub:
        ws = await session(hub, {**PTT, "audio": {"input": {
            "turn_detection": None, "transcription": {"language": "en", "prompt": "Voxloop, Ljubljana."}}}})
        await ws.send(append(speech_24k(1.0)))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        completed, _ = await until(ws, "conversation.item.input_audio_transcription.completed")
        assert completed["transcript"] == "what is the weather like" and asr.prompts[-1] == "Voxloop, Ljubljana."
        await until(ws, "response.done")
        await ws.send(json.dumps({"type": "session.update", "session": {"audio": {"input": {"transcription": None}}}}))
        await until(ws, "session.updated")
        await ws.send(append(speech_24k(1.0)))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        done, seen = await until(ws, "response.done")
        assert not [t for t in types(seen) if "transcription" in t]
        user_done = next(e for e in seen if e["type"] == "conversation.item.done" and e["item"]["role"] == "user")
        assert user_done["item"]["content"] == [{"type": "input_audio"}]  # no transcript
        assert llm.seen[-1][-1] == {"role": "user", "content": "what is the weather like"}  # the LLM still hears it
        assert asr.prompts[-1] is None
        await ws.close()


# --------------------------------------------------------------------------- speed
#: ``audio.output.speed`` 1.5 shortens speech by this much at least on both engines (1.50x on this sentence:
#: the length scale leaves the model's per-phoneme rounding out, ``tts_engine.engine.speed_length_scale``).
SPEED_SHRINK = 1.4
#: The same sentence as a reply (cut by the clause segmenter from the LLM's tokens) measured 1.40-1.46x
#: here, against 1.46-1.51x for x.tts.speak; the bound leaves room for a loaded 2-core machine.
REPLY_SHRINK = 1.35
TORCH_ON_CPU = ("tts.backend=cuda", "tts.device=cpu", "tts.cuda_graphs=false", "tts.max_batch=4",
                "tts.output_rate=24000")


@pytest.fixture(scope="module", params=["onnx", "torch"])
def any_engine(request):
    """(engines, config overrides) of the onnxruntime engine and of the PyTorch engine on the CPU."""
    if request.param == "onnx":
        yield real_tts_engines(), ()
        return
    pytest.importorskip("torch")
    from dataclasses import replace

    from base.config import load_config
    from tts_engine.torch_vits.cuda_engine import CudaTtsEngine

    cfg = load_config(None, list(TORCH_ON_CPU), environ={})
    engine = CudaTtsEngine.from_config(replace(cfg, tts=cfg.tts))
    yield [engine], TORCH_ON_CPU
    engine.close()


async def test_speed_shortens_reply_and_tts_speak_audio(any_engine):
    engines, overrides = any_engine
    sentence = "The quick brown fox jumps over the lazy dog near the river bank."
    # Duration noise off: the lengths compared are the model's, not a random draw's.
    async with serving(engines, *overrides, "tts.noise_w=0", llm=FakeLLM(sentence)) as hub:
        lengths: dict[float, list[int]] = {}
        for speed in (1.0, 1.5):
            ws = await session(hub, {"audio": {"output": {"speed": speed}}})
            await ws.send(json.dumps({"type": "x.tts.speak", "request_id": "r", "text": sentence}))
            tts_done, _ = await until(ws, "x.tts.done")
            for m in user_text("Say it."):
                await ws.send(m)
            done, seen = await until(ws, "response.done")
            samples = sum(len(e["delta"]) * 3 // 4 // 2 for e in seen if e["type"] == "response.output_audio.delta")
            lengths[speed] = [tts_done["audio_ms"], 1000 * samples // 24000]
            await ws.close()
        (tts_slow, reply_slow), (tts_fast, reply_fast) = lengths[1.0], lengths[1.5]
        assert tts_slow >= SPEED_SHRINK * tts_fast and reply_slow >= REPLY_SHRINK * reply_fast, lengths


async def test_g711_audio_in_and_out_on_the_wire(tts_engines):
    """μ-law and A-law: input bytes reach the ASR as 16 kHz, the voice comes back one byte a sample at 8 kHz."""
    import base64

    from realtime.audio_formats import bytes_to_pcm, pcm_to_bytes

    asr = FakeASR()
    async with serving(tts_engines, "asr.partial_interval_ms=0", asr=asr, llm=FakeLLM("It is sunny today.")) as hub:
        for fmt in ("audio/pcmu", "audio/pcma"):
            ws = await session(hub, {**PTT, "audio": {"input": {"turn_detection": None, "format": {"type": fmt}},
                                                      "output": {"format": {"type": fmt}}}})
            t = np.arange(8000) / 8000
            tone = (8000 * np.sin(2 * np.pi * 300 * t)).astype(np.int16)
            audio = base64.b64encode(pcm_to_bytes(tone, fmt)).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            done, seen = await until(ws, "response.done")
            assert asr.samples[-1] == 16000  # 1 s of 8 kHz G.711 -> 16 kHz for the ASR
            raw = b"".join(base64.b64decode(e["delta"]) for e in seen if e["type"] == "response.output_audio.delta")
            pcm = bytes_to_pcm(raw, fmt)
            assert 0.8 < len(pcm) / 8000 < 3 and np.abs(pcm.astype(np.int32)).max() > 1000  # ~1.3 s of speech
            await ws.close()


# --------------------------------------------------------------------------- voices
VOICES_TOML = """
[tts]
voices = [{name = "slow", length_scale = 1.5}, {name = "steady", noise_scale = 0.0, noise_w = 0.0}]
"""


async def test_voices_are_chosen_by_name_and_unknown_names_are_refused(tts_engines, tmp_path):
    """The bundled voice under two more names with other settings: ``slow`` speaks longer, ``steady``
    without noise (the same text twice gives the same samples, the default voice's differ)."""
    from base.config import load_config
    from pipeline.engines import Engines
    from pipeline.hub import Hub

    import shutil

    from base.models import resolve_voice

    own = resolve_voice(load_config(None, [], environ={})).path
    copy = tmp_path / "copy.onnx"  # another voice file (the same voice): its own CPU engine
    shutil.copy(own, copy)
    shutil.copy(f"{own}.json", f"{copy}.json")
    path = tmp_path / "voices.toml"
    path.write_text(VOICES_TOML.rstrip()[:-1] + f', {{name = "other", path = "{copy}"}}]\n')
    cfg = load_config(str(path), ["server.port=0", "trace.path=none"], environ={})
    hub = Hub(cfg, Engines.from_parts(cfg, FakeASR(), FakeLLM("It is sunny today."), tts_engines))
    await hub.start()
    try:
        ws = await session(hub)
        err = await error_of(ws, {"type": "session.update", "session": {"audio": {"output": {"voice": "ash"}}}})
        assert (err["code"], err["param"]) == ("invalid_value", "session.audio.output.voice")
        assert "default, slow, steady, other" in err["message"]
        assert hub.engines.voices["other"].worker is not None and hub.engines.voices["slow"].worker is None
        from rt import http_get

        _, metrics, _ = await asyncio.to_thread(http_get, hub, "/metrics")
        assert 'voxloop_tts_voice{device="cpu",own_engine="true",voice="other"} 1.0' in metrics
        assert 'voxloop_tts_voice{device="cpu",own_engine="false",voice="slow"} 1.0' in metrics
        err = await error_of(ws, {"type": "x.tts.speak", "request_id": "r0", "text": "Hi.", "voice": "nope"})
        assert (err["code"], err["param"]) == ("invalid_value", "voice")

        async def speak(voice: str | None, rid: str) -> tuple[int, bytes]:
            extra = {"voice": voice} if voice else {}
            await ws.send(json.dumps({"type": "x.tts.speak", "request_id": rid, "text": "The river runs fast.",
                                      **extra}))
            done, seen = await until(ws, "x.tts.done")
            audio = b"".join(e["delta"].encode() for e in seen if e["type"] == "x.tts.audio.delta")
            return done["audio_ms"], audio

        (default_ms, d1), (_, d2) = await speak(None, "a"), await speak("default", "b")
        (slow_ms, _), ((_, s1), (_, s2)) = await speak("slow", "c"), (await speak("steady", "d"), await speak("steady", "e"))
        assert slow_ms > 1.3 * default_ms and d1 != d2 and s1 == s2
        other_ms, _ = await speak("other", "f")
        assert 0.7 * default_ms < other_ms < 1.3 * default_ms  # the same voice, spoken by its own engine
        # The session's voice speaks its replies and is reported in response.created.
        await ws.send(json.dumps({"type": "session.update", "session": {"audio": {"output": {"voice": "steady"}}}}))
        await until(ws, "session.updated")
        replies = []
        for _ in range(2):
            for m in user_text("Weather?"):
                await ws.send(m)
            created, _ = await until(ws, "response.created")
            assert created["response"]["audio"]["output"]["voice"] == "steady"
            _, seen = await until(ws, "response.done")
            replies.append(b"".join(e["delta"].encode() for e in seen if e["type"] == "response.output_audio.delta"))
        assert replies[0] == replies[1]
        await ws.close()
    finally:
        await hub.stop()


# --------------------------------------------------------------------------- transcription sessions
async def test_transcription_session_update_makes_a_transcription_session(tts_engines):
    asr, llm = PromptASR("hello there"), FakeLLM()
    async with serving(tts_engines, "asr.partial_interval_ms=0", asr=asr, llm=llm) as hub:
        ws = await session(hub)
        await ws.send(json.dumps({"type": "transcription_session.update", "session": {
            "input_audio_format": "g711_ulaw", "turn_detection": None,
            "input_audio_transcription": {"model": "whisper-1", "language": "en", "prompt": "Greetings."}}}))
        updated, _ = await until(ws, "transcription_session.updated")
        s = updated["session"]
        assert (s["type"], s["audio"]["input"]["format"], s["audio"]["input"]["turn_detection"]) == (
            "transcription", {"type": "audio/pcmu", "rate": 8000}, None)
        from realtime.audio_formats import pcm_to_bytes
        import base64

        audio = base64.b64encode(pcm_to_bytes(speech_24k(1.0)[::3], "audio/pcmu")).decode()
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        completed, _ = await until(ws, "conversation.item.input_audio_transcription.completed")
        assert completed["transcript"] == "hello there" and asr.prompts[-1] == "Greetings."
        err = await error_of(ws, {"type": "response.create"})
        assert err["code"] == "unsupported_event_type"
        assert not [e for e in await quiet(ws, 0.5) if e["type"].startswith("response.")] and not llm.seen
        await ws.close()
