"""Through the WebSocket: a split turn mended (one user message, one answer to the whole), an
interruption answered as fast as a fresh turn, and the words' end-of-turn score of the real
bundled LLM holding a head the sound calls complete. ASR and the end-of-turn audio model are
fakes (orchestration); the TTS is the real CPU engine, and so is the LLM where its words count."""

from __future__ import annotations

import pytest

from client_fakes import FakeASR, FakeLLM, FakeTranscript, real_tts_engines
from conftest import scaled
from rt import recv, until
from test_contract import CLAUSES, send_audio, session, types
from test_semantic_vad import SEMANTIC, FakeTurnModel, _burst_over_reply, _hub

pytestmark = pytest.mark.timeout(scaled(180))


@pytest.fixture(scope="module")
def tts_engines():
    return real_tts_engines()


class ByLength(FakeASR):
    """Hears ``long`` in audio over ``seconds`` (16 kHz samples), else ``short``."""

    def __init__(self, short: str, long: str, seconds: float) -> None:
        super().__init__(short)
        self.long, self.seconds = long, seconds

    def transcribe(self, pcm, language=None):
        self.samples.append(len(pcm))
        return FakeTranscript(self.long if len(pcm) > 16000 * self.seconds else self.text)


async def test_a_split_forced_by_a_long_pause_is_mended(tts_engines):
    """"How long does it take" [1.5 s] "to boil an egg?": the first part is answered at its pause
    (the sound says complete), the second starts over that reply: the reply is cut, the first
    user item deleted, and the whole (both parts' audio, transcribed at once) is one user message
    with one answer."""
    class Parts(FakeASR):  # by length: the second part alone, the first, both
        def transcribe(self, pcm, language=None):
            self.samples.append(len(pcm))
            seconds = len(pcm) / 16000
            return FakeTranscript("to boil an egg" if seconds < 1.1 else "How long does it take?" if seconds < 2.0
                                  else "How long does it take to boil an egg?")

    asr = Parts()
    llm = FakeLLM(" ".join(CLAUSES), delay_s=0.06)
    hub = await _hub(tts_engines, FakeTurnModel(0.99), "vad.barge_in_min_ms=250", asr=asr, llm=llm)
    try:
        ws = await session(hub, SEMANTIC)
        await send_audio(ws, ("speech", 1.4), ("silence", 1.5), ("speech", 0.5), ("silence", 2.5))
        first, seen = await until(ws, "response.done")
        assert first["response"]["status"] == "cancelled", types(seen)
        whole, rest = await until(ws, "response.done")
        kinds = types(seen + rest)
        assert whole["response"]["status"] == "completed", kinds
        items = [e["item_id"] for e in seen + rest if e["type"] == "input_audio_buffer.committed"]
        deleted = [e["item_id"] for e in seen + rest if e["type"] == "conversation.item.deleted"]
        assert len(items) == 2 and items[0] in deleted and items[1] not in deleted, kinds
        assert first["response"]["output"][0]["id"] in deleted or not first["response"]["output"]
        transcripts = [e["transcript"] for e in seen + rest
                       if e["type"] == "conversation.item.input_audio_transcription.completed"]
        assert transcripts[-1] == "How long does it take to boil an egg?"
        users = [m for m in llm.seen[-1] if m["role"] == "user"]
        assert users == [{"role": "user", "content": "How long does it take to boil an egg?"}]
        assert [m["role"] for m in llm.seen[-1]] == ["system", "user"]  # the cut reply left too
        await ws.close()
    finally:
        await hub.stop()


class Thanks(FakeASR):
    """"No." [pause] "thanks": by length, the second word alone, the first, both."""

    def __init__(self) -> None:
        super().__init__("")
        self.heard: list[float] = []

    def transcribe(self, pcm, language=None):
        self.samples.append(len(pcm))
        seconds = len(pcm) / 16000
        self.heard.append(seconds)
        return FakeTranscript("thanks" if seconds < 1.0 else "No." if seconds < 2.2 else "No, thanks.")


