"""A TTS-only server (``server.stages = ["tts"]``): real onnx voice, real WebSocket on port 0.

It serves ``x.tts.speak``; audio input and ``response.create`` get an
``unsupported_event_type`` error naming ``server.stages``; faster-whisper and llama.cpp
are never imported (the GPU box has neither).
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import websockets

from conftest import scaled
from rt import append, http_get, recv, until, url, user_text
from pipeline.engines import Engines
from pipeline.hub import Hub
from base.config import load_config
from base.errors import ConfigError

pytestmark = pytest.mark.timeout(scaled(120))
ROOT = Path(__file__).resolve().parent.parent


def tts_only_config(*overrides: str):
    return load_config(
        None,
        ["server.port=0", "trace.path=none", "server.stages=tts", *overrides],
        environ={},
    )


async def start_tts_only_hub() -> Hub:
    """As ``voxloop serve`` does: the hub answers at once, models load behind it."""
    cfg = tts_only_config()
    engines = Engines(cfg)
    hub = Hub(cfg, engines)
    await hub.start()
    status, body, _ = await asyncio.to_thread(http_get, hub, "/ready")
    assert status == 503 and "loading" in body
    await engines.load()
    return hub


async def speak(ws, request_id: str, text: str) -> tuple[dict, int]:
    """Send ``x.tts.speak``; returns its ``x.tts.done`` and the samples of audio received."""
    await ws.send(
        json.dumps({"type": "x.tts.speak", "request_id": request_id, "text": text})
    )
    samples = 0
    while True:
        m = await recv(ws, 30)
        if m["type"] == "x.tts.audio.delta" and m["request_id"] == request_id:
            samples += len(base64.b64decode(m["delta"])) // 2
        elif m["type"] == "x.tts.done" and m["request_id"] == request_id:
            return m, samples
        elif m["type"] == "error":
            raise AssertionError(f"unexpected error: {m}")


def assert_needs_stage(err: dict, stage: str, event_id: str | None = None) -> None:
    e = err["error"]
    assert err["type"] == "error" and e["type"] == "invalid_request_error"
    assert e["code"] == "unsupported_event_type"
    assert "server.stages" in e["message"] and f"({stage})" in e["message"], e[
        "message"
    ]
    assert e["event_id"] == event_id


def test_stages_config_is_validated():
    assert load_config(None, [], environ={}).server.stages == ("asr", "llm", "tts")
    assert tts_only_config().server.stages == ("tts",)
    assert load_config(
        None, [], environ={"VOXLOOP_SERVER__STAGES": "llm,tts"}
    ).server.stages == ("llm", "tts")
    with pytest.raises(ConfigError, match="'llm' needs 'tts'"):
        load_config(None, ["server.stages=asr,llm"], environ={})
    assert load_config(None, ["server.stages=asr"], environ={}).server.stages == ("asr",)  # transcription only
    with pytest.raises(ConfigError, match=r"unknown stage\(s\) \['vad'\]"):
        load_config(None, ["server.stages=vad,tts"], environ={})


async def test_tts_only_server_speaks_and_refuses_audio_input():
    hub = await start_tts_only_hub()
    try:
        assert (
            hub.engines.asr is None
            and hub.engines.llm is None
            and hub.engines.tts is not None
        )
        status, body, _ = await asyncio.to_thread(http_get, hub, "/ready")
        assert status == 200 and "session slots free" in body
        async with websockets.connect(url(hub)) as ws:
            assert (await recv(ws))["type"] == "session.created"
            await ws.send(
                json.dumps(
                    {
                        "type": "session.update",
                        "event_id": "c_1",
                        "session": {"type": "realtime", "instructions": "Be brief."},
                    }
                )
            )
            assert (await until(ws, "session.updated"))[0]["session"][
                "instructions"
            ] == "Be brief."

            t0 = time.monotonic()
            done, samples = await speak(
                ws, "r1", "The server speaks without a language model."
            )
            elapsed_ms = 1000 * (time.monotonic() - t0)
            assert done["status"] == "completed" and samples > 24000  # > 1 s at 24 kHz
            assert abs(done["audio_ms"] - samples / 24) < 2
            # the server's share of the first audio: inside the request's lifetime
            assert 0 < done["first_audio_ms"] < elapsed_ms

            speech = (np.sin(np.arange(4800) / 5) * 8000).astype(np.int16)
            append_event = json.loads(append(speech)) | {"event_id": "c_2"}
            await ws.send(json.dumps(append_event))
            assert_needs_stage(await recv(ws), "asr", "c_2")
            await ws.send(
                json.dumps({"type": "input_audio_buffer.commit", "event_id": "c_3"})
            )
            assert_needs_stage(await recv(ws), "asr", "c_3")
            item_create, response_create = user_text("hello?")
            await ws.send(item_create)  # needs no model: accepted
            assert (await until(ws, "conversation.item.done"))[0]["item"][
                "role"
            ] == "user"
            await ws.send(response_create)
            err = await recv(ws)
            assert_needs_stage(err, "llm")
            assert (
                "(asr)" not in err["error"]["message"]
            )  # response.create needs only the LLM

            # Binary audio frames are audio input too.
            await ws.send(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {"type": "realtime", "x_binary_audio": True},
                    }
                )
            )
            await until(ws, "session.updated")
            await ws.send(speech.tobytes())
            assert_needs_stage(await recv(ws), "asr")

            # The session goes on: nothing else was sent, and speaking still works.
            with pytest.raises(TimeoutError):
                await recv(ws, 0.3)
            await ws.send(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {"type": "realtime", "x_binary_audio": False},
                    }
                )
            )
            await until(ws, "session.updated")
            done, samples = await speak(ws, "r2", "Still here.")
            assert done["status"] == "completed" and samples > 0
        status, body, _ = await asyncio.to_thread(http_get, hub, "/metrics")
        assert 'voxloop_errors_total{code="unsupported_event_type"} 4.0' in body
    finally:
        await hub.stop()


async def test_load_bench_clients_speak_to_a_tts_only_server():
    """``bench.ws_clients`` (the served rows of ``bench.tts_load --mode ws``), from a client process
    of its own: every sentence completed, its base64 audio decoded (pybase64, validating) and
    counted as seconds of audio, and the server's share of first audio inside the client's."""
    from bench.ws_clients import CLIENT_DECODER, run_load

    hub = await start_tts_only_hub()
    try:
        row = await asyncio.to_thread(run_load, url(hub), 2, 3.0, 0.5, "json", 24000, 1)
    finally:
        await hub.stop()
    assert row["errors"] == 0, row["error_examples"]
    assert row["requests"] >= 2 and row["qps"] > 0
    assert (row["client_processes"], row["client_decoder"]) == (1, CLIENT_DECODER)
    # bench/tts_sentences.json: 40 sentences of ~4 s at the bundled voice's pace
    assert 1.0 < row["audio_s_per_request"] < 10.0
    assert 0 < row["server_first_audio_p50_ms"] <= row["first_audio_p50_ms"] <= row["latency_p50_ms"]


async def test_text_chat_server_without_asr():
    """``["llm", "tts"]``: text turns are answered; audio input names only the missing ASR."""
    from client_fakes import FakeLLM, real_tts_engines

    cfg = load_config(
        None, ["server.port=0", "trace.path=none", "server.stages=llm,tts"], environ={}
    )
    engines = Engines.from_parts(cfg, None, FakeLLM("Hello there."), real_tts_engines())
    hub = Hub(cfg, engines)
    await hub.start()
    try:
        assert (await asyncio.to_thread(http_get, hub, "/ready"))[0] == 200
        async with websockets.connect(url(hub)) as ws:
            await recv(ws)
            for m in user_text("hi"):
                await ws.send(m)
            assert (await until(ws, "response.done"))[0]["response"][
                "status"
            ] == "completed"
            await ws.send(append(np.zeros(480, np.int16)))
            err, _ = await until(ws, "error")  # after the turn's x.turn.metrics
            assert_needs_stage(err, "asr")
            assert "(llm)" not in err["error"]["message"]
    finally:
        await hub.stop()


_NO_ASR_LLM = """
import json, sys

