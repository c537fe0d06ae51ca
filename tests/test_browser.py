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

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(scaled(240))]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WAV_RATE = 48000  # Hz; Chromium's fake capture device runs at 48 kHz
FIRST = "Please tell me a long story about a brave knight and a dragon."
SECOND = "Stop. What is the capital of France?"
INSTRUCTIONS = "You are a storyteller. Tell long, detailed stories of at least ten sentences."


def fake_microphone_wav(cfg, path: Path) -> dict[str, float]:
    """Write the scripted user's audio; returns when each question starts and ends (s)."""
    from piper_speech import RATE, PiperSpeech
    from voxloop.ptt import write_wav

    speech = PiperSpeech(cfg)
    gap = lambda s: np.zeros(int(RATE * s), np.int16)  # noqa: E731
    first, second = speech.say(FIRST), speech.say(SECOND)
    parts = [gap(0.5), first, gap(5.0), second, gap(15.0)]  # Chromium loops the file: long tail
    pcm = soxr.resample(np.concatenate(parts), RATE, WAV_RATE)
    write_wav(path, pcm, WAV_RATE)
    first_end = 0.5 + len(first) / RATE
    return {"first_end": first_end, "second_start": first_end + 5.0}


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


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (apt-get install chromium)")
async def test_browser_conversation_with_barge_in(cfg, tmp_path):
    playwright = pytest.importorskip("playwright.async_api", reason="playwright (dev extra) is not installed")
    from pipeline.engines import Engines
    from pipeline.hub import Hub

    wav = tmp_path / "user.wav"
    fake_microphone_wav(cfg, wav)
    cfg = cfg.replace("server", port=0).replace("trace", path=None)
    engines = Engines(cfg)
    await engines.load()
    hub = Hub(cfg, engines)
    await hub.start()
    problems: list[str] = []
    try:
        async with playwright.async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=chromium_args(wav), headless=True)
            page = await browser.new_page(viewport={"width": 420, "height": 860})  # phone width
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
            await page.goto(f"http://127.0.0.1:{hub.port}/")
            await wait_for(page, "window.voxloop && window.voxloop.connected", 20)
            await page.click(".settings summary")  # a long reply, so there is something to talk over
            await page.fill("textarea[name=instructions]", INSTRUCTIONS)
            await page.click("#settings button[type=submit]")
            await wait_for(page, f"window.voxloop.session.instructions === {json.dumps(INSTRUCTIONS)}", 10)
            await page.click("#start")
            await wait_for(page, "window.voxloop.started", 10)

            users = await wait_for(page, "window.voxloop.userTranscripts.length && window.voxloop.userTranscripts", 30)
            assert {"story", "dragon"} <= set(users[0].lower().replace(".", " ").split()), users  # "knight" may be "night"
            await wait_for(page, "window.voxloop.audioMsPlayed > 800", 30)
            counters = await page.evaluate("window.voxloop")
            assert counters["audioChunksReceived"] > 10
            assert counters["queueMs"] > 0, json.dumps(counters)  # the story arrives faster than it plays
            await page.screenshot(path=str(tmp_path / "screenshot.png"))
            if os.environ.get("VOXLOOP_SCREENSHOT"):
                shutil.copy(tmp_path / "screenshot.png", os.environ["VOXLOOP_SCREENSHOT"])

            # The second question is spoken over the story: playback stops at once.
            barge = await wait_for(page, "window.voxloop.bargeIns > 0 && window.voxloop.lastBargeIn", 30)
            assert barge["queueMsBefore"] > 200 and barge["playedMs"] > 0
            assert barge["queueMsAfter"] == 0
            users = await wait_for(page, "window.voxloop.userTranscripts.length >= 2 && window.voxloop.userTranscripts", 30)
            assert "capital" in users[1].lower() and "france" in users[1].lower()
            await wait_for(page, "window.voxloop.turnMetrics.length >= 2", 60)
            counters = await page.evaluate("window.voxloop")
            await browser.close()
    finally:
        await hub.stop()
    assert not problems, problems
    assert len(counters["assistantTranscripts"]) >= 2
    assert counters["audioChunksDropped"] >= 0 and counters["errors"] == [], json.dumps(counters)
    metrics = counters["turnMetrics"][0]
    assert metrics["stages_ms"]["first_audio_sent"] > 0
