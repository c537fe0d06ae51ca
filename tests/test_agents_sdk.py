"""The OpenAI Agents SDK's realtime runner holds a conversation with a default voxloop server.

The runner validates every server event against the OpenAI API's own models and reports any it
cannot read as an ``error`` event, so this shows a strict client sees only OpenAI events (the
``x.*`` events go only to clients that ask for them). Every model is real: whisper base,
SmolLM2, the Piper voice, the end-of-turn model (the runner asks for ``semantic_vad``). The one
setting the runner needs is a voice this server has: its default, OpenAI's "ash", is refused
with ``invalid_value`` like any unknown voice.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import soxr

from conftest import scaled
from base.config import load_config
from base.wav import read_wav

pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(600))]
realtime = pytest.importorskip("agents.realtime")
SOUND = Path("/usr/share/sounds/alsa/Front_Center.wav")


@pytest.fixture(scope="module")
def engines():
    from pipeline.engines import Engines

    e = Engines(load_config(None, ["server.port=0", "trace.path=none"], environ={}))
    e.load_sync()
    yield e
    e.close()


async def one_turn(session, events: list) -> None:
    """Collect the runner's events until the agent's turn ends; an error event fails the test."""
    async for event in session:
        events.append(event)
        assert event.type != "error", getattr(event, "error", event)
        if event.type == "raw_model_event":
            data = event.data
            assert data.type != "error", data
            if getattr(data, "type", None) == "raw_server_event" and data.data.get("type", "").startswith("x."):
                raise AssertionError(f"an extension event reached a strict client: {data.data}")
        if event.type == "agent_end":
            return


@pytest.mark.skipif(not SOUND.is_file(), reason="needs alsa-utils' recordings (scripts/system-deps.sh)")
async def test_agents_sdk_realtime_runner_text_and_spoken_turns(engines):
    from pipeline.hub import Hub

    hub = Hub(engines.cfg, engines)
    await hub.start()
    try:
        agent = realtime.RealtimeAgent(name="Assistant", instructions="Answer in one short sentence.")
        runner = realtime.RealtimeRunner(agent)
        session = await runner.run(model_config={
            "url": f"ws://127.0.0.1:{hub.port}/v1/realtime?model=voxloop", "api_key": "sk-local",
            "initial_model_settings": {"voice": "default"}})
        events: list = []
        async with session:
            await session.send_message("What colour is the sky on a clear day?")
            await asyncio.wait_for(one_turn(session, events), scaled(180))
            text_turn = [e for e in events if e.type == "audio"]
            assert text_turn, [e.type for e in events]  # the reply was spoken
            # A spoken turn: the recording, then silence (a microphone keeps streaming) until it is answered.
            pcm, rate = read_wav(SOUND)
            speech = soxr.resample(pcm, rate, 24000).astype(np.int16)

            async def microphone() -> None:
                for i in range(0, len(speech), 2400):
                    await session.send_audio(speech[i:i + 2400].tobytes())
                    await asyncio.sleep(0.1)
                while True:
                    await session.send_audio(np.zeros(2400, np.int16).tobytes())
                    await asyncio.sleep(0.1)

            mic = asyncio.create_task(microphone())
            try:
                await asyncio.wait_for(one_turn(session, events), scaled(180))
            finally:
                mic.cancel()
        said = " ".join(e.data.transcript for e in events if e.type == "raw_model_event"
                        and e.data.type == "input_audio_transcription_completed")
        assert "front" in said.lower(), said  # whisper heard the recording
    finally:
        await hub.stop()
