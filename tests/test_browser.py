"""The browser client (web_client/) in headless Chromium against the real models.

Chromium's fake microphone plays a WAV (speech from the bundled Piper voice): a request
for a long story, a pause while the reply plays, then a new question spoken over it.
The test reads the page's counters (``window.voxloop``): the user's words were
transcribed, assistant audio arrived and played, and talking over the reply emptied the
playback queue at once (barge-in). A screenshot is saved mid-conversation.

Needs Debian's ``chromium`` (scripts/system-deps.sh) and Playwright from PyPI; never
``playwright install``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import soxr

from conftest import scaled

pytestmark = [pytest.mark.browser, pytest.mark.timeout(scaled(240))]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WAV_RATE = 48000  # Hz; Chromium's fake capture device runs at 48 kHz
FIRST = "Please tell me a long story about a brave knight and a dragon."
SECOND = "Stop. What is the capital of France?"
INSTRUCTIONS = "You are a storyteller. Tell long, detailed stories of at least ten sentences."


def fake_microphone_wav(cfg, path: Path) -> dict[str, float]:
    """Write the scripted user's audio; returns when each question starts and ends (s)."""
    from bench.piper_speech import RATE, PiperSpeech
    from base.wav import write_wav

    speech = PiperSpeech(cfg)
    gap = lambda s: np.zeros(int(RATE * s), np.int16)  # noqa: E731
    first, second = speech.say(FIRST), speech.say(SECOND)
    # The pause is the reply's budget to start and be heard before the second question talks
    # over it: end of speech, ASR, the first clause from the LLM and TTS, > 0.8 s of playback,
    # then audio queued ahead of playback. On a 2-core machine at load average 9-14 the first
    # audio came 4.4-5.3 s after the end of speech: a 5 s pause let the second question cancel
    # a reply that had sent no audio yet. The story is far longer than the pause.
    pause_s = scaled(10.0)
    parts = [gap(0.5), first, gap(pause_s), second, gap(15.0)]  # Chromium loops the file: long tail
    pcm = soxr.resample(np.concatenate(parts), RATE, WAV_RATE)
    write_wav(path, pcm, WAV_RATE)
    first_end = 0.5 + len(first) / RATE
    return {"first_end": first_end, "second_start": first_end + pause_s}


def chromium_args(wav: Path) -> list[str]:
    return ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--autoplay-policy=no-user-gesture-required", "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={wav}"]


async def wait_for(page, expression: str, timeout_s: float) -> object:
    """Poll a JS expression on the page until it is truthy; returns its value."""
    deadline = time.monotonic() + scaled(timeout_s)
    while True:
        value = await page.evaluate(expression)
        if value:
            return value
        if time.monotonic() > deadline:
            state = await page.evaluate("JSON.stringify(window.voxloop)")
            raise AssertionError(f"timed out waiting for {expression}; window.voxloop = {state}")
        await page.wait_for_timeout(100)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (apt-get install chromium)")
