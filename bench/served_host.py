"""Host side of the served GPU TTS path: ``voxloop serve`` with ``configs/gpu.toml`` (front-end
processes sharing one engine process) and a GPU that takes no time (the ceiling) or a fixed time
per launch (``--launch-ms``).

The server runs as configured, TTS only, with one thing replaced: its engine's step runner is
``bench.instant_runner.InstantRunner`` (an orchestration stand-in: launches that return at once or
keep their lane busy ``--launch-ms``, every sentence ``--frames`` frames of silence at the configured output rate, rows shaped as the
real runner's). Everything else a served sentence costs is the product's own: the WebSocket and its
JSON/base64 audio deltas, the front end's text front end (espeak-ng phonemes), the link to the
engine process, the engine's ``BatchScheduler`` thread and the hand-out to the front ends. Clients
are ``bench.ws_clients`` (``x.tts.speak`` from separate processes, JSON/base64 at 24 kHz,
permessage-deflate offered), the load bench's own.

Per level, first the reference: the same engine and stand-in in this process, driven as
``bench.tts_load``'s engine mode drives the GPU engine (``mode: engine``); then served (``mode: ws``):
sentences per second and latencies as the clients see them, served as a share of the reference
(``served_of_engine_pct``: how close served comes to the engine alone, the GPU's time taken out),
and each role's CPU time per sentence, ms (user + system over the measured window, psutil): the engine process, the front ends
together, the client processes together. On a machine with fewer cores than the roles keep busy the
sentences per second are this machine's; the CPU per sentence is what carries over to a larger host:
a role whose CPU per sentence is ``c`` ms on one core (the engine process's scheduler and link
share one interpreter lock) cannot serve more than ``1000 / c`` sentences per second. Writes
``<out>/served_host-<hardware>-<date>.json`` and a PNG::

    python -m bench.served_host --clients 1 8 50 --duration 10
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from bench.harness import (ROOT, add_common_arguments, closed_loop, free_port, load_sentences,
                           metrics_url, pyplot, report, save_png, scrape_metrics, server_audio_parts, start_server,
                           stop_server, summarize)
from bench.instant_runner import StandInEngine, stand_in_engine
from bench.ws_clients import run_load
from base.config import load_config

#: The served engine's frames per sentence (349 = the load bench sentences' 4.05 s mean at the
#: bundled voice's 22 050 Hz and 256-sample hop).
FRAMES = 349
ROLES = ("engine", "front_ends", "clients")


def serve(argv: list[str]) -> int:
    """``voxloop`` with ``argv`` (its own arguments), the TTS engine's runner an ``InstantRunner`` of
    ``VOXLOOP_BENCH_FRAMES`` frames per sentence (default ``FRAMES``) whose launches take
    ``VOXLOOP_BENCH_LAUNCH_MS`` ms each (default 0), from the environment."""
    import tts_engine.factory as factory
    from voxloop.cli import main

    frames = int(os.environ.get("VOXLOOP_BENCH_FRAMES", FRAMES))
    launch_s = float(os.environ.get("VOXLOOP_BENCH_LAUNCH_MS", 0)) / 1000
    factory.create_engines = lambda cfg: [stand_in_engine(cfg, frames, launch_s)]
    return main(argv)


def engine_level(backend: StandInEngine, clients: int, duration_s: float, warmup_s: float) -> dict:
    records = closed_loop(backend, load_sentences(), clients, duration_s, warmup_s)
    return {**summarize(records, backend, clients, "-"), "mode": "engine"}


class CpuWindow:
    """CPU seconds (user + system) each role spent in ``[t_measure, t_end]``: the server's engine
    process (its root), its front-end processes (spawned children) and this process's other spawned
    children (the client processes), sampled at both ends of the window."""

    def __init__(self, server_pid: int) -> None:
        self.server = psutil.Process(server_pid)
        self.seconds = dict.fromkeys(ROLES, 0.0)
        self._thread: threading.Thread | None = None

    def _processes(self) -> dict[str, list[psutil.Process]]:
        spawned = [p for p in psutil.Process().children() if p.pid != self.server.pid and _spawned(p)]
        return {"engine": [self.server], "front_ends": [p for p in self.server.children() if _spawned(p)],
                "clients": spawned}  # fmt: skip

    @staticmethod
    def _cpu(processes: list[psutil.Process]) -> dict[int, float]:
        out = {}
        for p in processes:
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            out[p.pid] = t.user + t.system
        return out

    def start(self, t_measure: float, t_end: float) -> None:
        """Sample in a thread at ``t_measure`` and ``t_end`` (``time.time()``); ``run_load``'s ``on_window``."""

        def run() -> None:
            time.sleep(max(0.0, t_measure - time.time()))
            procs = self._processes()
            before = {role: self._cpu(ps) for role, ps in procs.items()}
            time.sleep(max(0.0, t_end - time.time()))
            for role, ps in procs.items():
                after = self._cpu(ps)
                self.seconds[role] = sum(after[pid] - before[role][pid] for pid in after if pid in before[role])

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def join(self) -> dict[str, float]:
        if self._thread is not None:
            self._thread.join()
        return self.seconds


