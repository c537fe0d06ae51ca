"""The protocol contract: what docs/protocol.md promises, checked only through the WebSocket.

Each test sends client events and compares the server events with the sequence the
docs give, including failure paths: ASR, LLM and TTS engines that fail mid-turn
(fault-injected fakes: this is orchestration), cancel and barge-in with the final item
states, ``incomplete`` at the token limit, and the session-level error codes. The TTS is
the real CPU engine; the conversation history is read from what the fake LLM is given.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import time

import numpy as np
import pytest
import websockets

from client_fakes import FakeASR, FakeLLM, real_tts_engines, slow_link, start_hub
from conftest import scaled
from llm.replies import GenerationStats
from rt import append, http_get, recv, speech_24k, until, url, user_text
from base.errors import ModelError

pytestmark = pytest.mark.timeout(scaled(120))
PTT = {"type": "realtime", "audio": {"input": {"turn_detection": None, "format": {"type": "audio/pcm", "rate": 24000}}}}
#: The events that close an assistant audio item, in the documented order.
CLOSE_AUDIO = ["response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
               "response.output_item.done", "conversation.item.done"]
START = ["response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added"]
CLAUSES = ["It is sunny today.", "Take a hat with you.", "Drink some water at noon.", "The wind is calm.",
           "Rain may come tonight.", "Close your windows then.", "Tomorrow will be cooler.", "Have a good day."]


class BrokenASR(FakeASR):
    """Raises ``ModelError`` while ``broken`` is set."""

    broken = True

    def transcribe(self, pcm, language=None):
        if self.broken:
            raise ModelError("speech recognition failed")
        return super().transcribe(pcm, language)


class BrokenLLM(FakeLLM):
    """Streams ``fail_after`` tokens, then raises ``ModelError`` (while ``broken`` is set)."""

    def __init__(self, reply: str, fail_after: int) -> None:
        super().__init__(reply)
        self.fail_after = fail_after
        self.broken = True

    def stream(self, messages, cancel=None, max_tokens=None):
        for n, token in enumerate(super().stream(messages, cancel, max_tokens)):
            if self.broken and n == self.fail_after:
                raise ModelError("the language model failed")
            yield token


class CountingLLM(FakeLLM):
    """Honours ``max_tokens`` and reports how it ended in ``last_stats`` (``SerialLlm`` hands it on)."""

    def stream(self, messages, cancel=None, max_tokens=None):
        self.last_stats = None
        limit = len(self.tokens) if max_tokens is None else max_tokens
        tokens = self.tokens[:limit]
        yield from tokens
        reason = "length" if len(tokens) < len(self.tokens) else "stop"
        self.last_stats = GenerationStats(prompt_tokens=10 * len(messages), cached_tokens=0,
                                          completion_tokens=len(tokens), dropped_messages=0,
                                          first_token_s=0.0, total_s=0.0, finish_reason=reason)


class BrokenTTS:
    """The real TTS engine, except that its ``fail_on``-th clause fails after its first chunk."""

    def __init__(self, engine, fail_on: int) -> None:
        self.engine = engine
        self.fail_on = fail_on
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def synthesize(self, text, options=None):
        self.calls += 1
        chunks = self.engine.synthesize(text, options)
        if self.calls != self.fail_on:
            yield from chunks
            return
        yield next(chunks)
        raise ModelError("speech synthesis failed")


@pytest.fixture(scope="module")
def tts_engines():
    return real_tts_engines()


@contextlib.asynccontextmanager
async def serving(tts_engines, *overrides: str, **fakes):
    """A hub on port 0 with the real TTS and ``fakes`` (asr=, llm=), stopped on exit."""
    hub = await start_hub(tts_engines, *overrides, **fakes)
    try:
        yield hub
    finally:
        await hub.stop()


async def session(hub, update: dict | None = None):
    ws = await websockets.connect(url(hub))
    assert (await recv(ws))["type"] == "session.created"
    if update is not None:
        await ws.send(json.dumps({"type": "session.update", "session": update}))
        await until(ws, "session.updated")
    return ws


async def quiet(ws, seconds: float = 0.3) -> list[dict]:
    """Everything that arrives within ``seconds`` (scaled) of silence."""
    got = []
    try:
        while True:
            got.append(await recv(ws, seconds))
    except TimeoutError:
        return got


async def send_audio(ws, *parts: tuple[str, float]) -> None:
    """Stream ("speech" | "silence", seconds) parts at real time in 20 ms frames (24 kHz)."""
    for kind, seconds in parts:
        pcm = speech_24k(seconds) if kind == "speech" else np.zeros(int(24000 * seconds), np.int16)
        for i in range(0, len(pcm), 480):
            await ws.send(append(pcm[i:i + 480]))
            await asyncio.sleep(0.02)


def types(events: list[dict]) -> list[str]:
    return [e["type"] for e in events if e["type"] != "response.output_audio.delta"]


def transcript(events: list[dict], response_id: str) -> str:
    return "".join(e["delta"] for e in events
                   if e["type"] == "response.output_audio_transcript.delta" and e["response_id"] == response_id)


def check_closed(events: list[dict], done: dict, status: str, item_status: str) -> dict:
    """The response's item was closed (documented order, nothing after) and ``done`` names it."""
    rid = done["response"]["id"]
    mine = [e for e in events if e.get("response_id") == rid or e.get("response", {}).get("id") == rid
            or e["type"] == "conversation.item.done"]
    assert types(mine)[-6:] == CLOSE_AUDIO + ["response.done"], types(mine)
    assert mine[-1]["type"] == "response.done" and mine[-1] is done
    said = transcript(events, rid).strip()
    item = next(e for e in events if e["type"] == "response.output_item.done")["item"]
    assert item["status"] == item_status and item["content"] == [{"type": "output_audio", "transcript": said}]
    assert next(e for e in events if e["type"] == "response.output_audio_transcript.done")["transcript"] == said
    assert done["response"]["status"] == status and done["response"]["output"] == [item]
    return item


