"""Voice-to-voice latency of the whole loop, with N scripted talkers at real-time pace.

Starts ``voxloop serve`` as a separate process (the real models; ``--server-config``) or
uses a running one (``--url``). N sessions each speak the turns of
``bench/voice_questions.txt`` (speech from the bundled voice, streamed like a microphone in
20 ms frames at 24 kHz, silence between turns), wait for the reply, "play" it (wall-clock
time of its audio, reported with x.playback) and go on.

Talkers are spread over client processes (spawned, at least one per
``--talkers-per-process`` talkers, 16 by default), so the clients' own work shares neither
one GIL nor the server's cores more than it must, and they start one after another over
``--ramp-s`` seconds, not all in the same 20 ms. Each connects as browsers do
(permessage-deflate offered) and sends its microphone as ``input_audio_buffer.append`` with
base64 audio (``--audio-format json``: what OpenAI-style clients send) or as binary frames
(``binary``: the fast path, ``session.x_binary_audio``; reply audio then comes back binary).

Per turn:

  voice_to_voice = first reply audio received - last speech sample sent (client clock)
  processing     = first audio sent - VAD end decision (server's x.turn.metrics)

plus the stage marks of x.turn.metrics (ASR final, LLM first token, first clause, first
audio), ms after the VAD end decision. A turn is *missed* when no reply arrives within
``--turn-timeout-s``, the reply is neither completed nor cut at the token limit
(``incomplete``/``max_output_tokens``: the user heard an answer, the model ran long), or the
utterance was split (the transcript misses its last words or two replies come back for one
utterance). Per level, the server's ``/metrics`` is read before and after: GPU pool and
per-stage memory, LLM steps (tokens per ``llama_decode`` step over the level), event-loop
lag; null where the server does not export them (a CPU server has no GPU pool).

Writes ``<out>/voice_latency-<hardware>-<date>[-<label>].json`` (+ .png: p50/p90/p99 against
talkers, end to end and per stage). ``--merge`` joins result files of one level each into one.

    python -m bench.voice_latency --concurrency 1 8 --turns 10 3
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import json
import random
import re
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from websockets.asyncio.client import connect

from bench.harness import (
    Mic,
    ROOT,
    add_output_arguments,
    counter_delta,
    free_port,
    gauge,
    hardware_tag,
    histogram_delta,
    metrics_url,
    pct,
    portable_args,
    run_client_processes,
    scrape_metrics,
    start_server,
    stop_server,
    write_json,
)
from voxloop.client import RealtimeClient

RATE = 24000
STAGES = ("asr_start", "asr_final", "llm_first_token", "first_clause", "tts_first_audio", "first_audio_sent")
#: The stages drawn against talkers: the issue's breakdown (ASR final -> first audio on the socket).
PLOTTED_STAGES = ("asr_final", "llm_first_token", "first_clause", "first_audio_sent")


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
            deflate = bool(client._ws.protocol.extensions)  # negotiated (see _offer_deflate)
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


def _offer_deflate() -> None:
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
        _offer_deflate()

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


def scrape(url: str) -> dict | str:
    """The server's ``/metrics`` samples, or why they could not be read."""
    try:
        return scrape_metrics(metrics_url(url))
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


def _ratio(num: float | None, den: float | None, scale: float = 1.0) -> float | None:
    return None if num is None or not den else round(scale * num / den, 2)


def server_figures(before: dict | str, after: dict | str) -> dict:
    """The server's figures over a level from the ``/metrics`` read before and after it.

    GPU memory (MiB) is read after the level; counters are differences over the level. With
    several front-end processes the LLM's figures are those of the process that answered.
    A figure the server does not export is None, as is every figure when a read failed.
    """
    error = next((s for s in (before, after) if isinstance(s, str)), None)
    if error is not None:
        before = after = {}
    lag = histogram_delta(before, after, "voxloop_event_loop_lag_seconds")
    steps = counter_delta(before, after, "voxloop_llm_steps_total")
    tokens = counter_delta(before, after, "voxloop_llm_evaluated_tokens_total", (("kind", "all"),))
    prompt = counter_delta(before, after, "voxloop_llm_evaluated_tokens_total", (("kind", "prompt"),))
    mib = 2**20
    return {
        "gpu_pool_mib": gauge(after, "voxloop_gpu_pool_bytes", mib),
        "gpu_stage_mib": gauge(after, "voxloop_gpu_stage_bytes", mib),
        "gpu_device_used_mib": gauge(after, "voxloop_gpu_device_used_bytes", mib),
        "llm_memory_mib": gauge(after, "voxloop_llm_memory_bytes", mib),
        "llm_last_batch": gauge(after, "voxloop_llm_last_batch"),
        "llm_steps": steps,
        "llm_tokens_per_step_mean": _ratio(tokens, steps),
        # Generated tokens per step: each running reply adds one, so ~ sequences per step.
        "llm_decode_tokens_per_step_mean": _ratio(None if tokens is None or prompt is None else tokens - prompt, steps),
        "event_loop_lag_mean_ms": _ratio(lag["mean"], 1, 1000),
        "event_loop_lag_p99_le_ms": _ratio(lag["p99_le"], 1, 1000),
        "server_turns": _deltas(before, after, "voxloop_turns_total"),
        "server_errors": _deltas(before, after, "voxloop_errors_total"),
        "server_metrics_error": error,
    }