def _spawned(p: psutil.Process) -> bool:
    """A multiprocessing ``spawn`` child (not its resource tracker)."""
    try:
        return any("spawn_main" in part for part in p.cmdline())
    except psutil.Error:
        return False


def run_level(url: str, server_pid: int, clients: int, duration_s: float, warmup_s: float) -> dict:
    window = CpuWindow(server_pid)
    before = scrape_metrics(metrics_url(url))
    row = run_load(url, clients, duration_s, warmup_s, on_window=window.start)
    after = scrape_metrics(metrics_url(url))
    seconds = window.join()
    row.update(server_audio_parts(before, after))
    row["cpu_ms_per_sentence"] = {r: round(1000 * s / max(1, row["requests"]), 3) for r, s in seconds.items()}
    row["cpu_cores_busy"] = {r: round(s / max(1e-9, row.get("elapsed_s", duration_s)), 2) for r, s in seconds.items()}
    return row


def plot(rows: list[dict], path: Path) -> Path:
    plt = pyplot()
    served = [r for r in rows if r["mode"] == "ws"]
    engine = {(r["launch_ms"], r["concurrency"]): r for r in rows if r["mode"] == "engine"}
    fig, (a, b) = plt.subplots(1, 2, figsize=(4 + 1.4 * len(served), 4))
    x = np.arange(len(served))
    labels = [f"{r['concurrency']} clients\nlaunch {r['launch_ms']:g} ms" for r in served]
    ref = [engine.get((r["launch_ms"], r["concurrency"]), {}).get("qps", 0) for r in served]
    a.bar(x - 0.2, ref, 0.4, color="tab:green", label="engine alone (in process)")
    a.bar(x + 0.2, [r["qps"] for r in served], 0.4, color="tab:blue", label="served (WebSocket)")
    a.set_xticks(x, labels, fontsize=7)
    a.set_ylabel("sentences / s (this machine)")
    a.legend(fontsize=8)
    a.set_title("stand-in GPU: engine alone and served", fontsize=10)
    bottom = np.zeros(len(served))
    for role, color in zip(ROLES, ("tab:red", "tab:orange", "tab:gray")):
        v = np.array([r["cpu_ms_per_sentence"][role] for r in served])
        b.bar(x, v, bottom=bottom, color=color, label=role.replace("_", " "))
        bottom += v
    b.set_xticks(x, labels, fontsize=7)
    b.set_ylabel("CPU ms per sentence")
    b.legend(fontsize=8)
    b.set_title("CPU per served sentence, by process role", fontsize=10)
    return save_png(fig, path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        return serve(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 50])
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per level")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds per level before measuring")
    p.add_argument("--frames", type=int, default=FRAMES, help="frames per sentence of the stand-in engine")
    p.add_argument("--launch-ms", type=float, nargs="+", default=[0.0],
                   help="ms each of the stand-in's launches keeps its lane busy; a server per value (0: the ceiling)")
    p.add_argument("--front-ends", type=int, help="server.front_ends (default: configs/gpu.toml's)")
    p.add_argument("--server-arg", action="append", default=[], help="more voxloop arguments, e.g. --set=server.gc_freeze=false")
    add_common_arguments(p)
    args = p.parse_args(argv)
    server_args = ["--config", "configs/gpu.toml", "--set=server.stages=tts", "--set=tts.device=cpu",
                   "--set=server.host=127.0.0.1", f"--set=limits.max_sessions={max(16, *args.clients)}",
                   *([f"--set=tts.voice_path={args.voice}"] if args.voice else []),
                   *([f"--set=server.front_ends={args.front_ends}"] if args.front_ends else []), *args.server_arg]  # fmt: skip
    overrides = [a.removeprefix("--set=") for a in server_args if a.startswith("--set=")]
    rows = []
    for launch_ms in args.launch_ms:
        reference = StandInEngine(overrides, args.frames, launch_ms / 1000)
        try:
            engine = {c: engine_level(reference, c, args.duration, args.warmup) for c in args.clients}
        finally:
            reference.close()
        for c in args.clients:
            rows.append({**engine[c], "frames": args.frames, "launch_ms": launch_ms})
            print(rows[-1], flush=True)
        port = free_port()
        env = {"VOXLOOP_BENCH_FRAMES": str(args.frames), "VOXLOOP_BENCH_LAUNCH_MS": str(launch_ms)}
        server = start_server(port, server_args, entry=("-m", "bench.served_host", "--serve"), env=env)
        try:
            for clients in args.clients:
                row = run_level(f"ws://127.0.0.1:{port}/v1/realtime", server.pid, clients, args.duration, args.warmup)
                row["served_of_engine_pct"] = round(100 * row["qps"] / engine[clients]["qps"], 1)
                rows.append({**row, "frames": args.frames, "launch_ms": launch_ms})
                print(rows[-1], flush=True)
        finally:
            stop_server(server)
    front_ends = args.front_ends or load_config(ROOT / "configs" / "gpu.toml", [], environ={}).server.front_ends
    extra = {"server_args": server_args, "front_ends": front_ends, "cpu_count": os.cpu_count(),
             "runner": "InstantRunner (silence of --frames frames per sentence, launches of --launch-ms)"}  # fmt: skip
    report("served_host", rows, extra, args, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
