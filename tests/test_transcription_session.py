"""Real recordings through the real whisper: a transcription-only session held by the official
``openai`` SDK on a server that loads no LLM and no voice, and a G.711 (μ-law) telephone turn whose
reply decodes to the words the 16-bit path gives.

The recordings are alsa-utils' (a human voice saying "Front center", "Front left"…;
``scripts/system-deps.sh`` installs them).
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import numpy as np
import pytest
import soxr
import websockets
from openai import AsyncOpenAI

from client_fakes import FakeLLM, real_tts_engines
from conftest import scaled
from rt import until, url
from base.config import load_config
from base.wav import read_wav
from pipeline.engines import Engines
from pipeline.hub import Hub

pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(300))]
SOUNDS = Path("/usr/share/sounds/alsa")
if not (SOUNDS / "Front_Center.wav").is_file():
    pytest.skip("needs alsa-utils' recordings (scripts/system-deps.sh)", allow_module_level=True)


def recording(name: str, rate: int) -> np.ndarray:
    pcm, native = read_wav(SOUNDS / f"{name}.wav")
    return soxr.resample(pcm, native, rate).astype(np.int16)


@pytest.fixture(scope="module")
def transcriber():
    from asr.transcriber import Transcriber

    return Transcriber.from_config(load_config(None, [], environ={}))


async def serve(*overrides: str, asr, llm=None, tts=()) -> Hub:
    cfg = load_config(None, ["server.port=0", "trace.path=none", *overrides], environ={})
    hub = Hub(cfg, Engines.from_parts(cfg, asr, llm, list(tts)))
    await hub.start()
    return hub


async def test_openai_sdk_transcription_session_gets_the_words(transcriber):
    """``?intent=transcription`` (the SDK's ``extra_query``) on a ``server.stages = ["asr"]`` server:
    speech start and stop from the VAD, partial and final transcripts, no response."""
    hub = await serve("server.stages=asr", "asr.partial_interval_ms=300", asr=transcriber)
    try:
        assert hub.engines.llm is None and hub.engines.speech is None  # nothing but the ASR loaded
        base = f"127.0.0.1:{hub.port}/v1"
        client = AsyncOpenAI(api_key="sk-local", base_url=f"http://{base}", websocket_base_url=f"ws://{base}")
        async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            await conn.session.update(session={
                "type": "transcription",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                    "transcription": {"model": "whisper-1", "language": "en"},
                                    "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}})
            speech = np.concatenate([np.zeros(12000, np.int16), recording("Front_Center", 24000),
                                     np.zeros(36000, np.int16)])
            for i in range(0, len(speech), 2400):  # at real time, as a microphone: partials while it speaks
                await conn.input_audio_buffer.append(audio=base64.b64encode(speech[i:i + 2400].tobytes()).decode())
                await asyncio.sleep(0.1)
            seen: list[str] = []
            async for event in conn:
                seen.append(event.type)
                assert event.type != "error", event
                if event.type == "conversation.item.input_audio_transcription.completed":
                    words = event.transcript.lower()
                    break
            assert "front" in words and "center" in words, words
            assert seen[0] == "session.created"
            assert {"input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                    "input_audio_buffer.committed", "conversation.item.input_audio_transcription.delta"} <= set(seen)
            assert not [t for t in seen if t.startswith("response.")]
            await conn.response.create()  # a transcription session makes no responses
            async for event in conn:
                assert not event.type.startswith("response."), event.type
                if event.type == "error":
                    assert event.error.code == "unsupported_event_type"
                    break
    finally:
        await hub.stop()


def wer(reference: str, hypothesis: str) -> float:
    import jiwer

    def norm(text: str) -> str:
        return " ".join("".join(c for c in text.lower() if c.isalnum() or c.isspace()).split())

    return jiwer.wer(norm(reference), norm(hypothesis))


REPLY = "The front center speaker works. Your sound system is ready for the evening."


async def telephone_turn(hub: Hub, fmt: dict, speech: bytes) -> tuple[str, np.ndarray]:
    """One push-to-talk turn with ``speech`` (wire bytes in ``fmt``): the user's transcript and the
    reply's audio as int16 at 16 kHz."""
    from realtime.audio_formats import bytes_to_pcm

    ws = await websockets.connect(url(hub))
    await until(ws, "session.created")
    await ws.send(json.dumps({"type": "session.update", "session": {"audio": {
        "input": {"format": fmt, "turn_detection": None}, "output": {"format": fmt}}}}))
    await until(ws, "session.updated")
    for i in range(0, len(speech), 8000):
        await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                  "audio": base64.b64encode(speech[i:i + 8000]).decode()}))
    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    done, seen = await until(ws, "response.done", timeout=120)
    assert done["response"]["status"] == "completed"
    heard = next(e["transcript"] for e in seen if e["type"].endswith("input_audio_transcription.completed"))
    raw = b"".join(base64.b64decode(e["delta"]) for e in seen if e["type"] == "response.output_audio.delta")
    await ws.close()
    pcm = bytes_to_pcm(raw, fmt["type"])
    return heard, soxr.resample(pcm, fmt.get("rate", 8000), 16000).astype(np.int16)


async def test_g711_telephone_turn_round_trip(transcriber):
    """A μ-law recording in, the turn answered, μ-law out: whisper reads the reply's words off the
    8 kHz μ-law audio within 5 points of word error rate of the 24 kHz 16-bit path's."""
    from realtime.audio_formats import pcm_to_bytes

    tts = real_tts_engines()
    hub = await serve("asr.partial_interval_ms=0", asr=transcriber, llm=FakeLLM(REPLY), tts=tts)
    try:
        pcm16 = await telephone_turn(hub, {"type": "audio/pcm", "rate": 24000},
                                     recording("Front_Center", 24000).astype("<i2").tobytes())
        ulaw = await telephone_turn(hub, {"type": "audio/pcmu"}, pcm_to_bytes(recording("Front_Center", 8000), "audio/pcmu"))
        for heard, _ in (pcm16, ulaw):
            assert "front" in heard.lower() and "center" in heard.lower(), heard
        loop = asyncio.get_running_loop()
        said = [await loop.run_in_executor(None, lambda a=audio: transcriber.transcribe(a, "en").text)
                for _, audio in (pcm16, ulaw)]
        errors = [wer(REPLY, text) for text in said]
        assert errors[1] <= errors[0] + 0.05, (errors, said)
        assert errors[0] <= 0.2, said  # the reply is the reply
    finally:
        await hub.stop()
