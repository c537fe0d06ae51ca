"""The talkers of the voice-loop benchmarks: scripted speech at real-time pace, one turn at a time.

Used by ``bench.voice_latency`` (one server) and ``bench.scaleout`` (replicas behind a load
balancer). Each talker speaks the turns of ``bench/voice_questions.txt`` (speech from the bundled
voice, streamed like a microphone in 20 ms frames at 24 kHz, silence between turns), waits for the
reply, "plays" it (reporting x.playback) and goes on; talkers are spread over spawned client
processes (``run_level``). ``summarize`` turns their turn rows into a level's figures (missed
turns, voice-to-voice and processing percentiles, the stage marks of x.turn.metrics).
"""

from __future__ import annotations

import asyncio
import collections
import random
import re
import subprocess
import time
from dataclasses import dataclass

import numpy as np

from websockets.asyncio.client import connect

from bench.harness import ROOT, Mic, pct, run_client_processes
from voxloop.client import RealtimeClient

RATE = 24000
STAGES = ("asr_start", "asr_final", "llm_first_token", "first_clause", "tts_first_audio", "first_audio_sent")



def load_questions() -> list[str]:
    lines = (ROOT / "bench" / "voice_questions.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def synthesize_questions(questions: list[str]) -> dict[str, np.ndarray]:
    """Speech for each question at 24 kHz (the voice's default noise: natural prosody)."""
    from tts_engine.cpu_engine import OnnxTtsEngine
    from tts_engine.engine import SynthesisOptions
    from base.config import load_config

    engine = OnnxTtsEngine.from_config(load_config())
    opts = SynthesisOptions(sample_rate=RATE)
    pause = np.zeros(RATE * 300 // 1000, np.int16)
    out = {}
    for q in questions:
        parts = []
        for i, piece in enumerate(q.split(" | ")):
            if i:
                parts.append(pause)
            # Trimmed per piece: the pause is exactly 300 ms of silence, not 300 ms plus the
            # voice's own sentence-final silence.
            parts.append(_trim(np.concatenate([c.pcm for c in engine.synthesize(piece, opts)])))
        out[q] = _trim(np.concatenate(parts))
    return out


def _trim(pcm: np.ndarray) -> np.ndarray:
    loud = np.flatnonzero(np.abs(pcm) > 300)
    return pcm[loud[0]:loud[-1] + 1] if len(loud) else pcm


_DIGITS = "zero one two three four five six seven eight nine ten".split()


def words(text: str) -> list[str]:
    """Lower-case words, small numbers spelled out (whisper writes "2", the script says "two")."""
    out = re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()
    return [_DIGITS[int(w)] if w.isdigit() and int(w) <= 10 else w for w in out]


# ---------------------------------------------------------------- one talker


@dataclass(frozen=True)
class Level:
    """What the talkers of one level do (pickled to each client process)."""

    url: str
    talkers: int
    turns: int
    timeout_s: float
    binary: bool  # audio as binary frames (else JSON/base64)
    deflate: bool  # offer permessage-deflate
    ramp_s: float  # talker k starts at about k * ramp_s / talkers


async def talker(level: Level, speech: dict[str, np.ndarray], index: int, t0: float) -> list[dict]:
    """Talker ``index``: connects at its place in the ramp (monotonic ``t0`` + offset), speaks its turns.

    A connection that fails or drops leaves the turns not taken as missed.
    """
    rng = random.Random(index)
    order = list(speech)
    rng.shuffle(order)
    rows: list[dict] = []
    # Evenly over the ramp, jittered within each talker's slot: talkers do not start in lockstep.
    await asyncio.sleep(max(0.0, t0 + level.ramp_s * (index + rng.random()) / level.talkers - time.monotonic()))
    try:
        async with RealtimeClient.connect(level.url, binary_audio=level.binary) as client:
            if client.session.x_binary_audio != level.binary:
                raise RuntimeError(f"session.x_binary_audio is {client.session.x_binary_audio}")
            deflate = client.compressed  # negotiated
            mic = Mic(client, RATE)
            try:
                for n in range(level.turns):
                    row = await one_turn(client, mic, order[n % len(order)], speech, rng, level.timeout_s)
                    rows.append(dict(row, deflate=deflate))
            finally:
                await mic.stop()
    except Exception as exc:  # noqa: BLE001 - a bench records, it does not stop
        why = f"session failed: {type(exc).__name__}: {exc}"[:200]
        rows += [{"question": None, "missed": True, "why": why} for _ in range(level.turns - len(rows))]
    return rows


async def one_turn(client, mic: Mic, q: str, speech: dict[str, np.ndarray], rng: random.Random,
                   timeout_s: float) -> dict:
    """Say ``q`` after a short pause, collect the reply, listen to it; the turn's row."""
    await asyncio.sleep(rng.uniform(0.3, 1.0))
    end_future = mic.say(speech[q])
    row = {"question": q.replace(" | ", " "), "missed": False}
    try:
        reply = await client.collect_response(timeout_s=timeout_s, metrics_timeout_s=2.0)
        speech_end = await end_future
    except (TimeoutError, Exception) as exc:  # noqa: BLE001 - a bench records, it does not stop
        return dict(row, missed=True, why=f"{type(exc).__name__}: {exc}"[:200], mic_late_max_ms=mic.take_late_max_ms())
    heard = words(reply.user_transcript or "")
    # A split turn answers only the first part: far fewer words than were said.
    split = len(heard) < 0.6 * len(words(q))
    row.update(
        status=reply.status, user_transcript=reply.user_transcript, reply=reply.transcript,
        audio_s=round(reply.audio_s, 2),
        voice_to_voice_ms=round((reply.first_audio_at - speech_end) * 1000, 1) if reply.first_audio_at else None,
        processing_ms=reply.metrics.get("processing_ms"),
        stages_ms=reply.metrics.get("stages_ms", {}),
        speculative=bool(reply.metrics.get("speculative")),
        # Prompt tokens the LLM evaluated for this turn (the rest was cached), and
        # how many conversations shared the llama_decode step of its first token.
        llm_prompt_evaluated=_evaluated(reply.metrics), llm_batch=reply.metrics.get("llm_batch"),
        reason=reply.reason, mic_late_max_ms=mic.take_late_max_ms(),
    )
    answered = reply.status == "completed" or (reply.status, reply.reason) == ("incomplete", "max_output_tokens")
    if not answered or split or row["voice_to_voice_ms"] is None:
        row.update(missed=True, why="split" if split else f"status {reply.status}")
    # Listen to the reply (wall time of its audio), telling the server what was played.
    if reply.item_id and reply.first_audio_at:
        played_until = reply.first_audio_at + reply.audio_s
        await asyncio.sleep(max(0.0, played_until - time.monotonic()))
        await client.report_playback(reply.item_id, reply.audio_s * 1000, finished=True)
    return row


def _evaluated(metrics: dict) -> int | None:
    if "llm_prompt_tokens" not in metrics:
        return None
    return int(metrics["llm_prompt_tokens"]) - int(metrics.get("llm_cached_tokens", 0))


# ---------------------------------------------------------------- client processes


def offer_deflate() -> None:
    """Make ``RealtimeClient`` offer permessage-deflate, as browsers and the openai SDK do.

    The client connects with ``compression=None`` (it never needs deflate); the bench wants the
    server to pay what it pays for browsers (inflating what they send, deflating text events).
    """
    import voxloop.client

    def connect_offering_deflate(*args, **kwargs):
        return connect(*args, **{**kwargs, "compression": "deflate"})

    voxloop.client.ws_connect = connect_offering_deflate


def client_process(indices: list[int], level: Level, speech: dict[str, np.ndarray], t0: float) -> list[dict]:
    """The talkers ``indices`` of one client process (run by ``run_client_processes``); their turn rows."""
    if level.deflate:
        offer_deflate()

    async def main() -> list[list[dict]]:
        return await asyncio.gather(*(talker(level, speech, i, t0) for i in indices))

    return [dict(r, session=i) for i, rs in zip(indices, asyncio.run(main()), strict=True) for r in rs]


def run_level(level: Level, speech: dict, per_process: int) -> tuple[list[dict], int]:
    """All talkers of one level over ``ceil(talkers / per_process)`` processes; (turn rows, processes)."""
    n_procs = min(level.talkers, -(-level.talkers // per_process))
    groups = [list(range(p, level.talkers, n_procs)) for p in range(n_procs)]  # each spans the ramp
    turn_s = 1.0 + 10.0 + level.timeout_s + 60.0  # pause, speech, reply, its playback
    results = run_client_processes(client_process, groups, (level, speech), level.ramp_s + level.turns * turn_s + 60)
    rows = []
    for group, (ok, payload) in zip(groups, results, strict=True):
        if ok:
            rows += payload
        else:  # the whole process is lost: so are its talkers' turns
            rows += [{"question": None, "missed": True, "why": str(payload)[:200], "session": i}
                     for i in group for _ in range(level.turns)]
    return [dict(r, concurrency=level.talkers) for r in rows], n_procs


# ---------------------------------------------------------------- figures


def summarize(concurrency: int, rows: list[dict]) -> dict:
    ok = [r for r in rows if not r["missed"]]
    v2v = [r["voice_to_voice_ms"] for r in ok]
    proc = [r["processing_ms"] for r in ok if r.get("processing_ms") is not None]
    late = [r["mic_late_max_ms"] for r in rows if r.get("mic_late_max_ms") is not None]
    why = collections.Counter(r.get("why", "").split(":")[0] for r in rows if r["missed"])
    out = {
        "concurrency": concurrency, "turns": len(rows), "missed_turns": len(rows) - len(ok),
        "missed_why": dict(why.most_common(5)),
        "voice_to_voice_p50_ms": pct(v2v, 50), "voice_to_voice_p90_ms": pct(v2v, 90),
        "voice_to_voice_p99_ms": pct(v2v, 99),
        "processing_p50_ms": pct(proc, 50), "processing_p90_ms": pct(proc, 90), "processing_p99_ms": pct(proc, 99),
        "speculative_share": round(sum(r["speculative"] for r in ok) / max(len(ok), 1), 2),
        # How late the clients sent a microphone frame at worst (p99 of each turn's worst): past
        # a few ms the client processes, not the server, are the bottleneck.
        "client_frame_late_p99_ms": pct(late, 99),
        "sessions_with_deflate": len({r["session"] for r in rows if r.get("deflate")}),
    }
    for stage in STAGES:
        vals = [r["stages_ms"][stage] for r in ok if stage in r["stages_ms"]]
        for q in (50, 90, 99):
            out[f"{stage}_p{q}_ms"] = pct(vals, q)
    for key in ("llm_prompt_evaluated", "llm_batch"):
        vals = [r[key] for r in ok if r.get(key) is not None]
        out[f"{key}_p50"], out[f"{key}_p90"], out[f"{key}_max"] = pct(vals, 50), pct(vals, 90), max(vals, default=None)
    return out


def gpu_info() -> list[str] | None:
    """``nvidia-smi``'s name, memory and driver of each GPU; None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] or None

