"""The official ``openai`` Python SDK's realtime client holds a conversation with voxloop.

It connects to ``{base}/realtime?model=…`` with ``Authorization: Bearer …`` and sends the
GA session shape; every event it receives must parse with its own pydantic models.
Fake ASR/LLM (this is a protocol test); the TTS is real.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest
from openai import AsyncOpenAI

from conftest import scaled
from test_hub import FakeASR, FakeLLM, start_hub, tts_engines  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(scaled(120))


async def collect(conn) -> dict:
    out = {"types": [], "audio_bytes": 0}
    async for event in conn:
        out["types"].append(event.type)
        if event.type == "response.output_audio.delta":
            out["audio_bytes"] += len(base64.b64decode(event.delta))
        elif event.type == "conversation.item.input_audio_transcription.completed":
            out["user"] = event.transcript
        elif event.type == "response.output_audio_transcript.done":
            out["transcript"] = event.transcript
        elif event.type == "response.done":
            out["status"] = event.response.status
            return out
        elif event.type == "error":
            raise AssertionError(event.error.message)
    raise AssertionError("connection closed before response.done")


async def test_openai_sdk_conversation(tts_engines):  # noqa: F811
    hub = await start_hub(tts_engines, "server.auth_token=sk-local", asr=FakeASR("what time is it"))
    try:
        base = f"127.0.0.1:{hub.port}/v1"
        client = AsyncOpenAI(api_key="sk-local", base_url=f"http://{base}", websocket_base_url=f"ws://{base}")
        async with client.realtime.connect(model="gpt-realtime") as conn:
            await conn.session.update(session={
                "type": "realtime", "instructions": "Be brief.", "output_modalities": ["audio"],
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None,
                                    "transcription": {"model": "whisper-1"}},
                          "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "default"}}})
            # Text turn.
            await conn.conversation.item.create(item={
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]})
            await conn.response.create()
            first = await collect(conn)
            assert first["status"] == "completed" and first["audio_bytes"] > 24000
            assert first["types"][:2] == ["session.created", "session.updated"]
            # Audio turn, push-to-talk: append + commit.
            pcm = np.zeros(24000, np.int16).tobytes()
            await conn.input_audio_buffer.append(audio=base64.b64encode(pcm).decode())
            await conn.input_audio_buffer.commit()
            second = await collect(conn)
            assert second["user"] == "what time is it" and second["status"] == "completed"
            assert second["transcript"] == first["transcript"]
    finally:
        await hub.stop()


WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def bundled_llm():
    from base.config import load_config
    from llm.batched import BatchedChat

    chat = BatchedChat.from_config(load_config(None, ["llm.max_sequences=2"], environ={}))
    yield chat
    chat.close()


@pytest.mark.slow
async def test_openai_sdk_function_call_round_trip(tts_engines, bundled_llm):  # noqa: F811
    """A function tool is called with valid arguments (the bundled LLM, ``tool_choice: required``), the
    result goes back as a ``function_call_output`` item, and the spoken answer follows; every event
    parses with the SDK's own models."""
    import json

    import jsonschema

    hub = await start_hub(tts_engines, llm=bundled_llm)
    try:
        base = f"127.0.0.1:{hub.port}/v1"
        client = AsyncOpenAI(api_key="sk-local", base_url=f"http://{base}", websocket_base_url=f"ws://{base}")
        async with client.realtime.connect(model="gpt-realtime") as conn:
            await conn.session.update(session={"type": "realtime", "tools": [WEATHER], "tool_choice": "auto",
                                               "audio": {"input": {"turn_detection": None}}})
            await conn.conversation.item.create(item={
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]})
            await conn.response.create(response={"tool_choice": "required"})
            calls = []
            async for event in conn:
                assert event.type != "error", event
                if event.type == "response.output_item.done" and event.item.type == "function_call":
                    calls.append(event.item)
                if event.type == "response.done":
                    assert event.response.status == "completed"
                    assert [o.type for o in event.response.output] == ["function_call"]
                    break
            assert len(calls) == 1 and calls[0].name == "get_weather"
            jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
            await conn.conversation.item.create(item={
                "type": "function_call_output", "call_id": calls[0].call_id, "output": '{"sky": "sunny", "celsius": 21}'})
            await conn.response.create(response={"tool_choice": "none"})
            answer = await collect(conn)
            assert answer["status"] == "completed" and answer["audio_bytes"] > 0 and answer["transcript"]
    finally:
        await hub.stop()