BLOCKED = ("faster_whisper", "llama_cpp", "ctranslate2")
attempts = []


class Absent:
    '''Makes the blocked packages look uninstalled, as on the GPU box, and records who asked.'''

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            attempts.append(name)
            raise ImportError(f"{name} is not installed here")
        return None


sys.meta_path.insert(0, Absent())
import pipeline.hub, pipeline.session, voxloop.cli  # noqa: E401
from pipeline.engines import Engines
from base.config import load_config

voxloop.cli.build_parser()  # imports every subcommand module, as `python -m voxloop serve` does
engines = Engines(load_config(None, ["server.stages=tts", "trace.path=none"], environ={}))
engines.load_sync()
loaded = [m for m in sys.modules if m.split(".")[0] in BLOCKED]
report = {"loaded": engines.loaded, "asr": engines.asr is not None, "llm": engines.llm is not None,
          "attempts": list(attempts), "modules": loaded}
try:
    import faster_whisper  # noqa: F401
    report["blocker_works"] = False
except ImportError:
    report["blocker_works"] = True
engines.close()
print(json.dumps(report))
"""


def test_tts_only_never_imports_faster_whisper_or_llama_cpp():
    proc = subprocess.run(
        [sys.executable, "-c", _NO_ASR_LLM],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {
        "loaded": True,
        "asr": False,
        "llm": False,
        "attempts": [],
        "modules": [],
        "blocker_works": True,
    }
