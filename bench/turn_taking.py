"""Turn taking: ``semantic_vad`` with words + sound (the end-of-turn model and the LLM's score of the
words), ``semantic_vad`` on the sound alone, and ``server_vad`` (500 ms of silence), in the same run,
with the project's turn-taking set.

Starts ``voxloop serve`` (the real models) and, for each mode, one or more talkers that
stream, at real-time pace in 20 ms frames with silence in between (an open microphone):

- the set of ``bench/turn_set.py`` (bundled voice): complete sentences; sentences with a
  600 ms pause after a word; the same with a trailing "um" before the pause; held apart, 32
  sentences with one pause of 300-900 ms (``midpause``: a reply before the sentence's end is a
  *false cutoff*) and 20 short answers (``short``), each spoken right after the assistant's question
  it answers, added to the conversation as an assistant item (``conversation.item.create``);
- the questions of ``bench/voice_questions.txt`` (" | " is a 300 ms pause);
- human recordings: the voices of Debian's alsa-utils (``/usr/share/sounds/alsa``, "Front
  center" and the like; ``apt-get install alsa-utils``; left out with a note when missing);
- cough-like bursts during a playing reply, and a spoken interruption.

Per turn: ``voice_to_voice`` = first audio of the turn's (last) reply received - the last speech
sample sent (the true end of speech, client clock); ``commit_after_speech_end`` = its (last)
``input_audio_buffer.committed`` received - the same (the end of turn alone: VAD, end-of-turn model
and transcript, without the LLM's and TTS's share). A turn is *split* when the server committed
more than once for it, or a reply began before the speech ended; *missed* when no reply came
within the timeout. A turn is over when its replies are done and nothing happened for
``QUIET_S``; its reply is then reported played (``x.playback`` finished) without waiting it out.
Per burst over a playing reply: ``resumed`` (paused, then resumed: pause length), ``cut`` (the
reply was cancelled or cleared; ``server_vad`` has no pause, so a client stops playback at
``speech_started``), ``paused`` (never resolved), ``unaffected`` (no speech detected),
``reply_over`` (the reply had less audio than was played by then: nothing to pause; not a trial).
The bursts run in a conversation of their own, after the turns.
Per level, from the server's ``/metrics``: speculative turns dropped unseen and ASR runs.
``--noise-dbfs`` adds white noise to everything the microphone sends (a real microphone is never
digitally silent; -60 is a quiet room on a headset, -45 a noisy one).

The interruption's answer: its first audio - the interruption's last speech sample sent
(``interruption_v2v_ms``), against the fresh turns' voice-to-voice. ``semantic_vad_audio`` runs on a
second server with ``turn.score_words = false`` (the sound alone), up beside the first for the whole run.
The modes take turns by conversation (``--session-turns N``: the first N turns in every mode, then the
next N, the order of the modes reversed every other time), so a drift of the machine's speed over
the run weighs on every mode alike.

Writes OUT/turn_taking-<hardware>-<date>.json (+ .png).

    python -m bench.turn_taking --talkers 1 --coughs 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

from bench.harness import (
    Mic, add_output_arguments, counter_delta, free_port, hardware, metrics_url, pct, portable_args, scrape_metrics,
    start_server, stop_server, write_json,
)
from bench.turn_set import SHORT, conversations

RATE = 16000
MODES = {"server_vad": {"type": "server_vad", "silence_duration_ms": 500},
         "semantic_vad": {"type": "semantic_vad", "eagerness": "auto"},
         "semantic_vad_high": {"type": "semantic_vad", "eagerness": "high"},
         "semantic_vad_audio": {"type": "semantic_vad", "eagerness": "auto"}}
#: Server settings of a mode (others: the defaults); modes sharing them share a server.
MODE_SERVER = {"semantic_vad_audio": ("--set", "turn.score_words=false")}
#: Kinds of turns that are finished where the speaker pauses: their voice-to-voice is the "complete turns" row.
COMPLETE_KINDS = ("complete", "short", "question")
LONG = "Tell a long story of at least ten sentences."
INTERRUPTION = "Stop. What is the capital of France?"
QUIET_S = 1.2  # a turn is over when nothing happened for this long (and its reply is done)
PLAYED_MS = 1500  # a burst comes after this much of the reply has played (reported with x.playback)
MAX_SILENCE_MS = 2000  # turn.max_silence_ms (auto eagerness)


# --------------------------------------------------------------------------- the set
#: Events too frequent to list per burst.
_CHATTY = frozenset({"response.output_audio.delta", "response.output_audio_transcript.delta",
                     "conversation.item.input_audio_transcription.delta"})


def build_set(cfg, coughs: int, human: Path) -> tuple[list[dict], list[np.ndarray], np.ndarray]:
    """(turns, cough bursts, the interruption), each turn ``{name, kind, pcm}`` (16 kHz int16)."""
    from bench.turn_set import SET_KINDS, TurnSet, asked, questions, set_texts, trim

    ts = TurnSet.from_config(cfg)
    clips = ts.build(coughs=coughs)
    turns = [{"name": c.name, "kind": c.kind, "pcm": c.pcm, "asked": asked(c.name)}
             for c in clips + ts.held_apart() if c.kind in SET_KINDS]
    gap = np.zeros(RATE * 300 // 1000, np.int16)
    for name, kind, parts in questions():
        pcm = np.concatenate([x for p in parts for x in (trim(ts.say(p)), gap)][:-1])
        turns.append({"name": name, "kind": kind, "pcm": pcm})
    assert [t["name"] for t in turns] == [t["name"] for t in set_texts()]  # one order for both
    turns += human_turns(human)
    return turns, [c.pcm for c in clips if c.kind == "cough"], trim(ts.say(INTERRUPTION))


#: Debian's alsa-utils speaker-test voices: a person saying "Front center", "Rear left", ... (48 kHz).
ALSA_SOUNDS = Path("/usr/share/sounds/alsa")


def human_voices(folder: Path = ALSA_SOUNDS) -> list[Path]:
    """The alsa-utils voice recordings in ``folder`` (not its ``Noise.wav``), sorted; [] without them."""
    return sorted(f for f in folder.glob("*.wav") if f.stem != "Noise")


def read_voice(path: Path) -> np.ndarray:
    """A mono int16 WAV file resampled to 16 kHz (untrimmed)."""
    import wave

    import soxr

    with wave.open(str(path)) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
        rate = w.getframerate()
    return soxr.resample(pcm, rate, RATE)


def human_turns(folder: Path = ALSA_SOUNDS) -> list[dict]:
    """The alsa-utils voices in ``folder`` as turns of kind ``human`` (16 kHz, trimmed); none, with a
    note, without them."""
    from bench.turn_set import trim

    files = human_voices(folder)
    if not files:
        print(f"note: no human recordings ({folder} has none: apt-get install alsa-utils)", flush=True)
    return [{"name": f"human-{f.stem}", "kind": "human", "pcm": trim(read_voice(f))} for f in files]


def end_of_turn_cost(cfg, turns: list[dict], calls: int = 40) -> dict:
    """ms per ``EndOfTurnModel.score`` call (one thread, as the server runs it): features and ONNX apart."""
    from asr.end_of_turn import EndOfTurnModel, window

    model = EndOfTurnModel.from_config(cfg)
    model.warmup()
    feats, total = [], []
    for i in range(calls):
        pcm = turns[i % len(turns)]["pcm"]
        t0 = time.perf_counter()
        model.features(window(pcm))
        t1 = time.perf_counter()
        model.score(pcm)
        t2 = time.perf_counter()
        feats.append(1000 * (t1 - t0))
        total.append(1000 * (t2 - t1))
    return {"calls": calls, "threads": cfg.turn.threads, "score_p50_ms": pct(total, 50), "score_p90_ms": pct(total, 90),
            "features_p50_ms": pct(feats, 50), "load_average": os.getloadavg()}


# --------------------------------------------------------------------------- one talker
class Talker:
    """One session: a microphone streaming in real time, and every server event with its arrival time."""

    def __init__(self, client, noise_dbfs: float | None = None, seed: int = 0) -> None:
        self.client = client
        self.events: list[tuple[float, object]] = []
        self.arrived = asyncio.Event()
        # silence (or noise) continuously, speech on demand, 20 ms frames in real time
        self.mic = Mic(client, RATE, noise_dbfs, seed)
        self.reader = asyncio.create_task(self._read())

    def say(self, pcm: np.ndarray) -> asyncio.Future:
        """Speak ``pcm``; resolves to the monotonic time its last frame was sent."""
        return self.mic.say(pcm)

    @property
    def speech_start(self) -> float | None:
        """When the first frame of the last ``say`` was sent."""
        return self.mic.speech_start

    async def _read(self) -> None:
        async for event in self.client.events():
            self.events.append((time.monotonic(), event))
            self.arrived.set()

    async def until(self, since: int, match, timeout_s: float) -> tuple[float, object]:
        """The first event at index >= ``since`` that ``match``es; TimeoutError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        i = since
        while True:
            while i < len(self.events):
                if match(self.events[i][1]):
                    return self.events[i]
                i += 1
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), max(0.01, deadline - time.monotonic()))

    def reply_audio(self, rid: str, start: int, stop: int | None = None) -> list[tuple[float, object]]:
        """Audio deltas of response ``rid`` among the events from ``start`` (to ``stop``)."""
        return [(t, e) for t, e in self.events[start:stop] if e.type == "response.output_audio.delta"
                and e.response_id == rid]

    def audio_ms(self, deltas: list[tuple[float, object]]) -> float:
        return 1000 * sum(len(e.pcm) for _, e in deltas) / self.client.session.output_rate

    def since(self, index: int, etype: str | None) -> list[tuple[float, object]]:
        """Events from ``index`` on, of type ``etype`` (None: all)."""
        return [(t, e) for t, e in self.events[index:] if etype is None or e.type == etype]

    async def close(self) -> None:
        await self.mic.stop()
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)


