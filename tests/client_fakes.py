"""Shared by test_client.py and test_ptt.py: tiny ASR/LLM fakes and an in-process hub on port 0."""

from __future__ import annotations

import threading
import time

import numpy as np

from pipeline.engines import Engines
from pipeline.hub import Hub
from tts_engine.factory import create_engines
from base.config import load_config

PTT = {"audio": {"input": {"turn_detection": None}}}


class FakeTranscript:
    def __init__(self, text: str, language: str | None = "en") -> None:
        self.text = text
        self.language = language


class FakeASR:
    """Says ``text``; records how many 16 kHz samples each call got."""

    def __init__(self, text: str = "tell me about the weather") -> None:
        self.text = text
        self.samples: list[int] = []

    def transcribe(self, pcm, language=None):
        self.samples.append(len(pcm))
        return FakeTranscript(self.text)


class FakeLLM:
    """Streams a fixed reply, ``delay_s`` per token, stopping when ``cancel`` is set."""

    def __init__(self, reply: str = "It is sunny today. Take a hat with you.", delay_s: float = 0.005) -> None:
        self.tokens = [t if i == 0 else " " + t for i, t in enumerate(reply.split(" "))]
        self.reply = reply
        self.delay_s = delay_s
        self.seen: list[list[dict]] = []

    def stream(self, messages, cancel: threading.Event | None = None, max_tokens=None):
        self.seen.append(messages)
        for token in self.tokens:
            if cancel is not None and cancel.is_set():
                return
            time.sleep(self.delay_s)
            yield token


def real_tts_engines() -> list:
    """The real CPU TTS engines (load once per test module: a module-scoped fixture)."""
    return create_engines(load_config(None, [], environ={}))


async def start_hub(tts_engines, *overrides: str, asr=None, llm=None) -> Hub:
    cfg = load_config(None, ["server.port=0", "trace.path=none", *overrides], environ={})
    hub = Hub(cfg, Engines.from_parts(cfg, asr or FakeASR(), llm or FakeLLM(), tts_engines))
    await hub.start()
    return hub


def slow_link(monkeypatch, take) -> None:  # noqa: ANN001 - pytest's monkeypatch; an async callable
    """Hubs started after this send each client event only once ``await take()`` returns: a client
    on a link slower than its speech (``take`` sleeps) or one that reads nothing (``take`` never
    returns), without depending on how much the kernel's socket buffers hold."""
    write = Hub._write

    async def gated(self, ws, protocol, outbox, on_sent, sendable):  # noqa: ANN001, ANN202
        get = outbox.get

        async def taken():  # noqa: ANN202
            await take()
            return await get()

        outbox.get = taken
        await write(self, ws, protocol, outbox, on_sent, sendable)

    monkeypatch.setattr(Hub, "_write", gated)


def ws_url(hub: Hub) -> str:
    return f"ws://127.0.0.1:{hub.port}/v1/realtime"


def tone(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (8000 * np.sin(2 * np.pi * 220 * t)).astype(np.int16)