@pytest.mark.parametrize(("pause_s", "mended"), [(0.9, True), (1.6, False)])
async def test_an_acknowledgement_over_the_reply_goes_on_with_the_turn_only_within_a_pause(tts_engines, pause_s,
                                                                                           mended):
    """"No." is answered at its pause and its reply plays; "thanks" over it pauses it. Started
    within turn.long_stop_ms (1200) of "No.": the user's own sentence going on: the reply is cut
    and "No, thanks." is one user message, answered once. Started later: a backchannel to what
    was heard: the reply resumes and nothing is deleted."""
    asr = Thanks()
    llm = FakeLLM(" ".join(CLAUSES), delay_s=0.02)  # about 10 s of speech: still playing at "thanks"
    hub = await _hub(tts_engines, FakeTurnModel(0.99), "vad.barge_in_min_ms=250", asr=asr, llm=llm)
    try:
        ws = await session(hub, SEMANTIC)
        await send_audio(ws, ("speech", 1.2), ("silence", pause_s), ("speech", 0.45), ("silence", 2.0))
        seen: list[dict] = []
        while True:  # what the server says until it has been quiet for a while
            try:
                seen.append(await recv(ws, timeout=1.5))
            except TimeoutError:
                break
        kinds = types(seen)
        done = [e["response"]["status"] for e in seen if e["type"] == "response.done"]
        users = [[m["content"] for m in messages if m["role"] == "user"] for messages in llm.seen]
        assert "x.output_audio_buffer.paused" in kinds, (asr.heard, " ".join(kinds))  # "thanks" over the reply
        assert any(seconds < 1.0 for seconds in asr.heard), asr.heard  # and heard as "thanks"
        if mended:
            assert "x.output_audio_buffer.cleared" in kinds and "conversation.item.deleted" in kinds, " ".join(kinds)
            assert len(done) == 2 and done[-1] == "completed", " ".join(kinds)
            assert users[0] == ["No."] and users[-1] == ["No, thanks."], users
        else:
            assert "x.output_audio_buffer.resumed" in kinds and "conversation.item.deleted" not in kinds, " ".join(kinds)
            assert done == ["completed"] and users == [["No."]], " ".join(kinds)
        await ws.close()
    finally:
        await hub.stop()


async def test_speech_after_the_mend_window_is_a_turn_of_its_own(tts_engines):
    asr = ByLength("and one more thing", "What's the capital of France?", seconds=0.9)
    llm = FakeLLM("Paris.", delay_s=0.01)
    hub = await _hub(tts_engines, FakeTurnModel(0.99), "turn.mend_ms=500", asr=asr, llm=llm)
    try:
        ws = await session(hub, SEMANTIC)
        await send_audio(ws, ("speech", 1.0), ("silence", 1.5), ("speech", 0.8), ("silence", 1.5))
        await until(ws, "response.done")
        _, seen = await until(ws, "response.done")
        assert "conversation.item.deleted" not in types(seen)
        assert [m["role"] for m in llm.seen[-1]] == ["system", "user", "assistant", "user"]
        await ws.close()
    finally:
        await hub.stop()