async def settle(talker: Talker, since: int, speech_end: float, timeout_s: float) -> list[str]:
    """Wait until the turn is over: a response exists, none is running, and nothing happened for a while
    (a split turn's second commit may follow its first reply). Returns the response ids, in order."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = time.monotonic()
        created = [e.response.id for _, e in talker.since(since, "response.created")]
        done = {e.response.id for _, e in talker.since(since, "response.done")}
        last = max([t for t, e in talker.events[since:] if e.type != "response.output_audio.delta"], default=0.0)
        if created and set(created) <= done and now - last > QUIET_S and now - speech_end > QUIET_S + 1.0:
            return created
        if now > deadline:
            raise TimeoutError
        await asyncio.sleep(0.05)


async def ask(talker: Talker, question: str, timeout_s: float) -> None:
    """The assistant's ``question`` added to the conversation (``conversation.item.create``), as if it
    had just said it: a short answer is spoken after the question it answers."""
    from realtime import events as ev
    from realtime.items import ContentPart, MessageItem

    since = len(talker.events)
    item = MessageItem(role="assistant", content=(ContentPart(type="output_text", text=question),))
    await talker.client.send_event(ev.ConversationItemCreate(item=item))
    await talker.until(since, lambda e: e.type in ("conversation.item.added", "error"), timeout_s)


async def one_turn(talker: Talker, turn: dict, timeout_s: float) -> dict:
    if turn.get("asked"):
        await ask(talker, turn["asked"], timeout_s)
    since = len(talker.events)
    speech_end = await talker.say(turn["pcm"])
    row = {"name": turn["name"], "kind": turn["kind"], "missed": False, "split": False}
    try:
        responses = await settle(talker, since, speech_end, timeout_s)
    except TimeoutError:
        responses = []
        row["missed"] = True
    commits = talker.since(since, "input_audio_buffer.committed")
    created = talker.since(since, "response.created")
    row["commits"] = len(commits)
    if commits:  # the turn's end as the client sees it: VAD, end-of-turn model and transcript, no reply
        row["commit_after_speech_end_ms"] = round(1000 * (commits[-1][0] - speech_end), 1)
    row["split"] = len(commits) > 1 or any(t < speech_end for t, _ in created)
    # a split mended by the server: the first part's user item deleted, the whole answered once
    row["mended"] = row["split"] and bool(talker.since(since, "conversation.item.deleted"))
    if responses:
        rid = responses[-1]
        audio = talker.reply_audio(rid, since)
        done = next(e for _, e in talker.since(since, "response.done") if e.response.id == rid)
        row["status"] = done.response.status
        if audio:
            row["voice_to_voice_ms"] = round(1000 * (audio[0][0] - speech_end), 1)
            await talker.client.report_playback(audio[0][1].item_id, talker.audio_ms(audio), finished=True)
        else:
            row["missed"] = True
    transcripts = [e.transcript for _, e in talker.since(since, "conversation.item.input_audio_transcription.completed")]
    row["user_transcript"] = " / ".join(transcripts)
    metrics = [e.metrics for _, e in talker.since(since, "x.turn.metrics")]
    if metrics:
        row["end_of_turn"] = metrics[-1].get("end_of_turn")
        row["end_of_turn_ms"] = metrics[-1].get("end_of_turn_ms")
        row["stages_ms"] = metrics[-1].get("stages_ms")
        # each response's (a split turn has several): the sound's and the words' scores of its commit
        row["scores"] = [(m.get("end_of_turn"), m.get("words_end_of_turn")) for m in metrics]
        if "llm_prompt_tokens" in metrics[-1]:  # what the LLM read for this turn (not from its sequence)
            row["llm_prompt_evaluated"] = metrics[-1]["llm_prompt_tokens"] - metrics[-1].get("llm_cached_tokens", 0)
            row["llm_prompt_tokens"] = metrics[-1]["llm_prompt_tokens"]  # the history the prompt step attends to
        if "llm_engine_first_token_ms" in metrics[-1]:  # submit -> first token inside the engine
            row["llm_engine_first_token_ms"] = metrics[-1]["llm_engine_first_token_ms"]
    row["reply_paused"] = len(talker.since(since, "x.output_audio_buffer.paused"))  # speech over a reply?
    return row


def burst_outcome(reply_done: bool, received_ms: float, heard_by_ms: float, started: bool, paused: bool,
                  resumed: bool, cut: bool) -> str:
    """What a burst over a reply did to it (module doc). ``heard_by_ms``: the reply's audio played by
    the time the VAD could hear the burst; a reply that was done and had no more audio than that was
    over: ``reply_over``, the burst met nothing to pause (not a trial)."""
    if reply_done and received_ms <= heard_by_ms and not paused and not cut:
        return "reply_over"
    if resumed:
        return "resumed"
    if cut or (started and not paused):  # without a pause a client stops playback at speech_started
        return "cut"
    if paused:
        return "paused"  # never resolved: a bug
    return "unaffected"


async def over_reply(talker: Talker, sound: np.ndarray, kind: str, timeout_s: float) -> dict:
    """Start a long reply, let it play ~1.5 s, make ``sound`` over it; what happened to the reply?"""
    since = len(talker.events)
    await talker.client.send_text("Tell me about the sea.")
    _, first = await talker.until(since, lambda e: e.type == "response.output_audio.delta", timeout_s)
    rid, item = first.response_id, first.item_id
    await asyncio.sleep(PLAYED_MS / 1000)
    await talker.client.report_playback(item, PLAYED_MS)
    mark = len(talker.events)
    spoken_end = await talker.say(sound)
    await asyncio.sleep(2.5)  # long enough for a pause to be resolved
    if kind.startswith("interruption"):  # and for its answer to start
        try:
            await talker.until(mark, lambda e: e.type == "response.output_audio.delta" and e.response_id != rid,
                               timeout_s)
        except TimeoutError:
            pass
    received_ms = talker.audio_ms(talker.reply_audio(rid, since, mark))
    reply_done = any(e.type == "response.done" and e.response.id == rid for _, e in talker.events[since:mark])
    started = talker.since(mark, "input_audio_buffer.speech_started")
    paused = talker.since(mark, "x.output_audio_buffer.paused")
    resumed = talker.since(mark, "x.output_audio_buffer.resumed")
    cut = talker.since(mark, "x.output_audio_buffer.cleared") + [
        (t, e) for t, e in talker.since(mark, "response.done") if e.response.id == rid and e.response.status == "cancelled"]
    # What had played by the time the VAD could hear the burst (its start run: ~100 ms, + margin).
    heard_by_ms = PLAYED_MS + 300
    outcome = burst_outcome(reply_done, received_ms, heard_by_ms, bool(started), bool(paused), bool(resumed), bool(cut))
    row = {"kind": kind, "outcome": outcome, "sound_ms": round(1000 * len(sound) / RATE),
           "reply_received_ms": round(received_ms),
           # what the server said about the burst: its events and, if it became a turn, its words
           "events": [e.type for _, e in talker.since(mark, None) if e.type not in _CHATTY],
           "heard": [e.transcript for _, e in talker.since(mark, "conversation.item.input_audio_transcription.completed")]}
    if resumed:
        row["paused_ms"] = round(1000 * (resumed[0][0] - paused[0][0]), 1)
    answer = [t for t, e in talker.since(mark, "response.output_audio.delta") if e.response_id != rid]
    if kind.startswith("interruption") and answer:
        row["interruption_v2v_ms"] = round(1000 * (answer[0] - spoken_end), 1)
        commits = talker.since(mark, "input_audio_buffer.committed")
        if commits:
            row["commit_after_speech_end_ms"] = round(1000 * (commits[-1][0] - spoken_end), 1)
    stop = (paused or started)[:1]
    if stop and talker.speech_start:  # playback stops at the pause (semantic_vad) or speech_started
        row["stop_after_speech_start_ms"] = round(1000 * (stop[0][0] - talker.speech_start), 1)
    if cut and talker.speech_start:
        row["cut_after_speech_start_ms"] = round(1000 * (min(t for t, _ in cut) - talker.speech_start), 1)
    if not any(e.response.id == rid for _, e in talker.since(since, "response.done")):
        await talker.client.cancel_response(rid)
    await asyncio.sleep(1.0)
    return row


async def conversation(url: str, mode: str, turns: list[dict], seed: int, timeout_s: float,
                       noise_dbfs: float | None = None) -> list[dict]:
    """One conversation of ``turns`` in ``mode`` (a new connection)."""
    from voxloop.client import RealtimeClient

    rows = []
    async with RealtimeClient.connect(url) as client:
        await client.update_session(instructions=SHORT, audio={"input": {"turn_detection": MODES[mode]}})
        talker = Talker(client, noise_dbfs, seed)
        try:
            await asyncio.sleep(0.5)
            for t in turns:
                rows.append(dict(await one_turn(talker, t, timeout_s), mode=mode, session=seed))
                print(f"{mode} {rows[-1]['name']}: split {rows[-1]['split']}, "
                      f"voice-to-voice {rows[-1].get('voice_to_voice_ms')} ms", flush=True)
        finally:
            await talker.close()
    return rows


async def over_replies(url: str, mode: str, coughs: list[np.ndarray], interruption: np.ndarray | None,
                       seed: int, timeout_s: float, noise_dbfs: float | None = None,
                       interruptions: int = 1) -> list[dict]:
    """The bursts over a playing reply, in a conversation of their own."""
    from voxloop.client import RealtimeClient

    bursts: list[dict] = []
    if not coughs and (interruption is None or interruptions < 1):
        return bursts
    # A fresh conversation: after dozens of one-sentence answers a small LLM keeps answering in
    # one sentence, and a reply over before the burst leaves nothing to pause.
    async with RealtimeClient.connect(url) as client:
        await client.update_session(instructions=LONG, audio={"input": {"turn_detection": MODES[mode]}})
        talker = Talker(client, noise_dbfs, seed)
        try:
            await asyncio.sleep(0.5)
            for i, burst in enumerate(coughs):
                bursts.append(dict(await over_reply(talker, burst, f"cough-{i}", timeout_s), mode=mode))
            for i in range(interruptions if interruption is not None else 0):
                bursts.append(dict(await over_reply(talker, interruption, f"interruption-{i}", timeout_s),
                                   mode=mode))
        finally:
            await talker.close()
    return bursts


async def level(urls: dict[str, str], talkers: int, turns: list[dict], coughs, interruption, timeout_s: float,
                noise_dbfs: float | None = None, interruptions: int = 1,
                session_turns: int | None = None) -> dict[str, tuple[list[dict], list[dict], dict]]:
    """Every mode of ``urls`` (mode -> server) at ``talkers`` talkers: per mode its turns, its bursts and
    its servers' counter deltas. The modes take turns by conversation (the first conversation in each
    mode, then the second, the order reversed every other time), so a drift of the machine over the
    run weighs on every mode alike; the bursts come after all the turns."""
    alone = talkers == 1  # bursts over a reply: one talker (the many-talker levels measure turns)
    plans = [conversations(turns, seed, session_turns) for seed in range(talkers)]
    modes = list(urls)
    out: dict[str, tuple[list[dict], list[dict], dict]] = {m: ([], [], {}) for m in modes}

    async def counted(mode: str, work) -> list[dict]:  # noqa: ANN001 - a coroutine
        before = _scrape(urls[mode])
        rows = await work
        _add_counts(out[mode][2], before, _scrape(urls[mode]))
        return rows

    async def staggered(work, seed: int):  # noqa: ANN001, ANN202 - talkers do not start in step
        await asyncio.sleep(random.Random(seed).uniform(0, 2.0) if not alone else 0.0)
        return await work

    for k in range(max(len(p) for p in plans)):
        for mode in (modes if k % 2 == 0 else modes[::-1]):
            work = asyncio.gather(*(staggered(conversation(urls[mode], mode, p[k], seed, timeout_s, noise_dbfs), seed)
                                    for seed, p in enumerate(plans) if k < len(p)))
            for rows in await counted(mode, work):
                out[mode][0].extend(dict(r, talkers=talkers) for r in rows)
    if alone:
        for mode in modes:
            bursts = await counted(mode, over_replies(urls[mode], mode, coughs, interruption, 0, timeout_s,
                                                      noise_dbfs, interruptions))
            out[mode][1].extend(dict(b, talkers=talkers) for b in bursts)
    return out


def _add_counts(total: dict, before: dict | None, after: dict | None) -> None:
    """Add one conversation's ``server_counts`` to ``total`` (None for good once a read failed; a
    counter not there yet grew by 0)."""
    counts = server_counts(before, after)
    for key, value in counts.items():
        failed = before is None or after is None or (key in total and total[key] is None)
        total[key] = None if failed else total.get(key, 0) + (value or 0)


def summarize(mode: str, talkers: int, rows: list[dict], bursts: list[dict]) -> dict:
    ok = [r for r in rows if not r["missed"] and not r["split"]]
    out = {"mode": mode, "talkers": talkers, "turns": len(rows),
           "missed_turns": sum(r["missed"] for r in rows), "split_turns": sum(r["split"] for r in rows)}
    for kind in ("all", "complete", "paused", "filler", "question", "paused_question", "human", "midpause", "short"):
        vals = [r["voice_to_voice_ms"] for r in ok if kind == "all" or r["kind"] == kind]
        out[f"v2v_{kind}_p50_ms"], out[f"v2v_{kind}_p90_ms"] = pct(vals, 50), pct(vals, 90)
    vals = [r["voice_to_voice_ms"] for r in ok if r["kind"] in COMPLETE_KINDS]
    out["v2v_complete_turns_p50_ms"], out["v2v_complete_turns_p90_ms"] = pct(vals, 50), pct(vals, 90)
    for kind in ("paused", "filler", "paused_question", "midpause", "short", "complete", "question"):
        out[f"split_{kind}"] = sum(r["split"] for r in rows if r["kind"] == kind)
    mid = [r for r in rows if r["kind"] == "midpause"]
    out["false_cutoffs"] = f"{sum(r['split'] for r in mid)}/{len(mid)}"
    out["mended_turns"] = sum(r.get("mended", False) for r in rows)
    waits = [r.get("commit_after_speech_end_ms") or 0 for r in rows if r["kind"] in COMPLETE_KINDS]
    out["complete_commit_max_ms"] = max(waits, default=None)
    out["complete_waited_max_silence"] = sum(w >= MAX_SILENCE_MS - 100 for w in waits)
    commit = [r["commit_after_speech_end_ms"] for r in ok if r.get("commit_after_speech_end_ms") is not None]
    out["commit_p50_ms"], out["commit_p90_ms"] = pct(commit, 50), pct(commit, 90)
    eot = [r["end_of_turn_ms"] for r in rows if r.get("end_of_turn_ms") is not None]
    out["end_of_turn_call_p50_ms"], out["end_of_turn_call_p90_ms"] = pct(eot, 50), pct(eot, 90)
    coughs = [b for b in bursts if b["kind"].startswith("cough")]
    for outcome in ("resumed", "cut", "paused", "unaffected", "reply_over"):
        out[f"cough_{outcome}"] = sum(b["outcome"] == outcome for b in coughs)
    out["cough_paused_max_ms"] = max((b.get("paused_ms", 0) for b in coughs), default=None)
    spoken = [b for b in bursts if b["kind"].startswith("interruption")]
    out["interruption_v2v_ms"] = [b.get("interruption_v2v_ms") for b in spoken]
    out["interruption_cut"] = sum(b["outcome"] == "cut" for b in spoken)
    out["interruption_cut_after_ms"] = [b.get("cut_after_speech_start_ms") for b in spoken]
    out["interruption_stop_after_ms"] = [b.get("stop_after_speech_start_ms") for b in spoken]
    out["interruption_trials"] = len(spoken)
    prompt = [r["llm_prompt_evaluated"] for r in rows if r.get("llm_prompt_evaluated") is not None]
    out["llm_prompt_evaluated_p50"] = pct(prompt, 50)
    return out


def server_counts(before: dict | None, after: dict | None) -> dict:
    """From the server's ``/metrics`` around a conversation: speculative turns dropped unseen (``discarded``:
    speech resumed, or a burst that was no turn; each had queued an ASR run) and ASR runs (finals,
    speculative ones, partials, words of bursts), and the words' probes read from a reply's prompt
    (``shared``) or on their own (``alone``). None when a read failed."""
    if before is None or after is None:
        return dict.fromkeys(("server_discarded_turns", "server_asr_runs", "server_probes_shared",
                              "server_probes_alone"))
    probes = "voxloop_llm_end_of_turn_probes_total"
    return {"server_discarded_turns": counter_delta(before, after, "voxloop_turns_total", (("status", "discarded"),)),
            "server_asr_runs": counter_delta(before, after, "voxloop_asr_utterances_total"),
            "server_probes_shared": counter_delta(before, after, probes, (("read", "shared"),)),
            "server_probes_alone": counter_delta(before, after, probes, (("read", "alone"),))}


def _scrape(url: str) -> dict | None:
    try:
        return scrape_metrics(metrics_url(url))
    except (OSError, ValueError) as exc:
        print(f"/metrics: {exc}", flush=True)
        return None


def plot(summary: list[dict], rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for s in summary:
        vals = sorted(r["voice_to_voice_ms"] for r in rows if r["mode"] == s["mode"] and r["talkers"] == s["talkers"]
                      and not r["missed"] and not r["split"])
        if vals:
            a.plot(vals, np.linspace(0, 1, len(vals)), label=f"{s['mode']}, {s['talkers']} talker(s)")
    a.axvline(700, ls="--", c="grey", lw=0.8)
    a.set_xlabel("voice-to-voice, ms (true end of speech -> first reply audio)")
    a.set_ylabel("fraction of turns (not split, not missed)")
    a.legend(fontsize=8)
    labels = [f"{s['mode']}\nN={s['talkers']}" for s in summary]
    x = np.arange(len(summary))
    b.bar(x - 0.2, [s["split_turns"] for s in summary], 0.4, label="split turns")
    b.bar(x + 0.2, [s["missed_turns"] for s in summary], 0.4, label="missed turns")
    b.set_xticks(x, labels, fontsize=8)
    b.set_title("turns answered too early / not at all")
    b.legend(fontsize=8)
    fig.suptitle(f"voxloop turn taking - {hardware()['cpu']} x{os.cpu_count()}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    from base.config import load_config

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--talkers", type=int, nargs="+", default=[1])
    p.add_argument("--coughs", type=int, default=10, help="cough trials per mode (first talker)")
    p.add_argument("--interruptions", type=int, default=1, help="spoken interruption trials per mode (first talker)")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--turn-timeout-s", type=float, default=30.0)
    p.add_argument("--url", help="use a running server instead of starting one")
    p.add_argument("--server-arg", action="append", default=[])
    p.add_argument("--name", default="turn_taking", help="result file name prefix")
    p.add_argument("--limit", type=int, help="only the first N turns of the set (a quick check)")
    p.add_argument("--kinds", nargs="+", help="only turns of these kinds (complete, paused, filler, question, "
                   "paused_question, human, midpause, short)")
    p.add_argument("--many-limit", type=int, default=8, help="turns per talker when there are several talkers")
    p.add_argument("--human-dir", type=Path, default=ALSA_SOUNDS, help="folder of the alsa-utils voices (.wav)")
    p.add_argument("--noise-dbfs", type=float, help="white noise under everything the microphones send, dBFS RMS")
    p.add_argument("--session-turns", type=int, help="a new conversation every N turns (default: one for all): "
                   "modes compared over the same short histories, not over a long one each drifts apart in "
                   "(a small LLM's reply length follows its history)")
    add_output_arguments(p)
    args = p.parse_args(argv)
    turns, coughs, interruption = build_set(load_config(), args.coughs, args.human_dir)
    turns = [t for t in turns if args.kinds is None or t["kind"] in args.kinds]
    turns = turns[:args.limit] if args.limit else turns
    load_before = os.getloadavg()
    cost = end_of_turn_cost(load_config(), turns)
    print("end-of-turn model, one call:", cost, flush=True)
    servers, urls = {}, {}  # one server per set of settings, all up for the whole run
    all_rows, all_bursts, summary = [], [], []
    try:
        for mode in args.modes:
            settings = MODE_SERVER.get(mode, ())
            if args.url is None and settings not in servers:
                port = free_port()
                servers[settings] = (start_server(port, [*args.server_arg, *settings]),
                                     f"ws://127.0.0.1:{port}/v1/realtime")
            urls[mode] = args.url or servers[settings][1]
        for talkers in args.talkers:
            level_turns = turns if talkers == 1 else random.Random(8).sample(turns, min(args.many_limit, len(turns)))
            results = asyncio.run(level(urls, talkers, level_turns, coughs, interruption, args.turn_timeout_s,
                                        args.noise_dbfs, args.interruptions, args.session_turns))
            for mode, (rows, bursts, counts) in results.items():
                all_rows += rows
                all_bursts += bursts
                summary.append(summarize(mode, talkers, rows, bursts) | counts)
                print(summary[-1], flush=True)
    finally:
        for server, _ in servers.values():
            stop_server(server)
    path = write_json(args.name, summary, {"end_of_turn_cost": cost, "turns": all_rows, "bursts": all_bursts, "server_args": portable_args(args.server_arg),
                                           "noise_dbfs": args.noise_dbfs,
                                           "human_recordings": sum(t["kind"] == "human" for t in turns),
                                           "load_average_before": load_before, "load_average_after": os.getloadavg()},
                      out=args.out)
    plot(summary, all_rows, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