def _deltas(before: dict, after: dict, name: str) -> dict[str, float | None] | None:
    """Growth of each sample of a counter with one label, by label value (None if absent)."""
    got = after.get(name, {})
    return {"/".join(v for _, v in k): counter_delta(before, after, name, k) for k in got} or None


def plot(summary: list[dict], turns: list[dict], path: Path, title: str) -> None:
    """Voice-to-voice CDF per level; p50/p90/p99 against talkers, end to end and per stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(18, 5))
    for row in summary:
        n = row["concurrency"]
        vals = sorted(t["voice_to_voice_ms"] for t in turns if t["concurrency"] == n and not t["missed"])
        if vals:
            a.plot(vals, np.linspace(0, 1, len(vals)), label=f"{n} talker(s)")
    a.set_xlabel("voice-to-voice latency, ms (end of speech -> first reply audio)")
    a.set_ylabel("fraction of turns")
    a.axvline(900, ls="--", c="grey", lw=0.8)
    a.legend()
    a.set_title("Voice-to-voice CDF")
    x = [r["concurrency"] for r in summary]
    styles = {50: "-", 90: "--", 99: ":"}
    for ax, names in ((b, ("voice_to_voice", "processing")), (c, PLOTTED_STAGES)):
        for k, name in enumerate(names):
            for q, ls in styles.items():
                y = [np.nan if r.get(f"{name}_p{q}_ms") is None else r[f"{name}_p{q}_ms"] for r in summary]
                ax.plot(x, y, ls, marker="o", color=f"C{k}", label=f"{name} p{q}")
        if len(x) > 1 and max(x) / min(x) > 8:
            ax.set_xscale("log")
        ax.set_xticks(x, [str(n) for n in x])
        ax.set_xlabel("concurrent talkers")
        ax.legend(fontsize=7)
    b.set_ylabel("ms")
    b.set_title("End to end: p50 / p90 / p99")
    c.set_ylabel("ms after the VAD end decision")
    c.set_title("Per stage: p50 / p90 / p99 (speculative work starts before 0)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------- the run


def gpu_info() -> list[str] | None:
    """``nvidia-smi``'s name, memory and driver of each GPU; None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] or None


def server_record(args: argparse.Namespace, url: str) -> dict:
    """Which server was measured: URL, config file (path and settings), extra arguments."""
    path = args.server_config or (None if args.url else Path("configs/default.toml"))
    return {
        "server_url": url, "server_started_by_bench": args.url is None, "server_args": portable_args(args.server_arg),
        "server_config": None if path is None else {
            "path": str(path), "settings": tomllib.loads((ROOT / path).read_text(encoding="utf-8"))},
    }


def result_file(args: argparse.Namespace) -> Path:
    args.out.mkdir(parents=True, exist_ok=True)
    return args.out / f"voice_latency-{args.hardware}-{args.date}{'-' + args.label if args.label else ''}.json"


def wait_ready(ws_url: str, timeout_s: float) -> None:
    """Wait until the running server's ``/ready`` answers 200 (a GPU server loads for minutes)."""
    import urllib.request

    url = metrics_url(ws_url).rsplit("/", 1)[0] + "/ready"
    deadline = time.monotonic() + timeout_s
    why = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError as exc:
            why = str(exc)
        time.sleep(1)
    raise SystemExit(f"{url} not ready within {timeout_s:g} s ({why})")


