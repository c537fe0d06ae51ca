"""semantic_vad through the WebSocket: the end-of-turn score decides when the turn ends, and speech
over a reply pauses it (resumed after a cough or "mm-hm", cancelled by words). Fakes stand in for
ASR, LLM and the end-of-turn model (this is orchestration); the TTS is the real CPU engine."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import numpy as np
import pytest

from client_fakes import FakeASR, FakeLLM, FakeTranscript, real_tts_engines, start_hub
from conftest import scaled
from rt import append, recv, speech_24k, until, user_text
from test_contract import CLAUSES, quiet, send_audio, session, types

pytestmark = pytest.mark.timeout(scaled(120))
SEMANTIC = {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "medium"}}}}
#: turn.score_early: the score asked at the 60 ms pause (with the speculative turn), the commit at 390 ms.
EARLY_SCORE = ("turn.pause_ms=390", "turn.asr_pause_ms=60", "turn.score_early=true")


class FakeTurnModel:
    """Scores every utterance ``probability``; records the length of each audio it saw."""

    def __init__(self, probability: float) -> None:
        self.probability = probability
        self.samples: list[int] = []
        self.lock = threading.Lock()

    def score(self, pcm):
        with self.lock:
            self.samples.append(len(pcm))
        return self.probability


@pytest.fixture(scope="module")
def tts_engines():
    return real_tts_engines()


async def _hub(tts_engines, turn, *overrides, asr=None, llm=None):
    from pipeline.engines import Engines
    from pipeline.hub import Hub
    from base.config import load_config

    cfg = load_config(None, ["server.port=0", "trace.path=none", "asr.partial_interval_ms=0", *overrides], environ={})
    hub = Hub(cfg, Engines.from_parts(cfg, asr or FakeASR(), llm or FakeLLM(), tts_engines, turn=turn))
    await hub.start()
    return hub


async def test_a_dangling_last_word_overrules_a_complete_score(tts_engines):
    """The model hears a finished voice, the transcript ends in "about": the turn waits half way
    to the longest silence (medium: 500 + 1500 / 2 ms after the speech), then answers."""
    hub = await _hub(tts_engines, FakeTurnModel(0.99), asr=FakeASR("tell me a joke about"))
    try:
        ws = await session(hub, SEMANTIC)
        await send_audio(ws, ("speech", 0.8), ("silence", 2.0))
        metrics, _ = await until(ws, "x.turn.metrics")
        stages = metrics["metrics"]["stages_ms"]
        assert 1100 < stages["vad_end"] - stages["speech_end"] < 1600, stages
        assert metrics["metrics"]["speculative"] is True  # the speculative turn was kept and released
        await ws.close()
    finally:
        await hub.stop()


async def test_a_complete_score_ends_the_turn_at_the_short_pause(tts_engines):
    turn = FakeTurnModel(0.99)
    hub = await _hub(tts_engines, turn)
    try:
        ws = await session(hub, SEMANTIC)
        await send_audio(ws, ("speech", 0.8), ("silence", 1.0))
        metrics, seen = await until(ws, "x.turn.metrics")
        stages = metrics["metrics"]["stages_ms"]
        # The turn ended ~200 ms after the speech (VAD pause + score), not at the 500 ms silence stop.
        assert stages["vad_end"] - stages["speech_end"] < 450, stages
        assert metrics["metrics"]["end_of_turn"] == 0.99 and metrics["metrics"]["speculative"] is True
        kinds = types(seen)
        assert kinds.count("input_audio_buffer.committed") == 1 and kinds.count("response.done") == 1
        assert kinds.index("input_audio_buffer.speech_stopped") < kinds.index("input_audio_buffer.committed")
        assert set(types(await quiet(ws))) <= set()  # the late VAD end makes no second turn
        await ws.close()
    finally:
        await hub.stop()


async def test_the_short_pause_is_configurable(tts_engines):
    """turn.pause_ms: the model scores (and the turn can end) only after that much silence."""
    turn = FakeTurnModel(0.99)
    hub = await _hub(tts_engines, turn, "turn.pause_ms=390")
    try:
        ws = await session(hub, SEMANTIC)
        await send_audio(ws, ("speech", 0.8), ("silence", 1.2))
        metrics, _ = await until(ws, "x.turn.metrics")
        stages = metrics["metrics"]["stages_ms"]
        assert 390 <= stages["vad_end"] - stages["speech_end"] < 900, stages
        assert len(turn.samples) == 1
        await ws.close()
    finally:
        await hub.stop()


async def test_an_earlier_asr_pause_starts_the_turn_before_the_score(tts_engines):
    """turn.asr_pause_ms: the speculative turn (ASR) starts at 60 ms of silence; the score (with
    turn.score_early off), and so the commit, still wait for turn.pause_ms, on the audio a pause of
    that length carries."""
    turn, asr = FakeTurnModel(0.99), FakeASR("what's the capital of France")
    hub = await _hub(tts_engines, turn, "turn.pause_ms=390", "turn.asr_pause_ms=60", "turn.score_early=false",
                     asr=asr)
    try:
        ws = await session(hub, SEMANTIC)
        await send_audio(ws, ("speech", 0.8), ("silence", 1.2))
        metrics, seen = await until(ws, "x.turn.metrics")
        stages = metrics["metrics"]["stages_ms"]
        assert 390 <= stages["vad_end"] - stages["speech_end"] < 900, stages
        assert stages["asr_start"] - stages["speech_end"] < 300, stages  # long before the score's pause
        assert len(asr.samples) == 1 and len(turn.samples) == 1  # one ASR run, kept at the commit
        # Both cut vad.TRAILING_MS (180) after the speech: the score's pause has all of it, the ASR's 60 ms.
        assert turn.samples[0] - asr.samples[0] == 16 * 120
        assert types(seen).count("input_audio_buffer.committed") == 1
        await ws.close()
    finally:
        await hub.stop()


async def test_an_early_score_is_asked_at_the_asr_pause_and_commits_at_the_score_pause(tts_engines):
    """turn.score_early: the score is asked with the speculative turn, on the audio its ASR got (60 ms
    of silence after the speech); complete, it is the only one, and the commit still waits for
    turn.pause_ms."""
    turn, asr = FakeTurnModel(0.99), FakeASR("what's the capital of France")
    hub = await _hub(tts_engines, turn, *EARLY_SCORE, asr=asr)
    try:
        ws = await session(hub, SEMANTIC)
        await send_audio(ws, ("speech", 0.8), ("silence", 1.2))
        metrics, seen = await until(ws, "x.turn.metrics")
        stages = metrics["metrics"]["stages_ms"]
        assert 390 <= stages["vad_end"] - stages["speech_end"] < 900, stages
        assert len(asr.samples) == 1 and turn.samples == asr.samples  # scored what the ASR heard
        assert metrics["metrics"]["end_of_turn"] == 0.99
        assert types(seen).count("input_audio_buffer.committed") == 1
        await ws.close()
    finally:
        await hub.stop()


async def test_an_early_score_hears_the_pause_audio_whatever_the_append_size(tts_engines):
    """Clients send audio in appends of any length (400 ms here): the early
    score gets the audio the VAD's pause carried (what its ASR gets), not the rest of the append."""
    turn, asr = FakeTurnModel(0.99), FakeASR("what's the capital of France")
    hub = await _hub(tts_engines, turn, *EARLY_SCORE, asr=asr)
    try:
        ws = await session(hub, SEMANTIC)
        pcm = np.concatenate((speech_24k(0.8), np.zeros(24000 * 12 // 10, np.int16)))
        step = 24000 * 400 // 1000
        for i in range(0, len(pcm), step):  # 400 ms appends: the pause comes inside one
            await ws.send(append(pcm[i:i + step]))
            await asyncio.sleep(0.4)
        await until(ws, "x.turn.metrics")
        assert len(asr.samples) == 1 and turn.samples == asr.samples, (turn.samples, asr.samples)
        await ws.close()
    finally:
        await hub.stop()


class SequenceTurnModel(FakeTurnModel):
    """Scores ``probabilities`` in turn (the last one from then on)."""

    def __init__(self, *probabilities: float) -> None:
        super().__init__(probabilities[-1])
        self.probabilities = probabilities

    def score(self, pcm):
        super().score(pcm)
        return self.probabilities[min(len(self.samples), len(self.probabilities)) - 1]


async def test_an_incomplete_early_score_is_asked_again_at_the_score_pause(tts_engines):
    """turn.score_early: an early score under complete (0.5: it would wait 1.5 s) is dropped; the
    score asked again at turn.pause_ms, on that pause's audio, decides (0.95: the turn ends then)."""
    turn, asr = SequenceTurnModel(0.5, 0.95), FakeASR("what's the capital of France")
    hub = await _hub(tts_engines, turn, *EARLY_SCORE, asr=asr)
    try:
        ws = await session(hub, SEMANTIC)
        await send_audio(ws, ("speech", 0.8), ("silence", 2.4))
        metrics, seen = await until(ws, "x.turn.metrics")
        stages = metrics["metrics"]["stages_ms"]
        assert 390 <= stages["vad_end"] - stages["speech_end"] < 900, stages  # not 1.5 s as 0.5 says
        assert len(asr.samples) == 1 and len(turn.samples) == 2
        assert turn.samples[0] == asr.samples[0]  # the early score: what the ASR heard
        assert turn.samples[1] - asr.samples[0] == 16 * 120  # the second: the longer pause's audio
        assert metrics["metrics"]["end_of_turn"] == 0.95
        assert types(seen).count("input_audio_buffer.committed") == 1
        await ws.close()
    finally:
        await hub.stop()


class SlowFirstTurnModel(FakeTurnModel):
    """Scores ``first`` after ``delay_s`` on its first call, ``probability`` at once after that."""

    def __init__(self, first: float, delay_s: float, probability: float) -> None:
        super().__init__(probability)
        self.first, self.delay_s = first, delay_s

    def score(self, pcm):
        if not self.samples:
            super().score(pcm)
            time.sleep(self.delay_s)
            return self.first
        return super().score(pcm)


async def test_an_early_score_of_a_pause_that_speech_went_on_from_is_ignored(tts_engines):
    """turn.score_early: the first pause's score (complete) comes back after the speech resumed and
    paused again (same utterance), past the second pause's turn.pause_ms: it is stale (committing on
    it would end the turn ~1 s after the speech); the second pause's scores (incomplete: early, then
    asked again) decide."""
    turn = SlowFirstTurnModel(0.99, 2.0, 0.05)
    hub = await _hub(tts_engines, turn, *EARLY_SCORE,
                     asr=FakeASR("what's the capital of France"))
    try:
        ws = await session(hub, SEMANTIC)
        await send_audio(ws, ("speech", 0.8), ("silence", 0.25), ("speech", 0.8), ("silence", 2.6))
        metrics, seen = await until(ws, "x.turn.metrics")
        stages = metrics["metrics"]["stages_ms"]
        assert len(turn.samples) == 3 and metrics["metrics"]["end_of_turn"] == 0.05
        assert stages["vad_end"] - stages["speech_end"] > 1500, stages  # waited as 0.05 says, not 0.99
        assert types(seen).count("input_audio_buffer.committed") == 1
        await ws.close()
    finally:
        await hub.stop()


async def test_an_incomplete_score_waits_through_a_long_pause(tts_engines):
    turn, asr = FakeTurnModel(0.05), FakeASR("book a table for four")
    hub = await _hub(tts_engines, turn, asr=asr)
    try:
        ws = await session(hub, SEMANTIC)
        # 800 ms of silence mid-sentence: longer than server_vad's 500 ms stop, shorter than 2000 ms.
        await send_audio(ws, ("speech", 0.8), ("silence", 0.8), ("speech", 0.8), ("silence", 2.4))
        _, seen = await until(ws, "response.done")
        kinds = types(seen)
        assert kinds.count("input_audio_buffer.committed") == 1, kinds
        assert len(turn.samples) == 4  # scored at both pauses, each early (turn.score_early) and again
        assert asr.samples[-1] > 16000 * 1.6  # the committed transcript heard both parts
        await ws.close()
    finally:
        await hub.stop()


async def _speak_over_reply(tts_engines, asr_text: str, burst: float):
    """A long reply plays; the user makes a sound of ``burst`` seconds that ASR hears as ``asr_text``."""
    llm = FakeLLM(" ".join(CLAUSES), delay_s=0.06)  # still being made when the burst is judged
    hub = await _hub(tts_engines, FakeTurnModel(0.99), "vad.barge_in_min_ms=250", asr=FakeASR(asr_text), llm=llm)
    ws = await session(hub, SEMANTIC)
    await _burst_over_reply(ws, "How is the weather?", ("speech", burst), ("silence", 1.2))
    return hub, ws, llm


async def _burst_over_reply(ws, text: str, *sound: tuple[str, float]) -> None:
    """Ask ``text``; once its reply's audio flows (300 ms reported played), send ``sound`` (``send_audio``'s parts)."""
    for m in user_text(text):
        await ws.send(m)
    seen = []
    while len([e for e in seen if e["type"] == "response.output_audio.delta"]) < 5:
        seen.append(await recv(ws))
    await ws.send(json.dumps({"type": "x.playback", "item_id": seen[-1]["item_id"], "audio_end_ms": 300}))
    await send_audio(ws, *sound)


async def test_a_short_burst_over_the_reply_pauses_then_resumes_it(tts_engines):
    hub, ws, _ = await _speak_over_reply(tts_engines, "", burst=0.15)
    try:
        done, seen = await until(ws, "response.done")
        kinds = types(seen)
        assert done["response"]["status"] == "completed", kinds
        paused = kinds.index("x.output_audio_buffer.paused")
        assert paused + 1 == kinds.index("input_audio_buffer.speech_started")  # paused first
        assert kinds.index("x.output_audio_buffer.resumed") > paused
        assert "input_audio_buffer.committed" not in kinds
        await ws.close()
    finally:
        await hub.stop()


@pytest.mark.parametrize(("heard", "resumed"), [("Mm-hmm.", True), ("[coughing]", True), ("Wait, stop.", False)])
async def test_the_words_of_speech_over_the_reply_decide(tts_engines, heard, resumed):
    hub, ws, llm = await _speak_over_reply(tts_engines, heard, burst=0.5)
    try:
        done, seen = await until(ws, "response.done")
        kinds = types(seen)
        assert "x.output_audio_buffer.paused" in kinds
        if resumed:
            assert done["response"]["status"] == "completed" and "x.output_audio_buffer.resumed" in kinds
            assert "input_audio_buffer.committed" not in kinds
        else:
            assert done["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
            assert "x.output_audio_buffer.resumed" not in kinds
            assert "x.output_audio_buffer.cleared" in kinds, kinds
            assert kinds.index("x.output_audio_buffer.cleared") < kinds.index("response.done")
            nxt, _ = await until(ws, "response.done")  # the interruption is a turn of its own
            assert nxt["response"]["status"] == "completed"
            assert llm.seen[-1][-1] == {"role": "user", "content": heard}
        await ws.close()
    finally:
        await hub.stop()


async def test_words_of_a_pause_that_speech_went_on_from_do_not_decide(tts_engines):
    """Speech over the reply pauses, goes on, pauses again: the slow transcript of the first pause
    ("Mm-hmm.") comes back after the second pause and must not decide; the words of the whole
    burst ("Wait, stop.") cancel the reply."""
    class SlowFirstASR(FakeASR):
        def transcribe(self, pcm, language=None):
            first = not self.samples
            self.samples.append(len(pcm))
            time.sleep(1.0 if first else 1.3)  # the first one back first, after the second pause
            return FakeTranscript("Mm-hmm." if first else "Wait, stop.")

    llm = FakeLLM(" ".join(CLAUSES), delay_s=0.2)  # still being made when the slow words decide
    asr = SlowFirstASR()
    hub = await _hub(tts_engines, FakeTurnModel(0.99), "vad.barge_in_min_ms=250", "turn.pause_max_speech_ms=3000",
                     asr=asr, llm=llm)
    try:
        ws = await session(hub, SEMANTIC)
        await _burst_over_reply(ws, "How is the weather?", ("speech", 0.4), ("silence", 0.3), ("speech", 0.4),
                                ("silence", 1.5))
        done, seen = await until(ws, "response.done")
        kinds = types(seen)
        assert len(asr.samples) >= 2  # both pauses were transcribed
        assert done["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}, kinds
        assert "x.output_audio_buffer.resumed" not in kinds
        await until(ws, "response.done")  # the interruption is a turn of its own, with its words
        assert llm.seen[-1][-1] == {"role": "user", "content": "Wait, stop."}
        await ws.close()
    finally:
        await hub.stop()


async def test_server_vad_still_cancels_at_once(tts_engines):
    hub = await start_hub(tts_engines, "vad.barge_in_min_ms=150", "asr.partial_interval_ms=0",
                          llm=FakeLLM(" ".join(CLAUSES), delay_s=0.02))
    try:
        ws = await session(hub)
        for m in user_text("How is the weather?"):
            await ws.send(m)
        await until(ws, "response.output_audio.delta")
        await send_audio(ws, ("speech", 0.6), ("silence", 0.8))
        done, seen = await until(ws, "response.done")
        assert done["response"]["status"] == "cancelled"
        assert "x.output_audio_buffer.paused" not in types(seen)
        await ws.close()
    finally:
        await hub.stop()


async def test_after_speech_over_a_fresh_reply_a_cough_still_pauses(tts_engines):
    """A turn ends at a pause, the user goes on over the new reply (paused, then cancelled by the
    words); a cough over a later reply must still pause it, not cut it."""
    class Words(FakeASR):  # the long first part is a question, the shorter bursts are what `later` says
        later = "and then some more"

        def transcribe(self, pcm, language=None):
            self.samples.append(len(pcm))
            return FakeTranscript("How long does it take?" if len(pcm) > 16000 * 1.4 else self.later)

    asr = Words()
    hub = await _hub(tts_engines, FakeTurnModel(0.99), "vad.barge_in_min_ms=250", asr=asr,
                     llm=FakeLLM(" ".join(CLAUSES), delay_s=0.06))
    try:
        ws = await session(hub, SEMANTIC)
        await send_audio(ws, ("speech", 1.8), ("silence", 0.5), ("speech", 0.9), ("silence", 2.5))
        _, seen = await until(ws, "response.done")
        assert "x.output_audio_buffer.paused" in types(seen)  # the second part paused the first reply
        await until(ws, "response.done")  # ... and was a turn of its own
        asr.later = ""  # the cough has no words
        await _burst_over_reply(ws, "Tell me about the sea.", ("speech", 0.3), ("silence", 1.2))
        done, seen = await until(ws, "response.done")
        kinds = types(seen)
        assert done["response"]["status"] == "completed", kinds
        assert "x.output_audio_buffer.paused" in kinds and "x.output_audio_buffer.resumed" in kinds
        await ws.close()
    finally:
        await hub.stop()
