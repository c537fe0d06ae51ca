"""Voice-to-voice latency of the whole loop, with N scripted talkers at real-time pace.

Starts ``voxloop serve`` as a separate process (the real models), then N sessions
each speak the turns of ``bench/voice_questions.txt`` (speech from the bundled
voice, streamed like a microphone in 20 ms frames, silence between turns), wait
for the reply, "play" it (wall-clock time of its audio, reported with x.playback)
and go on. Per turn:

  voice_to_voice = first reply audio received - last speech sample sent (client clock)
  processing     = first audio sent - VAD end decision (server's x.turn.metrics)

A turn is *missed* when no reply arrives within ``--turn-timeout-s``, the reply is
not completed, or the utterance was split (the transcript misses its last words or
two replies come back for one utterance).

Writes bench/results/voice_latency-<hardware>-<date>.json (+ .png).

    python -m bench.voice_latency --concurrency 1 8 --turns 10 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import sys
import time
from pathlib import Path

import numpy as np

from bench.harness import ROOT, free_port, hardware, pct, start_server, stop_server, write_json

RATE = 24000
STAGES = ("asr_start", "asr_final", "llm_first_token", "first_clause", "tts_first_audio", "first_audio_sent")


def load_questions() -> list[str]:
    lines = (ROOT / "bench" / "voice_questions.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def synthesize_questions(questions: list[str]) -> dict[str, np.ndarray]:
    """Speech for each question at 24 kHz (the voice's default noise: natural prosody)."""
    from tts_engine.cpu_engine import OnnxTtsEngine
    from tts_engine.engine import SynthesisOptions
    from voxloop.config import load_config

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


class Mic:
    """Streams silence continuously (like an open microphone) and speech on demand."""

    def __init__(self, client) -> None:
        self.client = client
        self.queue: list[np.ndarray] = []
        self.speech_end: asyncio.Future | None = None
        self.task = asyncio.create_task(self._run())

    def say(self, pcm: np.ndarray) -> asyncio.Future:
        self.speech_end = asyncio.get_running_loop().create_future()
        self.queue.append(pcm)
        return self.speech_end

    async def _run(self) -> None:
        step = RATE * 20 // 1000
        silence = np.zeros(step, np.int16)
        t_next = time.monotonic()
        pending = np.zeros(0, np.int16)
        while True:
            if not len(pending) and self.queue:
                pending = self.queue.pop(0)
            piece, pending = (pending[:step], pending[step:]) if len(pending) else (silence, pending)
            t_next += step / RATE
            await asyncio.sleep(max(0.0, t_next - time.monotonic()))
            await self.client.send_audio(piece, RATE)
            if piece is not silence and not len(pending) and self.speech_end and not self.speech_end.done():
                self.speech_end.set_result(time.monotonic())

    async def stop(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass


async def talker(url: str, speech: dict[str, np.ndarray], turns: int, seed: int, timeout_s: float) -> list[dict]:
    from voxloop.client import RealtimeClient

    rng = random.Random(seed)
    order = list(speech)
    rng.shuffle(order)
    rows = []
    await asyncio.sleep(rng.uniform(0, 2.0))  # talkers do not start in lockstep
    async with RealtimeClient.connect(url) as client:
        mic = Mic(client)
        try:
            for n in range(turns):
                q = order[n % len(order)]
                await asyncio.sleep(rng.uniform(0.3, 1.0))
                end_future = mic.say(speech[q])
                row = {"question": q.replace(" | ", " "), "missed": False}
                try:
                    reply = await client.collect_response(timeout_s=timeout_s, metrics_timeout_s=2.0)
                    speech_end = await end_future
                except (TimeoutError, Exception) as exc:  # noqa: BLE001 - a bench records, it does not stop
                    row.update(missed=True, why=f"{type(exc).__name__}: {exc}"[:200])
                    rows.append(row)
                    continue
                heard = words(reply.user_transcript or "")
                # A split turn answers only the first part: far fewer words than were said.
                split = len(heard) < 0.6 * len(words(q))
                row.update(
                    status=reply.status, user_transcript=reply.user_transcript, reply=reply.transcript,
                    audio_s=round(reply.audio_s, 2),
                    voice_to_voice_ms=round((reply.first_audio_at - speech_end) * 1000, 1)
                    if reply.first_audio_at else None,
                    processing_ms=reply.metrics.get("processing_ms"),
                    stages_ms=reply.metrics.get("stages_ms", {}),
                    speculative=bool(reply.metrics.get("speculative")),
                )
                if reply.status != "completed" or split or row["voice_to_voice_ms"] is None:
                    row.update(missed=True, why="split" if split else f"status {reply.status}")
                # Listen to the reply (wall time of its audio), telling the server what was played.
                if reply.item_id and reply.first_audio_at:
                    played_until = reply.first_audio_at + reply.audio_s
                    await asyncio.sleep(max(0.0, played_until - time.monotonic()))
                    await client.report_playback(reply.item_id, reply.audio_s * 1000, finished=True)
                rows.append(row)
        finally:
            await mic.stop()
    return rows


def summarize(concurrency: int, rows: list[dict]) -> dict:
    ok = [r for r in rows if not r["missed"]]
    v2v = [r["voice_to_voice_ms"] for r in ok]
    proc = [r["processing_ms"] for r in ok if r.get("processing_ms") is not None]
    out = {
        "concurrency": concurrency, "turns": len(rows), "missed_turns": len(rows) - len(ok),
        "voice_to_voice_p50_ms": pct(v2v, 50), "voice_to_voice_p90_ms": pct(v2v, 90),
        "voice_to_voice_p99_ms": pct(v2v, 99),
        "processing_p50_ms": pct(proc, 50), "processing_p90_ms": pct(proc, 90), "processing_p99_ms": pct(proc, 99),
        "speculative_share": round(sum(r["speculative"] for r in ok) / max(len(ok), 1), 2),
    }
    for stage in STAGES:
        vals = [r["stages_ms"][stage] for r in ok if stage in r["stages_ms"]]
        out[f"{stage}_p50_ms"] = pct(vals, 50)
    return out


def plot(summary: list[dict], turns: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for row in summary:
        c = row["concurrency"]
        vals = sorted(t["voice_to_voice_ms"] for t in turns if t["concurrency"] == c and not t["missed"])
        if vals:
            a.plot(vals, np.linspace(0, 1, len(vals)), label=f"{c} talker(s)")
    a.set_xlabel("voice-to-voice latency, ms (end of speech -> first reply audio)")
    a.set_ylabel("fraction of turns")
    a.axvline(900, ls="--", c="grey", lw=0.8)
    a.legend()
    a.set_title("Voice-to-voice CDF")
    labels = [f"N={r['concurrency']}" for r in summary]
    prev = np.zeros(len(summary))
    for stage in STAGES:
        cur = np.array([max(r.get(f"{stage}_p50_ms") or 0.0, 0.0) for r in summary])
        b.bar(labels, np.maximum(cur - prev, 0), bottom=prev, label=stage)
        prev = np.maximum(prev, cur)
    b.set_ylabel("ms after the VAD end decision (p50)")
    b.set_title("Where the time goes (speculative work starts before 0)")
    b.legend(fontsize=7)
    fig.suptitle(f"voxloop voice latency - {hardware()['cpu']} x{os.cpu_count()}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def run_level(url: str, speech: dict, concurrency: int, turns: int, timeout_s: float) -> list[dict]:
    results = await asyncio.gather(*(talker(url, speech, turns, seed, timeout_s) for seed in range(concurrency)))
    rows = [dict(r, concurrency=concurrency, session=i) for i, rs in enumerate(results) for r in rs]
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--turns", type=int, nargs="+", default=[10, 3], help="turns per session, per level")
    p.add_argument("--turn-timeout-s", type=float, default=30.0)
    p.add_argument("--url", help="use a running server instead of starting one")
    p.add_argument("--server-arg", action="append", default=[], help="extra args before `serve`, e.g. --set=x.y=z")
    args = p.parse_args(argv)
    speech = synthesize_questions(load_questions())
    server = None
    url = args.url
    if url is None:
        port = free_port()
        server = start_server(port, args.server_arg)
        url = f"ws://127.0.0.1:{port}/v1/realtime"
    try:
        all_rows: list[dict] = []
        summary = []
        for level, turns in zip(args.concurrency, args.turns, strict=True):
            rows = asyncio.run(run_level(url, speech, level, turns, args.turn_timeout_s))
            all_rows += rows
            summary.append(summarize(level, rows))
            print(summary[-1], flush=True)
    finally:
        if server is not None:
            stop_server(server)
    path = write_json("voice_latency", summary, {"turns": all_rows, "server_args": args.server_arg})
    plot(summary, all_rows, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