def measure(args: argparse.Namespace) -> tuple[list[dict], list[dict], dict]:
    """Run every level; (summary rows, turn rows, what was measured)."""
    turns_per_level = args.turns * len(args.concurrency) if len(args.turns) == 1 else args.turns
    speech = synthesize_questions(load_questions())
    server, url = None, args.url
    if url is None:
        port = free_port()
        config = ["--config", str(args.server_config)] if args.server_config else []
        server = start_server(port, [*config, *args.server_arg])
        url = f"ws://127.0.0.1:{port}/v1/realtime"
    else:
        wait_ready(url, args.ready_timeout_s)
    audio_format = "binary/pcm16@24000" if args.audio_format == "binary" else "json/base64@24000"
    summary, all_rows = [], []
    try:
        for talkers, turns in zip(args.concurrency, turns_per_level, strict=True):
            ramp = args.ramp_s if args.ramp_s is not None else max(2.0, 0.05 * talkers)
            level = Level(url, talkers, turns, args.turn_timeout_s, args.audio_format == "binary", args.deflate, ramp)
            before = scrape(url)
            rows, n_procs = run_level(level, speech, args.talkers_per_process)
            row = summarize(talkers, rows)
            row.update(client_processes=n_procs, audio_format=audio_format, permessage_deflate_offered=args.deflate,
                       ramp_s=ramp, **server_figures(before, scrape(url)))
            summary.append(row)
            all_rows += rows
            print(json.dumps(row), flush=True)
    finally:
        if server is not None:
            stop_server(server)
    return summary, all_rows, server_record(args, url)


def merge(paths: list[Path]) -> tuple[list[dict], list[dict], dict]:
    """The levels of several result files as one result (sorted by talkers)."""
    docs = [json.loads(Path(p).read_text(encoding="utf-8")) for p in paths]
    summary = sorted((r for d in docs for r in d["rows"]), key=lambda r: r["concurrency"])
    turns = [t for d in docs for t in d.get("turns", [])]
    keep = ("server_url", "server_started_by_bench", "server_args", "server_config", "gpu", "hardware")
    return summary, turns, {**{k: docs[0].get(k) for k in keep},
                            "merged_from": [{"file": str(p), "date": d.get("date"), "command": d.get("command")}
                                            for p, d in zip(paths, docs, strict=True)]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="talkers, per level")
    p.add_argument("--turns", type=int, nargs="+", default=[10, 3],
                   help="turns per talker, per level (one value: the same for every level)")
    p.add_argument("--turn-timeout-s", type=float, default=30.0)
    p.add_argument("--talkers-per-process", type=int, default=16, help="talkers per client process at most")
    p.add_argument("--ramp-s", type=float, help="seconds over which the talkers start (default: 2, or 50 ms per talker)")
    p.add_argument("--audio-format", choices=("json", "binary"), default="json",
                   help="microphone audio as JSON/base64 appends or binary frames (the fast path)")
    p.add_argument("--deflate", action=argparse.BooleanOptionalAction, default=True,
                   help="offer permessage-deflate, as browsers do")
    p.add_argument("--url", help="ws://host:port/v1/realtime of a running server instead of starting one")
    p.add_argument("--ready-timeout-s", type=float, default=600.0,
                   help="with --url: wait this long for the server's /ready before the first level")
    p.add_argument("--server-config", type=Path,
                   help="the server's TOML config: given to the server started here, recorded with --url")
    p.add_argument("--server-arg", action="append", default=[], help="extra args before `serve`, e.g. --set=x.y=z")
    add_output_arguments(p)
    p.add_argument("--hardware", default=hardware_tag(), help="hardware name in the file name (default: %(default)s)")
    p.add_argument("--date", default=dt.date.today().isoformat(), help="date in the file name")
    p.add_argument("--label", help="suffix of the file name, e.g. 200-binary")
    p.add_argument("--merge", type=Path, nargs="+", metavar="JSON", help="join these result files instead of running")
    args = p.parse_args(argv)
    if args.merge:
        summary, all_rows, extra = merge(args.merge)
    else:
        summary, all_rows, extra = measure(args)
        extra["gpu"] = gpu_info()
    path = write_json("voice_latency", summary, {**extra, "turns": all_rows}, path=result_file(args))
    gpu = (extra.get("gpu") or ["no GPU"])[0]
    plot(summary, all_rows, path.with_suffix(".png"), f"voxloop voice latency - {args.hardware} ({gpu})")
    print(f"wrote {path} and {path.with_suffix('.png').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
