"""Soak: N scripted talkers against one ``voxloop serve`` for a duration; does anything grow?

Starts the server (real models) as its own process and N talkers, each in its own client
process. A talker keeps its microphone open (20 ms frames, silence between questions) and
loops over: voice turns (``bench/voice_questions.txt`` spoken by the bundled voice), barge-ins
(a second question spoken over the reply), push-to-talk turns, ``x.tts.speak`` requests,
hang-ups in the middle of a reply, and a reconnect every few actions. Every ``--sample-s``
the parent samples the server: RSS and USS (psutil), open files, threads, and from
``/metrics`` its asyncio tasks, outbox sizes, open sessions, turns and (on CUDA) the GPU pool.
After the talkers stop, sampling goes on for ``--idle-s`` with no session open.

A turn is *missed* when its reply does not end within ``--turn-timeout-s`` as ``completed``
(or ``incomplete`` at ``max_output_tokens``: a whole reply cut at ``llm.max_tokens``), or an
``x.tts.speak`` does not complete. Summary: RSS at the end of ``--warmup-s`` (the warm
level), the largest deviation from it under load, the slope after warm-up, the level after
all sessions closed, and the ranges of threads, files and tasks.

Writes OUT/soak-<hardware>-<date>.json (+ .png).

    python -m bench.soak --talkers 4 --duration-s 3600 --warmup-s 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np

from bench.harness import ROOT, add_output_arguments, free_port, hardware, portable_args, start_server, stop_server, write_json

RATE = 24000  # Hz, the talkers' microphone
FRAME = RATE * 20 // 1000  # samples per 20 ms frame
ACTIONS = {"voice": 5, "barge_in": 1, "push_to_talk": 2, "speak": 2, "hang_up": 1}
SPEAK_TEXT = "This is a notification read aloud, with no language model involved."


# --------------------------------------------------------------------------- talker (own process)
def speech_for_questions() -> dict[str, np.ndarray]:
    """Each question of voice_questions.txt spoken by the bundled voice (24 kHz int16, trimmed)."""
    from tts_engine.cpu_engine import OnnxTtsEngine
    from tts_engine.engine import SynthesisOptions
    from base.config import load_config

    lines = (ROOT / "bench" / "voice_questions.txt").read_text().splitlines()
    questions = [ln.strip().replace(" | ", " ") for ln in lines if ln.strip() and not ln.startswith("#")]
    engine = OnnxTtsEngine.from_config(load_config())
    out = {}
    for q in questions:
        pcm = np.concatenate([c.pcm for c in engine.synthesize(q, SynthesisOptions(sample_rate=RATE))])
        loud = np.flatnonzero(np.abs(pcm) > 300)
        out[q] = pcm[loud[0]:loud[-1] + 1] if len(loud) else pcm
    return out


class Microphone:
    """An open microphone: 20 ms frames at real-time pace, silence unless ``say`` queued speech."""

    def __init__(self, client) -> None:
        self.client = client
        self.pending = np.zeros(0, np.int16)
        self.on = asyncio.Event()
        self.on.set()
        self.idle = asyncio.Event()  # set while no frame is being sent
        self.idle.set()
        self.task = asyncio.create_task(self._run())

    def say(self, pcm: np.ndarray) -> None:
        self.pending = np.concatenate([self.pending, pcm, np.zeros(RATE // 2, np.int16)])

    async def mute(self) -> None:
        """Stop sending (push-to-talk); returns once no frame is in flight."""
        self.on.clear()
        await self.idle.wait()

    def unmute(self) -> None:
        self.on.set()

    async def _run(self) -> None:
        due = time.monotonic()
        while True:
            if not self.on.is_set():
                await self.on.wait()
                due = time.monotonic()
            piece, self.pending = self.pending[:FRAME], self.pending[FRAME:]
            if len(piece) < FRAME:
                piece = np.concatenate([piece, np.zeros(FRAME - len(piece), np.int16)])
            due += FRAME / RATE
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            self.idle.clear()
            try:
                await self.client.send_audio(piece, RATE)
            finally:
                self.idle.set()

    async def close(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - a closed connection ends it too
            pass


async def listen(client, reply) -> None:
    """"Play" the reply (its audio's wall-clock length) and tell the server it was heard."""
    if reply.item_id and reply.first_audio_at:
        await asyncio.sleep(max(0.0, reply.first_audio_at + reply.audio_s - time.monotonic()))
        await client.report_playback(reply.item_id, reply.audio_s * 1000, finished=True)


def answered(reply) -> bool:  # noqa: ANN001 - voxloop.client.Reply
    """A reply that ended as asked: completed, or cut at ``llm.max_tokens`` (incomplete, max_output_tokens)."""
    return reply.status == "completed" or (reply.status, reply.reason) == ("incomplete", "max_output_tokens")


async def act(action: str, client, mic: Microphone, speech: dict, rng: random.Random, timeout_s: float) -> str | None:
    """Run one scripted action; returns why it missed, or None."""
    question = rng.choice(list(speech))
    if action == "voice":
        mic.say(speech[question])
        reply = await client.collect_response(timeout_s=timeout_s)
        await listen(client, reply)
        return None if answered(reply) else f"voice: {reply.status} {reply.reason}"
    if action == "barge_in":
        mic.say(speech[question])
        await client.wait_for("response.output_audio.delta", timeout_s)
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        mic.say(speech[rng.choice(list(speech))])  # talk over the reply
        # The rest of the first reply (cancelled, unless it was short), with its x.turn.metrics.
        first = await client.collect_response(timeout_s=timeout_s)
        reply = await client.collect_response(timeout_s=timeout_s)
        await listen(client, reply)
        if not answered(reply):
            return f"barge_in: second reply {reply.status} {reply.reason} (first {first.status} {first.reason})"
        return None
    if action == "push_to_talk":
        await mic.mute()
        await client.update_session(audio={"input": {"turn_detection": None}})
        await client.send_audio(speech[question], RATE)
        await client.commit()
        reply = await client.collect_response(timeout_s=timeout_s)
        await listen(client, reply)
        await client.update_session(audio={"input": {"turn_detection": {"type": "server_vad"}}})
        mic.unmute()
        return None if answered(reply) else f"push_to_talk: {reply.status} {reply.reason}"
    if action == "speak":
        result = await client.speak(SPEAK_TEXT, timeout_s=timeout_s)
        return None if result.status == "completed" and result.audio_ms > 0 else f"speak: {result.status}"
    if action == "hang_up":  # leave in the middle of a reply: the server must clean up
        mic.say(speech[question])
        await client.wait_for("response.output_audio.delta", timeout_s)
        return "hang_up"
    raise ValueError(action)


async def talk(url: str, speech: dict, until: float, seed: int, timeout_s: float) -> dict:
    from voxloop.client import RealtimeClient

    rng = random.Random(seed)
    counts: Counter = Counter()
    problems: list[str] = []
    await asyncio.sleep(rng.uniform(0, 3))  # talkers do not start in lockstep
    while time.time() < until:
        counts["connections"] += 1
        try:
            async with RealtimeClient.connect(url) as client:
                mic = Microphone(client)
                try:
                    for _ in range(rng.randint(3, 6)):  # then hang up and reconnect
                        if time.time() >= until:
                            break
                        action = rng.choices(list(ACTIONS), list(ACTIONS.values()))[0]
                        counts[action] += 1
                        try:
                            why = await act(action, client, mic, speech, rng, timeout_s)
                        except Exception as exc:  # noqa: BLE001 - a bench records, it does not stop
                            why = f"{action}: {type(exc).__name__}: {exc}"[:300]
                        if why == "hang_up":
                            break
                        if why is not None:
                            counts["missed"] += 1
                            problems.append(why)
                            break  # the connection's state is unknown: start a fresh one
                finally:
                    await mic.close()
        except Exception as exc:  # noqa: BLE001
            counts["connect_failures"] += 1
            problems.append(f"connect: {type(exc).__name__}: {exc}"[:300])
            await asyncio.sleep(1)
    return {"seed": seed, "counts": dict(counts), "problems": problems}


def talker_main(args: argparse.Namespace) -> int:
    data = np.load(args.speech)
    speech = {name: data[name] for name in data.files}  # arr_0, arr_1…: one per question
    result = asyncio.run(talk(args.talker, speech, args.until, args.seed, args.turn_timeout_s))
    Path(args.talker_out).write_text(json.dumps(result))
    return 0


# --------------------------------------------------------------------------- sampler (parent)
def scrape(port: int) -> dict[str, float]:
    """The /metrics gauges the soak follows (missing ones are left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    depth_buckets: dict[float, float] = {}  # outbox depth histogram: upper bound -> connections
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = s.labels
            if s.name == "voxloop_asyncio_tasks":
                out["asyncio_tasks"] = s.value
            elif s.name == "voxloop_outbox_depth_messages_gsum":
                out["outbox_sum"] = s.value
            elif s.name == "voxloop_outbox_depth_messages_bucket":
                depth_buckets[float(labels["le"])] = s.value
            elif s.name == "voxloop_sessions_active":
                out["sessions"] = s.value
            elif s.name == "voxloop_turns_total":
                out[f"turns_{labels['status']}"] = s.value
            elif s.name == "voxloop_tts_requests_total":
                out["tts_requests"] = s.value
            elif s.name == "voxloop_malloc_heap_bytes":
                out[f"malloc_{labels['kind']}_mb"] = round(s.value / 2**20, 1)
            elif s.name == "voxloop_python_allocated_blocks":
                out["python_blocks"] = s.value
            elif s.name == "voxloop_gpu_pool_bytes" and labels == {"kind": "used", "stat": "current"}:
                out["gpu_pool_used_mb"] = round(s.value / 2**20, 1)
    if depth_buckets:  # the deepest outbox, as the smallest bucket bound holding every connection
        everyone = depth_buckets[float("inf")]
        out["outbox_max"] = min(b for b, n in depth_buckets.items() if n >= everyone)
    return out


def sample(proc, port: int, t0: float, phase: str) -> dict:
    import psutil

    p = psutil.Process(proc.pid)
    with p.oneshot():
        row = {"t_s": round(time.monotonic() - t0, 1), "phase": phase,
               "rss_mb": round(p.memory_info().rss / 2**20, 1),
               "uss_mb": round(p.memory_full_info().uss / 2**20, 1),
               "open_files": p.num_fds(), "threads": p.num_threads(),
               "cpu_s": round(sum(p.cpu_times()[:2]), 1)}
    try:
        row.update(scrape(port))
    except OSError as exc:
        row["scrape_error"] = str(exc)
    return row


class Sampler(threading.Thread):
    def __init__(self, proc, port: int, every_s: float) -> None:
        super().__init__(daemon=True)
        self.proc, self.port, self.every_s = proc, port, every_s
        self.phase = "start"
        self.rows: list[dict] = []
        self.t0 = time.monotonic()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            row = sample(self.proc, self.port, self.t0, self.phase)
            self.rows.append(row)
            print(json.dumps(row), flush=True)
            self.stopping.wait(self.every_s)


def _range(rows: list[dict], key: str) -> list[float] | None:
    vals = [r[key] for r in rows if key in r]
    return [min(vals), max(vals)] if vals else None


def summarize(rows: list[dict], warmup_s: float, talkers: list[dict]) -> dict:
    load = [r for r in rows if r["phase"] == "load"]
    warm = [r for r in load if r["t_s"] >= warmup_s]
    idle = [r for r in rows if r["phase"] == "idle"]
    counts: Counter = Counter()
    for t in talkers:
        counts.update(t["counts"])
    out: dict = {"talker_counts": dict(counts), "missed_turns": counts.get("missed", 0),
                 "problems": [p for t in talkers for p in t["problems"]][:20]}
    if warm:
        level = warm[0]["rss_mb"]
        rss = np.array([r["rss_mb"] for r in warm])
        t_h = np.array([r["t_s"] for r in warm]) / 3600
        out.update(
            warm_rss_mb=level,
            rss_deviation_after_warmup_pct=[round(100 * (rss.min() - level) / level, 1),
                                            round(100 * (rss.max() - level) / level, 1)],
            rss_slope_after_warmup_mb_per_h=round(float(np.polyfit(t_h, rss, 1)[0]), 1) if len(warm) > 2 else None,
        )
        if idle:
            out["idle_rss_mb"] = idle[-1]["rss_mb"]
            out["idle_vs_warm_pct"] = round(100 * (idle[-1]["rss_mb"] - level) / level, 1)
    for phase, part in (("start", [r for r in rows if r["phase"] == "start"]), ("after_warmup", warm), ("idle", idle)):
        out[phase] = {k: _range(part, k) for k in ("rss_mb", "uss_mb", "malloc_in_use_mb", "malloc_free_mb",
                                                    "python_blocks", "threads", "open_files", "asyncio_tasks",
                                                    "outbox_max", "sessions", "gpu_pool_used_mb")
                      if _range(part, k) is not None}
    return out


def plot(rows: list[dict], warmup_s: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t_s"] / 60 for r in rows]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    panels = [("Memory, MiB", ("rss_mb", "uss_mb", "malloc_in_use_mb", "malloc_free_mb", "gpu_pool_used_mb")),
              ("Threads and open files", ("threads", "open_files")),
              ("Event loop", ("asyncio_tasks", "outbox_sum", "sessions")),
              ("Turns (cumulative)", ("turns_completed", "turns_cancelled", "turns_failed", "tts_requests"))]
    for ax, (title, keys) in zip(axes.flat, panels, strict=True):
        for key in keys:
            if any(key in r for r in rows):
                ax.plot(t, [r.get(key, np.nan) for r in rows], label=key, marker=".", ms=3)
        ax.axvline(warmup_s / 60, ls="--", c="grey", lw=0.8)
        idle = [r["t_s"] / 60 for r in rows if r["phase"] == "idle"]
        if idle:
            ax.axvspan(idle[0], idle[-1], color="grey", alpha=0.12)
        ax.set_title(title)
        ax.legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("minutes (dashed: end of warm-up; grey: all sessions closed)")
    fig.suptitle(f"voxloop soak - {hardware()['cpu']} x{hardware()['cores']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--talkers", type=int, default=4)
    p.add_argument("--duration-s", type=float, default=3600.0, help="how long the talkers talk")
    p.add_argument("--warmup-s", type=float, default=300.0, help="RSS is judged from the end of this")
    p.add_argument("--idle-s", type=float, default=60.0, help="sampling after every session closed")
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--turn-timeout-s", type=float, default=60.0)
    p.add_argument("--server-arg", action="append", default=[], help="extra args before `serve`, e.g. --set=x.y=z")
    p.add_argument("--name", default="soak", help="result file prefix")
    # A talker process (started by the soak itself).
    p.add_argument("--talker", help=argparse.SUPPRESS)
    p.add_argument("--speech", help=argparse.SUPPRESS)
    p.add_argument("--until", type=float, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--talker-out", help=argparse.SUPPRESS)
    add_output_arguments(p)
    args = p.parse_args(argv)
    if args.talker:
        return talker_main(args)

    with tempfile.TemporaryDirectory() as tmp:
        speech_file = Path(tmp) / "speech.npz"
        np.savez(speech_file, *speech_for_questions().values())
        port = free_port()
        server = start_server(port, args.server_arg)
        sampler = Sampler(server, port, args.sample_s)
        sampler.start()
        try:
            time.sleep(min(args.sample_s, 5))
            sampler.phase = "load"
            until = time.time() + args.duration_s
            url = f"ws://127.0.0.1:{port}/v1/realtime"
            procs = [subprocess.Popen([sys.executable, "-m", "bench.soak", "--talker", url, "--speech", str(speech_file),
                                       "--until", str(until), "--seed", str(i), "--talker-out", f"{tmp}/talker{i}.json",
                                       "--turn-timeout-s", str(args.turn_timeout_s)], cwd=ROOT)
                     for i in range(args.talkers)]
            for proc in procs:
                proc.wait(timeout=args.duration_s + 4 * args.turn_timeout_s + 120)
            sampler.phase = "idle"
            time.sleep(args.idle_s)
            sampler.stopping.set()
            sampler.join()
            talkers = [json.loads(Path(f"{tmp}/talker{i}.json").read_text()) for i in range(args.talkers)
                       if Path(f"{tmp}/talker{i}.json").exists()]
        finally:
            sampler.stopping.set()
            stop_server(server)
    summary = summarize(sampler.rows, args.warmup_s, talkers)
    print(json.dumps(summary, indent=2))
    path = write_json(args.name, sampler.rows, {
        "talkers": args.talkers, "duration_s": args.duration_s, "warmup_s": args.warmup_s, "idle_s": args.idle_s,
        "server_args": portable_args(args.server_arg), "summary": summary}, out=args.out)
    plot(sampler.rows, args.warmup_s, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