async def test_an_interruption_gets_the_speculative_start_and_the_score_of_a_fresh_turn(tts_engines):
    """A question spoken over a playing reply: paused, cut by its words, and then committed at the
    short pause after it (speculative turn, end-of-turn score), not at max_silence_ms."""
    turn = FakeTurnModel(0.99)
    llm = FakeLLM(" ".join(CLAUSES), delay_s=0.06)
    hub = await _hub(tts_engines, turn, "vad.barge_in_min_ms=250", asr=FakeASR("What is the capital of France?"),
                     llm=llm)
    try:
        ws = await session(hub, SEMANTIC)
        await _burst_over_reply(ws, "Tell me about the sea.", ("speech", 1.2), ("silence", 2.5))
        cut, seen = await until(ws, "response.done")
        kinds = types(seen)
        assert cut["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}, kinds
        assert kinds.index("x.output_audio_buffer.paused") < kinds.index("x.output_audio_buffer.cleared")
        rest: list[dict] = []
        while True:  # the cut reply's metrics first, then the interruption's turn's
            metrics, more = await until(ws, "x.turn.metrics")
            rest += more
            stages = metrics["metrics"]["stages_ms"]
            if "speech_end" in stages:
                break
        assert stages["vad_end"] - stages["speech_end"] < 450, stages  # was ~1900 (max_silence_ms)
        assert metrics["metrics"]["speculative"] is True and metrics["metrics"]["end_of_turn"] == 0.99
        assert "input_audio_buffer.committed" in types(rest)
        assert llm.seen[-1][-1] == {"role": "user", "content": "What is the capital of France?"}
        await ws.close()
    finally:
        await hub.stop()


@pytest.fixture
def real_llm():  # the hub closes it when it stops
    from base.config import load_config
    from llm.batched import BatchedChat

    cfg = load_config(None, ["llm.max_tokens=16", "llm.temperature=0", "llm.max_sequences=2"], environ={})
    engine = BatchedChat.from_config(cfg)
    return engine


async def test_no_partial_transcript_repeats_a_paused_utterance(tts_engines):
    """While a turn waits at a pause (the sound unsure), its speculative turn has transcribed the
    speech: partial transcripts stop until the user speaks again, so they do not take the cores
    from that turn's reply."""
    asr = FakeASR("tell me about the weather")
    hub = await _hub(tts_engines, FakeTurnModel(0.4), "asr.partial_interval_ms=300", asr=asr)
    try:
        ws = await session(hub, SEMANTIC)
        await send_audio(ws, ("speech", 1.5), ("silence", 2.5))
        await until(ws, "response.done")
        during = [n for n in asr.samples if n < 16000 * 1.5]  # partials while speaking
        after = [n for n in asr.samples if n > 16000 * 1.7]  # the utterance with its pause's silence
        assert during and len(asr.samples) == len(during) + 1 and not after, asr.samples  # + the speculative one
        await ws.close()
    finally:
        await hub.stop()


@pytest.mark.parametrize(("heard", "held"), [("How long does it take?", True), ("What is the capital of France?", False)])
async def test_the_words_hold_a_head_the_sound_calls_complete(tts_engines, real_llm, heard, held):
    """The sound says complete (0.99); the real LLM scores the words: "how long does it take" goes
    on (the turn waits turn.long_stop_ms, 3 s here), "what is the capital of france" is over
    (answered at the short pause, as soon as the words' score is in: well under the long stop even
    on a slow machine)."""
    hub = await _hub(tts_engines, FakeTurnModel(0.99), "turn.long_stop_ms=3000", "turn.max_silence_ms=4000",
                     asr=FakeASR(heard), llm=real_llm)
    before = real_llm.report()
    try:
        ws = await session(hub, SEMANTIC)
        await send_audio(ws, ("speech", 0.8), ("silence", 3.6))
        metrics, _ = await until(ws, "x.turn.metrics")
        m = metrics["metrics"]
        waited = m["stages_ms"]["vad_end"] - m["stages_ms"]["speech_end"]
        if held:
            assert m["words_end_of_turn"] < 0.03 and 2900 < waited < 3500, (waited, m)
        else:
            assert m["words_end_of_turn"] >= 0.03 and waited < 2500, (waited, m)
            assert waited < 400 + m["words_end_of_turn_ms"], (waited, m)  # at the words' score
        # asked with the speculative reply: read from its prompt, no token of its own (llm/batched.py)
        r = real_llm.report()
        assert r["probes_shared"] - before["probes_shared"] == 1 and r["probes_alone"] == before["probes_alone"], r
        assert r["probe_tokens_evaluated"] == before["probe_tokens_evaluated"], r
        await ws.close()
    finally:
        await hub.stop()