# --------------------------------------------------------------------------- models failing mid-turn
async def test_asr_failure_sends_transcription_failed_and_ends_the_user_item(tts_engines):
    asr, llm = BrokenASR(), FakeLLM()
    async with serving(tts_engines, "asr.partial_interval_ms=0", asr=asr, llm=llm) as hub:
        ws = await session(hub, PTT)
        await ws.send(append(speech_24k(1.0)))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        _, seen = await until(ws, "conversation.item.done")
        assert types(seen) == ["input_audio_buffer.committed", "conversation.item.added",
                               "conversation.item.input_audio_transcription.failed", "conversation.item.done"]
        item = seen[0]["item_id"]
        failed, done = seen[2], seen[3]
        assert failed["item_id"] == item and failed["error"]["type"] == "server_error"
        assert failed["error"]["code"] == "model_error" and failed["error"]["message"] == "speech recognition failed"
        assert done["item"]["id"] == item and done["item"]["status"] == "completed"
        assert done["item"]["content"] == [{"type": "input_audio"}]
        # No response and no error event; only the turn's metrics may follow.
        assert set(types(await quiet(ws))) <= {"x.turn.metrics"}
        assert llm.seen == []
        # The session goes on: the next commit is answered, without the failed item in history.
        asr.broken = False
        await ws.send(append(speech_24k(1.0)))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        done, _ = await until(ws, "response.done")
        assert done["response"]["status"] == "completed"
        assert [m["role"] for m in llm.seen[-1]] == ["system", "user"]
        await ws.close()


async def test_llm_failure_closes_the_item_and_fails_the_response(tts_engines):
    llm = BrokenLLM(" ".join(CLAUSES), fail_after=9)  # two clauses, then the model fails
    async with serving(tts_engines, llm=llm) as hub:
        ws = await session(hub)
        for m in user_text("How is the weather?"):
            await ws.send(m)
        done, seen = await until(ws, "response.done")
        item = check_closed(seen, done, "failed", "incomplete")
        assert item["content"][0]["transcript"] == transcript(seen, done["response"]["id"]).strip()
        details = done["response"]["status_details"]
        assert details["type"] == "failed"
        assert details["error"] == {"type": "server_error", "code": "model_error", "message": "the language model failed"}
        # The model never reported its counts: the tokens streamed before it failed
        assert done["response"]["usage"] == {"total_tokens": 9, "input_tokens": 0, "output_tokens": 9}
        assert "error" not in types(seen) and set(types(await quiet(ws))) <= {"x.turn.metrics"}
        llm.broken = False
        for m in user_text("And now?"):
            await ws.send(m)
        assert (await until(ws, "response.done"))[0]["response"]["status"] == "completed"
        await ws.close()