async def test_browser_conversation_with_barge_in(cfg, tmp_path):
    playwright = pytest.importorskip("playwright.async_api", reason="playwright (dev extra) is not installed")
    wav = tmp_path / "user.wav"
    fake_microphone_wav(cfg, wav)
    hub = await real_hub(cfg)
    try:
        async with playwright.async_playwright() as p:
            browser, page, problems = await open_page(p, wav, hub.port, viewport={"width": 420, "height": 860})  # phone width
            await tell_long_stories(page)  # a long reply, so there is something to talk over
            await page.click("#start")
            await wait_for(page, "window.voxloop.started", 10)

            users = await wait_for(page, "window.voxloop.userTranscripts.length && window.voxloop.userTranscripts", 30)
            assert {"story", "dragon"} <= set(users[0].lower().replace(".", " ").split()), users  # "knight" may be "night"
            await wait_for(page, "window.voxloop.audioMsPlayed > 800", 30)
            counters = await page.evaluate("window.voxloop")
            assert counters["audioChunksReceived"] > 10
            assert counters["audioMsReceived"] >= counters["audioMsPlayed"] > 800, json.dumps(counters)

            # The second question is spoken over the story: playback stops at once.
            barge = await wait_for(page, "window.voxloop.bargeIns > 0 && window.voxloop.lastBargeIn", 30)
            assert barge["queueMsBefore"] > 200 and barge["playedMs"] > 0, barge  # it was talking
            assert barge["queueMsAfter"] == 0
            users = await wait_for(page, "window.voxloop.userTranscripts.length >= 2 && window.voxloop.userTranscripts", 30)
            assert "capital" in users[1].lower() and "france" in users[1].lower()
            # 0.5 s into the answer to the second question: a screenshot.
            await wait_for(page, f"window.voxloop.audioMsPlayed > {barge['playedMs'] + 500}", 30)
            await page.screenshot(path=str(tmp_path / "screenshot.png"))
            if os.environ.get("VOXLOOP_SCREENSHOT"):  # where to keep a copy (docs/screenshot.png)
                shutil.copy(tmp_path / "screenshot.png", os.environ["VOXLOOP_SCREENSHOT"])
            await wait_for(page, "window.voxloop.turnMetrics.length >= 2", 60)
            counters = await page.evaluate("window.voxloop")
            await browser.close()
    finally:
        await hub.stop()
    assert not problems, problems
    assert len(counters["assistantTranscripts"]) >= 2
    # (audioChunksDropped, the stale deltas of the interrupted reply, may be 0 or more: timing.)
    assert counters["errors"] == [], json.dumps(counters)
    metrics = counters["turnMetrics"][0]
    assert metrics["stages_ms"]["first_audio_sent"] > 0


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (apt-get install chromium)")
async def test_browser_smart_turn_a_cough_pauses_and_resumes_the_reply(cfg, tmp_path):
    """semantic_vad: a cough-like burst over the story pauses its playback, then it plays on."""
    playwright = pytest.importorskip("playwright.async_api", reason="playwright (dev extra) is not installed")
    from bench.turn_set import cough
    from bench.piper_speech import RATE, PiperSpeech
    from base.wav import write_wav

    gap = lambda s: np.zeros(int(RATE * s), np.int16)  # noqa: E731
    parts = [gap(0.5), PiperSpeech(cfg).say(FIRST), gap(6.0), cough(3, ms=300), gap(30.0)]
    wav = tmp_path / "user.wav"
    write_wav(wav, soxr.resample(np.concatenate(parts), RATE, WAV_RATE), WAV_RATE)
    hub = await real_hub(cfg)
    try:
        async with playwright.async_playwright() as p:
            browser, page, problems = await open_page(p, wav, hub.port)
            await tell_long_stories(page)
            await page.check("input[name=mode][value=semantic]")
            await wait_for(page, "window.voxloop.session.audio.input.turn_detection.type === 'semantic_vad'", 10)
            await page.click("#start")
            await wait_for(page, "window.voxloop.started", 10)
            await wait_for(page, "window.voxloop.pauses > 0", 45)
            await wait_for(page, "window.voxloop.resumes > 0", 10)
            played = await page.evaluate("window.voxloop.audioMsPlayed")
            await wait_for(page, f"window.voxloop.audioMsPlayed > {played + 1000}", 20)  # it plays on
            counters = await page.evaluate("window.voxloop")
            await browser.close()
    finally:
        await hub.stop()
    assert not problems, problems
    assert counters["bargeIns"] == 0 and counters["errors"] == [], json.dumps(counters)
    assert len(counters["userTranscripts"]) == 1  # the cough made no turn


async def real_hub(cfg):  # noqa: ANN001, ANN201 - a started Hub
    """A started server with the real models on a free port (the caller stops it)."""
    from pipeline.engines import Engines
    from pipeline.hub import Hub

    cfg = cfg.replace("server", port=0).replace("trace", path=None)
    engines = Engines(cfg)
    await engines.load()
    hub = Hub(cfg, engines)
    await hub.start()
    return hub


