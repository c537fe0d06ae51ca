"""The OpenAI Agents SDK's realtime agent calls a function tool through voxloop.

``RealtimeAgent`` + ``RealtimeRunner`` connect to voxloop's URL; the first response is asked with
``tool_choice: "required"`` (the bundled SmolLM2-135M decides poorly on its own, docs/protocol.md),
the SDK runs the tool with the arguments the model wrote, sends the output and asks for the next
response itself, and the spoken answer follows. Real LLM and TTS; every server event goes through
the SDK's own parser (an ``error`` or a failed parse would show as an error event).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner
from agents.realtime.model_inputs import RealtimeModelSendRawMessage

from client_fakes import real_tts_engines, start_hub
from conftest import scaled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(300))]


@pytest.fixture(scope="module")
def tts_engines():
    return real_tts_engines()


@pytest.fixture(scope="module")
def bundled_llm():
    from base.config import load_config
    from llm.batched import BatchedChat

    chat = BatchedChat.from_config(load_config(None, ["llm.max_sequences=2"], environ={}))
    yield chat
    chat.close()


async def test_a_realtime_agent_calls_a_tool_and_speaks_the_answer(tts_engines, bundled_llm):
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        cities.append(city)
        return json.dumps({"city": city, "sky": "sunny", "celsius": 21})

    agent = RealtimeAgent(name="Assistant", instructions="You are a brief voice assistant.", tools=[get_weather])
    # "none" for the responses the SDK asks for itself (after the tool's output): the answer is spoken.
    runner = RealtimeRunner(agent, config={"model_settings": {"tool_choice": "none"}})
    hub = await start_hub(tts_engines, llm=bundled_llm)  # no x.* events: the SDK did not ask for them
    try:
        # A voice this server has: the SDK's default ("ash") is refused like any unknown voice.
        session = await runner.run(model_config={"url": f"ws://127.0.0.1:{hub.port}/v1/realtime",
                                                 "api_key": "sk-local", "initial_model_settings": {"voice": "default"}})
        seen: list[str] = []
        audio_after_tool = 0
        async with session:
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}
            await session.model.send_event(RealtimeModelSendRawMessage(
                message={"type": "conversation.item.create", "other_data": {"item": item}}))
            await session.model.send_event(RealtimeModelSendRawMessage(
                message={"type": "response.create", "other_data": {"response": {"tool_choice": "required"}}}))
            async with asyncio.timeout(scaled(180)):
                async for event in session:
                    seen.append(event.type)
                    assert event.type != "error", getattr(event, "error", event)
                    if event.type == "tool_end":
                        assert json.loads(event.output)["sky"] == "sunny"
                    elif event.type == "audio" and "tool_end" in seen:
                        audio_after_tool += len(event.audio.data)
                    elif event.type == "audio_end" and "tool_end" in seen:
                        break
        assert seen.index("tool_start") < seen.index("tool_end") < len(seen) - 1
        assert len(cities) == 1 and cities[0].strip()  # valid arguments: the SDK parsed and ran them
        assert audio_after_tool > 24000  # the answer, spoken (bytes of PCM16 at 24 kHz: > 0.5 s)
    finally:
        await hub.stop()