async def test_tts_failure_closes_the_item_and_fails_the_response(tts_engines):
    broken = [BrokenTTS(e, fail_on=2) for e in tts_engines]
    async with serving(broken, llm=FakeLLM(" ".join(CLAUSES[:4]))) as hub:
        ws = await session(hub)
        for m in user_text("How is the weather?"):
            await ws.send(m)
        done, seen = await until(ws, "response.done")
        item = check_closed(seen, done, "failed", "incomplete")
        # The second clause's text went out (its transcript precedes its audio); its audio broke off.
        assert item["content"][0]["transcript"] == " ".join(CLAUSES[:2])
        assert done["response"]["status_details"]["error"]["message"] == "speech synthesis failed"
        assert "error" not in types(seen)
        await ws.close()


# --------------------------------------------------------------------------- token limit, usage
async def test_token_limit_gives_incomplete_and_usage(tts_engines):
    llm = CountingLLM(" ".join(CLAUSES[:2]))  # 9 tokens
    async with serving(tts_engines, llm=llm) as hub:
        ws = await session(hub, {"type": "realtime", "max_output_tokens": 4})
        for m in user_text("How is the weather?"):
            await ws.send(m)
        done, seen = await until(ws, "response.done")
        item = check_closed(seen, done, "incomplete", "incomplete")
        assert item["content"][0]["transcript"] == "It is sunny today."
        assert done["response"]["status_details"] == {"type": "incomplete", "reason": "max_output_tokens"}
        assert done["response"]["usage"] == {"total_tokens": 24, "input_tokens": 20, "output_tokens": 4}
        await ws.send(json.dumps({"type": "session.update", "session": {"max_output_tokens": "inf"}}))
        for m in user_text("Again?"):
            await ws.send(m)
        done, seen = await until(ws, "response.done")
        check_closed(seen, done, "completed", "completed")
        assert done["response"]["usage"] == {"total_tokens": 49, "input_tokens": 40, "output_tokens": 9}
        await ws.close()


