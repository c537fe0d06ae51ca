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
lag; null where the server does not export them (a CPU server has no GPU pool). Through a load
balancer (``--url`` of the balancer, ``--replica-metrics`` the replicas' ``/metrics``), each level
also reports each replica's sessions, turns and GPU memory, and how evenly the sessions were split
(``bench.scaleout.gpus`` runs the whole one-GPU-against-two comparison).

Writes ``<out>/voice_latency-<hardware>-<date>[-<label>].json`` (+ .png: p50/p90/p99 against
talkers, end to end and per stage). ``--merge`` joins result files of one level each into one.

    python -m bench.voice_latency --concurrency 1 8 --turns 10 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import tomllib
from pathlib import Path

import numpy as np

from bench.harness import (
    ROOT,
    add_output_arguments,
    counter_delta,
    free_port,
    gauge,
    hardware_tag,
    histogram_delta,
    metrics_url,
    portable_args,
    scrape_metrics,
    start_server,
    stop_server,
    write_json,
)
from bench.scaleout.replicas import replica_figures, scrape_or_none, split
from bench.voice_talkers import Level, gpu_info, load_questions, run_level, summarize, synthesize_questions

#: The stages drawn against talkers: the issue's breakdown (ASR final -> first audio on the socket).
PLOTTED_STAGES = ("asr_final", "llm_first_token", "first_clause", "first_audio_sent")


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
            before, replicas_before = scrape(url), [scrape_or_none(u) for u in args.replica_metrics]
            rows, n_procs = run_level(level, speech, args.talkers_per_process)
            row = summarize(talkers, rows)
            row.update(client_processes=n_procs, audio_format=audio_format, permessage_deflate_offered=args.deflate,
                       ramp_s=ramp, **server_figures(before, scrape(url)))
            if args.replica_metrics:  # behind a load balancer: what each replica saw of the level
                row["replicas"] = [{"replica": u, **replica_figures(b, scrape_or_none(u))}
                                   for u, b in zip(args.replica_metrics, replicas_before, strict=True)]
                row["sessions_split"] = split(row["replicas"])
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
    p.add_argument("--replica-metrics", nargs="+", default=[], metavar="URL",
                   help="with --url of a load balancer: each replica's http://HOST:PORT/metrics; every level then "
                        "reports each replica's sessions, turns and GPU memory (bench.scaleout.replicas)")
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