async def tell_long_stories(page) -> None:  # noqa: ANN001
    """Set the storyteller instructions through the page's settings form."""
    await page.click(".settings summary")
    await page.fill("textarea[name=instructions]", INSTRUCTIONS)
    await page.click("#settings button[type=submit]")
    await wait_for(page, f"window.voxloop.session.instructions === {json.dumps(INSTRUCTIONS)}", 10)


async def launch(p, wav: Path, viewport: dict | None = None):
    """Chromium with ``wav`` as its microphone; (browser, page, the page's errors so far)."""
    browser = await p.chromium.launch(executable_path=CHROMIUM, args=chromium_args(wav), headless=True)
    page = await browser.new_page(**({"viewport": viewport} if viewport else {}))
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
    return browser, page, problems


async def open_page(p, wav: Path, port: int, viewport: dict | None = None):
    """``launch``, then the server's page, connected."""
    browser, page, problems = await launch(p, wav, viewport)
    await page.goto(f"http://127.0.0.1:{port}/")
    await wait_for(page, "window.voxloop && window.voxloop.connected", 20)
    return browser, page, problems


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (apt-get install chromium)")
async def test_browser_hold_space_to_talk(cfg, tmp_path):
    """Push-to-talk: hold the space bar while the fake microphone speaks, release to send."""
    playwright = pytest.importorskip("playwright.async_api", reason="playwright (dev extra) is not installed")
    wav = tmp_path / "user.wav"
    times = fake_microphone_wav(cfg, wav)
    hub = await real_hub(cfg)
    try:
        async with playwright.async_playwright() as p:
            browser, page, problems = await open_page(p, wav, hub.port)
            await page.check("input[name=mode][value=ptt]")
            await wait_for(page, "window.voxloop.session.audio.input.turn_detection === null", 10)
            await page.click("#start")
            await wait_for(page, "window.voxloop.started && !document.getElementById('talk').disabled", 10)
            await page.keyboard.down("Space")  # the microphone file starts with the first question
            await page.wait_for_timeout(1000 * (times["first_end"] + 0.3))
            await page.keyboard.up("Space")
            users = await wait_for(page, "window.voxloop.userTranscripts.length && window.voxloop.userTranscripts", 30)
            await wait_for(page, "window.voxloop.turnMetrics.length >= 1", 60)
            counters = await page.evaluate("window.voxloop")
            started = await page.evaluate("window.voxloop.started")
            await browser.close()
    finally:
        await hub.stop()
    assert not problems, problems
    assert "dragon" in users[0].lower()
    assert started  # the space bar did not click the focused Start button
    assert counters["turnMetrics"][0]["mode"] == "push_to_talk" and counters["audioChunksReceived"] > 0


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (apt-get install chromium)")
async def test_browser_explains_a_full_server_and_reconnects(tmp_path):
    """Fake ASR/LLM: only the connection logic runs. The one session slot is taken, so the
    page's WebSocket is refused (503); it says why (from /ready) and connects once free."""
    playwright = pytest.importorskip("playwright.async_api", reason="playwright (dev extra) is not installed")
    from client_fakes import real_tts_engines, start_hub
    from voxloop.client import RealtimeClient

    hub = await start_hub(real_tts_engines(), "limits.max_sessions=1", "limits.retry_after_s=1")
    try:
        holder = await RealtimeClient.connect(f"ws://127.0.0.1:{hub.port}/v1/realtime")
        async with playwright.async_playwright() as p:
            browser, page, problems = await launch(p, tmp_path / "none.wav")
            await page.goto(f"http://127.0.0.1:{hub.port}/")
            status = await wait_for(page, "window.voxloop.state === 'retrying' && "
                                          "document.getElementById('status').textContent", 10)
            assert "server is full" in status
            await holder.close()
            await wait_for(page, "window.voxloop.connected", 20)
            assert await page.evaluate("window.voxloop.session.x_binary_audio") is True
            await browser.close()
    finally:
        await hub.stop()
    # Chromium logs the refused handshake itself; nothing else may fail.
    assert all("503" in m or "WebSocket connection" in m for m in problems), problems


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (apt-get install chromium)")
async def test_browser_says_when_the_microphone_is_denied(tmp_path):
    """Without --use-fake-ui-for-media-stream, headless Chromium denies the microphone."""
    playwright = pytest.importorskip("playwright.async_api", reason="playwright (dev extra) is not installed")
    from client_fakes import real_tts_engines, start_hub

    hub = await start_hub(real_tts_engines())
    try:
        async with playwright.async_playwright() as p:
            args = [a for a in chromium_args(tmp_path / "none.wav") if "fake-ui" not in a]
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
            page = await browser.new_page()
            await page.goto(f"http://127.0.0.1:{hub.port}/")
            await wait_for(page, "window.voxloop.connected", 10)
            await page.click("#start")
            notice = await wait_for(page, "!document.getElementById('notice').hidden && "
                                          "document.getElementById('notice').textContent", 10)
            started = await page.evaluate("window.voxloop.started")
            label = await page.text_content("#start")
            await browser.close()
    finally:
        await hub.stop()
    assert "Microphone access was denied" in notice
    assert not started and label == "Start"  # ready to try again


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (apt-get install chromium)")
async def test_browser_demo_tool_is_called_and_shown(tmp_path):
    """The demo tool (local time) is off until chosen in Settings; then a reply's call of it runs in
    the page, its result goes back and shows under the call in the transcript, and the answer
    follows. Push-to-talk with a fake ASR and a scripted LLM (orchestration; real TTS)."""
    playwright = pytest.importorskip("playwright.async_api", reason="playwright (dev extra) is not installed")
    from client_fakes import FakeASR, real_tts_engines, start_hub
    from llm.replies import ToolCallDelta
    from rt import speech_24k
    from test_tool_calls import ScriptedLLM
    from base.wav import write_wav

    wav = tmp_path / "user.wav"
    write_wav(wav, soxr.resample(np.concatenate([speech_24k(1.5), np.zeros(24000 * 20, np.int16)]), 24000,
                                 WAV_RATE).astype(np.int16), WAV_RATE)
    llm = ScriptedLLM([ToolCallDelta(0, "{}", "call_1", "get_local_time")], answer="It is time for tea.")
    hub = await start_hub(real_tts_engines(), asr=FakeASR("what time is it"), llm=llm)
    try:
        async with playwright.async_playwright() as p:
            browser, page, problems = await open_page(p, wav, hub.port)
            assert await page.evaluate("window.voxloop.session.tools.length") == 0  # off by default
            await page.click("details.settings summary")
            await page.check("input[name=demoTool]")
            await page.click("#settings button[type=submit]")
            await wait_for(page, "window.voxloop.session.tools.length === 1", 10)
            await page.check("input[name=mode][value=ptt]")
            await page.click("#start")
            await wait_for(page, "window.voxloop.started && !document.getElementById('talk').disabled", 10)
            await page.keyboard.down("Space")
            await page.wait_for_timeout(1700)
            await page.keyboard.up("Space")
            [call] = await wait_for(page, "window.voxloop.toolCalls.length && window.voxloop.toolCalls", 30)
            await wait_for(page, "window.voxloop.turnMetrics.length >= 2", 30)
            bubble = await page.text_content(".bubble.call")
            answer = await page.evaluate("[...document.querySelectorAll('.bubble.assistant .text')]"
                                         ".map((e) => e.textContent)")
            await browser.close()
    finally:
        await hub.stop()
    assert not problems, problems
    assert call["name"] == "get_local_time" and json.loads(call["output"])["time_zone"]
    assert "get_local_time({})" in bubble and "→ {" in bubble
    assert answer == ["It is time for tea."]  # the reply that only called has no bubble of its own
    assert llm.seen[1]["messages"][-1]["content"] == call["output"]