async def test_text_reply_at_the_token_limit(tts_engines):
    async with serving(tts_engines, llm=CountingLLM(" ".join(CLAUSES[:2]))) as hub:
        ws = await session(hub, {"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 3})
        for m in user_text("How is the weather?"):
            await ws.send(m)
        done, seen = await until(ws, "response.done")
        assert types(seen)[-5:] == ["response.output_text.done", "response.content_part.done",
                                    "response.output_item.done", "conversation.item.done", "response.done"]
        item = {"id": seen[-2]["item"]["id"], "type": "message", "role": "assistant", "object": "realtime.item",
                "status": "incomplete", "content": [{"type": "output_text", "text": "It is sunny"}]}
        assert seen[-3]["item"] == item and done["response"]["output"] == [item]
        assert done["response"]["status"] == "incomplete"
        await ws.close()


# --------------------------------------------------------------------------- cancel and barge-in
async def test_cancel_closes_the_item_before_response_done(tts_engines):
    llm = FakeLLM(" ".join(CLAUSES * 4), delay_s=0.03)
    async with serving(tts_engines, llm=llm) as hub:
        ws = await session(hub)
        for m in user_text("Talk a lot."):
            await ws.send(m)
        _, before = await until(ws, "response.output_audio.delta")
        await ws.send(json.dumps({"type": "response.cancel"}))
        done, after = await until(ws, "response.done")
        seen = before + after
        item = check_closed(seen, done, "cancelled", "incomplete")
        assert item["content"][0]["transcript"]  # the text that was sent
        assert done["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
        assert not [e for e in await quiet(ws) if e.get("response_id") == done["response"]["id"]
                    and e["type"] != "x.turn.metrics"]
        await ws.close()


def clause_ends_ms(events: list[dict], response_id: str) -> list[float]:
    """Where each clause's audio ends in the response's audio stream, ms (24 kHz): a clause's
    transcript delta precedes its audio, so audio between two deltas belongs to the first."""
    ends, samples = [], 0
    for e in events:
        if e.get("response_id") != response_id:
            continue
        if e["type"] == "response.output_audio_transcript.delta" and samples:
            ends.append(1000 * samples / 24000)
        elif e["type"] == "response.output_audio.delta":
            samples += len(e["delta"]) * 3 // 4 // 2
    return ends


async def test_voice_barge_in_keeps_only_the_heard_clauses_in_history(tts_engines):
    llm = FakeLLM(" ".join(CLAUSES), delay_s=0.02)
    async with serving(tts_engines, "vad.barge_in_min_ms=150", "asr.partial_interval_ms=0",
                          asr=FakeASR("wait a moment"), llm=llm) as hub:
        ws = await session(hub)
        for m in user_text("How is the weather?"):
            await ws.send(m)
        seen = []
        while len([e for e in seen if e["type"] == "response.output_audio_transcript.delta"]) < 3:
            seen.append(await recv(ws))
        rid = seen[-1]["response_id"]
        heard_to = math.ceil(clause_ends_ms(seen, rid)[1]) + 40  # 40 ms into the third clause
        await ws.send(json.dumps({"type": "x.playback", "item_id": seen[-1]["item_id"], "audio_end_ms": heard_to}))
        await send_audio(ws, ("speech", 1.0), ("silence", 1.0))  # the user talks over it
        done, after = await until(ws, "response.done")
        assert done["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
        check_closed(seen + after, done, "cancelled", "incomplete")
        assert "input_audio_buffer.speech_started" in types(after)
        nxt, _ = await until(ws, "response.done")  # the interruption, answered as its own turn
        assert nxt["response"]["status"] == "completed"
        assert llm.seen[-1][1:] == [{"role": "user", "content": "How is the weather?"},
                                    {"role": "assistant", "content": " ".join(CLAUSES[:2])},
                                    {"role": "user", "content": "wait a moment"}]
        await ws.close()


async def test_voice_barge_in_after_the_reply_finished_but_still_plays(tts_engines):
    llm = FakeLLM(" ".join(CLAUSES[:3]))
    async with serving(tts_engines, "vad.barge_in_min_ms=150", "asr.partial_interval_ms=0",
                          asr=FakeASR("wait a moment"), llm=llm) as hub:
        ws = await session(hub)
        for m in user_text("How is the weather?"):
            await ws.send(m)
        done, seen = await until(ws, "response.done")
        assert done["response"]["status"] == "completed"
        rid, item_id = done["response"]["id"], done["response"]["output"][0]["id"]
        heard_to = math.ceil(clause_ends_ms(seen, rid)[0]) + 40  # the client has played the first clause
        await ws.send(json.dumps({"type": "x.playback", "item_id": item_id, "audio_end_ms": heard_to}))
        await send_audio(ws, ("speech", 1.0), ("silence", 1.0))  # the user talks over it
        nxt, after = await until(ws, "response.done")
        assert nxt["response"]["id"] != rid and nxt["response"]["status"] == "completed"
        assert not [e for e in after if e.get("response_id") == rid and e["type"] != "x.turn.metrics"]  # over
        assert llm.seen[-1][1:] == [{"role": "user", "content": "How is the weather?"},
                                    {"role": "assistant", "content": CLAUSES[0]},
                                    {"role": "user", "content": "wait a moment"}]
        await ws.close()


# --------------------------------------------------------------------------- client events and their errors
class SlowASR(FakeASR):
    """Takes 0.2 s per transcript (so a client event can arrive while it works)."""

    def transcribe(self, pcm, language=None):
        time.sleep(0.2)
        return super().transcribe(pcm, language)


async def test_interrupt_response_false_lets_the_reply_finish_then_answers_the_speech(tts_engines):
    llm = FakeLLM(" ".join(CLAUSES), delay_s=0.02)
    async with serving(tts_engines, "vad.barge_in_min_ms=150", "asr.partial_interval_ms=0",
                          asr=FakeASR("wait a moment"), llm=llm) as hub:
        ws = await session(hub, {"type": "realtime", "audio": {"input": {"turn_detection": {
            "type": "server_vad", "interrupt_response": False}}}})
        for m in user_text("How is the weather?"):
            await ws.send(m)
        await until(ws, "response.output_audio_transcript.delta")
        await send_audio(ws, ("speech", 1.0), ("silence", 1.0))  # the user talks over it
        done, seen = await until(ws, "response.done")
        assert done["response"]["status"] == "completed"  # not cut by the speech
        nxt, after = await until(ws, "response.done")  # the speech is still a turn, answered after
        assert nxt["response"]["status"] == "completed"
        kinds = types(seen + after)
        assert "input_audio_buffer.speech_started" in kinds and "input_audio_buffer.committed" in kinds
        assert "x.output_audio_buffer.paused" not in kinds and "x.output_audio_buffer.cleared" not in kinds
        assert llm.seen[-1][1:] == [{"role": "user", "content": "How is the weather?"},
                                    {"role": "assistant", "content": " ".join(CLAUSES)},
                                    {"role": "user", "content": "wait a moment"}]
        await ws.close()


async def test_create_response_false_transcribes_and_waits_for_response_create(tts_engines):
    llm = FakeLLM(CLAUSES[0])
    async with serving(tts_engines, "asr.partial_interval_ms=0", asr=SlowASR("what time is it"), llm=llm) as hub:
        ws = await session(hub, {"type": "realtime", "audio": {"input": {"turn_detection": {
            "type": "server_vad", "create_response": False}}}})
        await send_audio(ws, ("speech", 1.0), ("silence", 0.7))
        _, seen = await until(ws, "input_audio_buffer.committed")
        # Asked for at once, while the turn is still being transcribed: answered once it is.
        await ws.send(json.dumps({"type": "response.create"}))
        done, after = await until(ws, "response.done")
        kinds = types(seen + after)
        assert kinds.index("conversation.item.input_audio_transcription.completed") < kinds.index("response.created")
        assert kinds.count("response.created") == 1 and done["response"]["status"] == "completed"
        assert llm.seen[-1][1:] == [{"role": "user", "content": "what time is it"}]
        # The next turn is transcribed and nothing more, until the client asks again.
        await send_audio(ws, ("speech", 1.0), ("silence", 0.7))
        later = await quiet(ws, 1.5)
        assert "conversation.item.input_audio_transcription.completed" in types(later)
        assert "response.created" not in types(later) and len(llm.seen) == 1
        await ws.close()


async def test_idle_timeout_answers_silence_after_the_reply_has_played(tts_engines):
    llm = FakeLLM(CLAUSES[0])
    async with serving(tts_engines, "asr.partial_interval_ms=0", llm=llm) as hub:
        ws = await session(hub, {"type": "realtime", "audio": {"input": {"turn_detection": {
            "type": "server_vad", "idle_timeout_ms": 800}}}})
        await send_audio(ws, ("silence", 1.5))  # before any response: no timeout
        for m in user_text("How is the weather?"):
            await ws.send(m)
        first, seen = await until(ws, "response.done")
        reply_ms = sum(len(e["delta"]) * 3 // 4 // 2 for e in seen if e["type"] == "response.output_audio.delta") / 24
        # Silence streamed while the reply plays (estimated from the audio sent) and after it.
        sender = asyncio.create_task(send_audio(ws, ("silence", reply_ms / 1000 + 2.0)))
        trigger, before = await until(ws, "input_audio_buffer.timeout_triggered")
        assert "response.created" not in types(before)
        assert 750 <= trigger["audio_end_ms"] - trigger["audio_start_ms"] <= 1000
        done, after = await until(ws, "response.done")
        committed = next(e for e in after if e["type"] == "input_audio_buffer.committed")
        assert committed["item_id"] == trigger["item_id"] and done["response"]["status"] == "completed"
        assert llm.seen[-1][-1] == {"role": "user", "content": "(The user has said nothing for 1 seconds.)"}
        await sender
        await ws.close()


async def test_push_to_talk_buffer_limit_clear_and_joined_response_create(tts_engines):
    asr = SlowASR("what time is it")
    async with serving(tts_engines, "limits.max_utterance_s=1", asr=asr) as hub:
        ws = await session(hub, PTT)
        await ws.send(append(speech_24k(0.5)))
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        assert (await recv(ws))["type"] == "input_audio_buffer.cleared"
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c1"}))
        err = (await recv(ws))["error"]
        assert (err["type"], err["code"], err["event_id"]) == (
            "invalid_request_error", "input_audio_buffer_commit_empty", "c1")
        # Over limits.max_utterance_s: one error, the first second is kept.
        await ws.send(append(speech_24k(1.5)))
        await ws.send(append(speech_24k(0.5)))
        err = (await recv(ws))["error"]
        assert (err["type"], err["code"]) == ("invalid_request_error", "input_audio_buffer_full")
        # A response.create right after the commit joins the commit's response (no error, one response).
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await ws.send(json.dumps({"type": "response.create"}))
        done, seen = await until(ws, "response.done")
        assert done["response"]["status"] == "completed"
        assert types(seen).count("response.created") == 1 and "error" not in types(seen)
        assert asr.samples == [16000]
        assert "error" not in types(await quiet(ws))
        await ws.close()


async def test_response_create_options_and_active_response(tts_engines):
    llm = FakeLLM(" ".join(CLAUSES * 3), delay_s=0.02)
    async with serving(tts_engines, llm=llm) as hub:
        ws = await session(hub, {"type": "realtime", "instructions": "Be brief.", "output_modalities": ["text"]})
        for m in user_text("Hello?"):
            await ws.send(m)
        await until(ws, "response.created")
        await ws.send(json.dumps({"type": "response.create", "event_id": "c2"}))
        err, _ = await until(ws, "error")
        assert (err["error"]["code"], err["error"]["event_id"]) == ("conversation_already_has_active_response", "c2")
        first, _ = await until(ws, "response.done")
        assert first["response"]["status"] == "completed"
        assert llm.seen[-1][0] == {"role": "system", "content": "Be brief."}
        # Out of band, with its own instructions: not added to the history.
        await ws.send(json.dumps({"type": "response.create", "response": {
            "instructions": "Summarize.", "conversation": "none"}}))
        oob, _ = await until(ws, "response.done")
        assert oob["response"]["status"] == "completed"
        assert llm.seen[-1][0] == {"role": "system", "content": "Summarize."}
        await ws.send(json.dumps({"type": "response.create"}))
        await until(ws, "response.done")
        assert [m["role"] for m in llm.seen[-1]] == ["system", "user", "assistant"]
        await ws.close()


async def test_tts_speak_cancel_and_its_errors(tts_engines):
    async with serving(tts_engines) as hub:
        ws = await session(hub)
        speak = {"type": "x.tts.speak", "request_id": "r1", "text": " ".join(CLAUSES)}
        await ws.send(json.dumps(speak))
        await until(ws, "x.tts.audio.delta")
        await ws.send(json.dumps({**speak, "event_id": "c3"}))  # the same id while r1 runs
        err, _ = await until(ws, "error")
        assert (err["error"]["type"], err["error"]["code"], err["error"]["event_id"]) == (
            "invalid_request_error", "duplicate_request_id", "c3")
        refused, _ = await until(ws, "x.tts.done")
        assert refused["request_id"] == "r1" and refused["status"] == "failed"
        assert refused["error"]["type"] == "invalid_request_error"
        assert refused["error"]["code"] == "duplicate_request_id"
        assert "first_audio_ms" not in refused  # no audio was sent for it
        await ws.send(json.dumps({"type": "x.tts.cancel", "request_id": "r1"}))
        done, _ = await until(ws, "x.tts.done")
        assert done["request_id"] == "r1" and done["status"] == "cancelled" and "error" not in done
        assert 0 < done["audio_ms"] < 10_000  # not the whole text
        await ws.send(json.dumps({"type": "x.tts.cancel", "request_id": "r1", "event_id": "c4"}))
        err, _ = await until(ws, "error")
        assert (err["error"]["code"], err["error"]["event_id"]) == ("request_not_found", "c4")
        await ws.close()


# --------------------------------------------------------------------------- speculative turns, drain, slow clients
async def test_speculative_turn_dropped_when_speech_resumes_then_released_at_speech_end(tts_engines):
    asr, llm = FakeASR("what is the weather like"), FakeLLM()
    async with serving(tts_engines, "asr.partial_interval_ms=0", asr=asr, llm=llm) as hub:
        ws = await session(hub)
        # A 300 ms pause (over vad.speculative_pause_ms, under the 500 ms that end a turn), then the end.
        await send_audio(ws, ("speech", 0.8), ("silence", 0.3), ("speech", 0.8), ("silence", 1.0))
        metrics, seen = await until(ws, "x.turn.metrics")
        kinds = types(seen)
        for once in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                     "input_audio_buffer.committed", "response.created", "response.done",
                     "conversation.item.input_audio_transcription.completed"):
            assert kinds.count(once) == 1, (once, kinds)
        # Nothing was sent before the commit, although both pauses started work (held, then released).
        assert kinds.index("input_audio_buffer.committed") < kinds.index("conversation.item.added")
        assert len(asr.samples) == 2 and asr.samples[1] > asr.samples[0] + 16000 // 2  # the second heard both parts
        assert len(llm.seen) == 2  # the dropped turn had reached the LLM too; its reply never went out
        assert metrics["metrics"]["speculative"] is True
        assert metrics["metrics"]["stages_ms"]["asr_start"] < 0  # ASR began before the VAD decided
        assert "error" not in kinds and set(types(await quiet(ws))) <= set()
        await ws.close()


async def test_drain_closes_sessions_with_turns_in_flight_when_the_grace_period_ends(tts_engines):
    hub = await start_hub(tts_engines, llm=FakeLLM(" ".join(CLAUSES * 4), delay_s=0.05))  # ~6 s of reply
    ws = await session(hub)
    for m in user_text("Talk a lot."):
        await ws.send(m)
    await until(ws, "response.created")
    await hub.stop(grace_s=0.2)
    seen = []
    with pytest.raises(websockets.ConnectionClosed) as info:
        while True:
            seen.append(await recv(ws))
    assert info.value.rcvd is not None and info.value.rcvd.code == 1001
    assert "response.done" not in types(seen)  # closed with the reply in flight


async def audio_until(ws, delta: str, done: str) -> tuple[dict, int, list[str]]:  # noqa: ANN001
    """Read until a ``done`` event: (it, samples in the ``delta`` events, every event's type)."""
    samples, seen = 0, []
    while True:
        event = await recv(ws, 30)
        seen.append(event["type"])
        if event["type"] == delta:
            samples += len(base64.b64decode(event["delta"])) // 2
        elif event["type"] == done:
            return event, samples, seen


async def speech_backed_up(hub):  # noqa: ANN001, ANN201 - a websockets ClientConnection
    """A session asking for the long ``x.tts.speak`` "long", returned once its audio waits for room
    (the outbox at its audio limit: the speech outran the client)."""
    ws = await websockets.connect(url(hub))
    await recv(ws)
    await ws.send(json.dumps({"type": "x.tts.speak", "request_id": "long", "text": " ".join(CLAUSES)}))
    (session,) = hub.sessions.values()
    deadline = time.monotonic() + scaled(30)
    while session.outbox.qsize() < session.outbox.audio_limit and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert session.outbox.qsize() >= session.outbox.audio_limit, "the speech never outran the client"
    return ws


async def test_client_that_stops_reading_is_closed_with_1008(tts_engines, monkeypatch):
    """Audio waits for room while nothing reaches the client; after ``limits.send_stall_s`` without
    an event taken the session is closed with 1008."""
    slow_link(monkeypatch, asyncio.Event().wait)  # nothing is ever sent
    async with serving(tts_engines, "limits.send_queue_messages=32", "limits.send_stall_s=1") as hub:
        ws = await websockets.connect(url(hub))
        t0 = time.monotonic()
        await ws.send(json.dumps({"type": "x.tts.speak", "request_id": "r", "text": " ".join(CLAUSES)}))
        with pytest.raises(websockets.ConnectionClosed) as info:
            while True:
                await asyncio.wait_for(ws.recv(), scaled(30))
        assert info.value.rcvd is not None, info.value
        assert (info.value.rcvd.code, info.value.rcvd.reason) == (1008, "client is not reading its messages")
        assert time.monotonic() - t0 >= 1.0  # the stall, not the first burst of audio


async def test_a_client_slower_than_its_speech_gets_all_of_it(tts_engines, monkeypatch):
    """A client that takes its events more slowly than speech is made (a slow link, or one that
    reads as it plays) is not a client that stopped reading: audio waits for room in the
    outbox, the request completes with every sample, and other events keep their place."""
    slow_link(monkeypatch, lambda: asyncio.sleep(0.02))  # 50 events/s: 5 s of audio per second
    async with serving(tts_engines, "limits.send_queue_messages=32", "limits.send_stall_s=5") as hub:
        ws = await speech_backed_up(hub)
        await ws.send(json.dumps({"type": "x.tts.cancel", "request_id": "no-such-request"}))
        event, samples, seen = await audio_until(ws, "x.tts.audio.delta", "x.tts.done")
        assert event["status"] == "completed", event
        assert round(1000 * samples / 24000) == event["audio_ms"] > 8_000
        assert "error" in seen and hub.sessions  # the cancel's answer came; the session is open
        assert seen.index("error") < len(seen) - 10  # ahead of the audio that waited
        _, metrics, _ = await asyncio.to_thread(http_get, hub, "/metrics")
        waited = [line for line in metrics.splitlines() if line.startswith("voxloop_audio_wait_seconds_total ")]
        assert waited and float(waited[0].split()[1]) > 0.1, waited
        await ws.close()


async def test_cancelling_speech_that_waits_for_a_slow_client_ends_it_at_once(tts_engines, monkeypatch):
    """``x.tts.cancel`` while the request's audio waits for room: its waiting audio is dropped and
    ``x.tts.done`` (cancelled) comes right behind what was already queued, no delta after it."""
    slow_link(monkeypatch, lambda: asyncio.sleep(0.02))
    async with serving(tts_engines, "limits.send_queue_messages=32", "limits.send_stall_s=5") as hub:
        ws = await speech_backed_up(hub)
        await ws.send(json.dumps({"type": "x.tts.cancel", "request_id": "long"}))
        t0 = time.monotonic()
        event, samples, seen = await audio_until(ws, "x.tts.audio.delta", "x.tts.done")
        assert event["status"] == "cancelled" and samples / 24000 < 5.0, (event, samples)
        assert time.monotonic() - t0 < 32 * 0.02 + scaled(1.0)  # the queue's worth of events, no more
        with pytest.raises(TimeoutError):
            await recv(ws, 0.5)  # nothing after x.tts.done
        await ws.close()


async def test_a_reply_to_a_slow_client_is_spoken_whole(tts_engines, monkeypatch):
    """The conversation's replies wait for room too: a long answer to a slow client completes and
    every delta arrives (``response.output_audio.delta``), the session stays open."""
    slow_link(monkeypatch, lambda: asyncio.sleep(0.02))
    reply = " ".join(CLAUSES)
    async with serving(tts_engines, "limits.send_queue_messages=32", "limits.send_stall_s=5",
                       llm=FakeLLM(reply)) as hub:
        ws = await websockets.connect(url(hub))
        await recv(ws)
        for m in user_text("What is the weather like?"):
            await ws.send(m)
        event, samples, _ = await audio_until(ws, "response.output_audio.delta", "response.done")
        assert event["response"]["status"] == "completed", event
        assert samples / 24000 > 8.0 and hub.sessions
        await ws.close()


async def test_partial_transcripts_while_the_user_speaks(tts_engines):
    async with serving(tts_engines, "asr.partial_interval_ms=300", asr=FakeASR("what is the weather like")) as hub:
        ws = await session(hub)
        await send_audio(ws, ("speech", 1.5), ("silence", 1.0))
        _, seen = await until(ws, "conversation.item.input_audio_transcription.completed")
        kinds = types(seen)
        started = seen[kinds.index("input_audio_buffer.speech_started")]
        partials = [e for e in seen if e["type"] == "conversation.item.input_audio_transcription.delta"]
        assert partials and kinds.index("conversation.item.input_audio_transcription.delta") < kinds.index(
            "input_audio_buffer.speech_stopped")  # while the user still speaks
        assert {e["item_id"] for e in partials} == {started["item_id"]}
        assert "".join(e["delta"] for e in partials) == "what is the weather like"  # deltas, not repeats
        await ws.close()
