"""WebSocket mode of ``bench.tts_load``: a ``voxloop serve`` process (TTS-only, ``server.stages =
["tts"]``) per backend, ``RealtimeClient.speak`` (``x.tts.speak``) clients over ws://127.0.0.1, and the
server's peak GPU memory (its ``/metrics`` pool gauge, else ``nvidia-smi``). Run through ``python -m bench.tts_load --mode ws``;
the client load itself is ``bench.ws_clients`` (separate processes, JSON/base64 or binary audio).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import threading
import time

from bench.harness import (
    cpu_name, free_port, gpu_name, metrics_url, portable_args, scrape_metrics, start_server, stop_server,
)
from bench.tts_backends import config_of, config_tag


class WsBackend:
    """A TTS-only ``voxloop serve`` process for one backend; requests are ``x.tts.speak`` calls."""

    def __init__(self, args: argparse.Namespace, backend: str, max_clients: int) -> None:
        common = ["--set=server.stages=tts", "--set=server.host=127.0.0.1", f"--set=tts.voice_path={args.voice}",
                  f"--set=limits.max_sessions={max(16, max_clients)}"]  # fmt: skip
        if backend == "cuda" and getattr(args, "config", None) is not None:  # the file's settings, as served
            cfg = config_of(args)
            self.server_args = ["--config", str(args.config), *common, *[f"--set={s}" for s in args.sets],
                                *args.server_arg]  # fmt: skip
            self.name = f"ws-cuda-{cfg.tts.precision}" + config_tag(args)
            self.info = {"precision": cfg.tts.precision, "max_batch": cfg.tts.max_batch, "gpu": gpu_name(),
                         "fast_lanes": cfg.tts.fast_lanes, "config": portable_args([str(args.config)])[0],
                         "sets": list(args.sets)}  # fmt: skip
        elif backend == "cuda":  # the server's engine is a configuration's: its forms are not settings
            raise SystemExit("ws mode, cuda: the server runs a configuration's engine; pass --config (e.g. "
                             "configs/gpu.toml) and --set SECTION.KEY=VALUE over it (engine mode times other forms)")
        elif backend in ("onnx", "onnx-stream"):
            workers = args.ws_workers or os.cpu_count() or 1
            self.server_args = [
                *common, f"--set=tts.streaming={'true' if backend == 'onnx-stream' else 'false'}",
                f"--set=tts.onnx_workers={workers}", "--set=tts.onnx_threads=1", *args.server_arg,
            ]  # fmt: skip
            self.name = f"ws-{backend}-cpu"
            self.info = {"workers": workers, "threads_per_worker": 1, "cpu": cpu_name()}
        else:
            raise SystemExit(f"ws mode: backend {backend!r} is not one of cuda, onnx, onnx-stream")
        port = free_port()
        vram_before = VramSampler.gpus_used_mb()
        t0 = time.perf_counter()
        # CUDA start-up captures graphs (and compiles with --compile: minutes).
        self.server = start_server(port, self.server_args, timeout_s=900 if backend == "cuda" else 300)
        self.url = f"ws://127.0.0.1:{port}/v1/realtime"
        self.vram = VramSampler(self.server.pid, vram_before) if backend == "cuda" else None
        self.info.update({"server_startup_s": round(time.perf_counter() - t0, 1), "server_args": portable_args(self.server_args)})

    def scrape(self) -> dict:
        """The server's ``/metrics`` samples ({} when it cannot be read)."""
        try:
            return scrape_metrics(metrics_url(self.url))
        except (OSError, ValueError):
            return {}

    def reset_peak(self) -> None:
        if self.vram is not None:
            self.vram.reset()

    def peak_vram_mb(self) -> float | None:
        """The server's pool high-water mark from /metrics when it exports one, else nvidia-smi's peak."""
        if self.vram is None:
            return None
        pool = metrics_pool_high_mb(metrics_url(self.url))
        if pool is not None:
            self.info["peak_vram_source"] = "server /metrics voxloop_gpu_pool_bytes{kind=reserved,stat=high}"
            return pool
        peak = self.vram.peak_mb()
        self.info["peak_vram_source"] = self.vram.source
        return peak


    def close(self) -> None:
        if self.vram is not None:
            self.vram.close()
        stop_server(self.server)


def gc_pauses(before: dict, after: dict) -> dict[str, dict] | None:
    """Garbage collections between two scrapes (``voxloop_gc_pause_seconds``), per "process/generation":
    count, total ms, how many took over 5 ms and the objects they freed (the scraped front end's and the
    engine process's)."""
    name = "voxloop_gc_pause_seconds"
    out = {}
    for labels, count in after.get(f"{name}_count", {}).items():
        lab = dict(labels)
        key = f"{lab['process']}/{lab['generation']}"
        n = count - before.get(f"{name}_count", {}).get(labels, 0.0)
        total = after[f"{name}_sum"][labels] - before.get(f"{name}_sum", {}).get(labels, 0.0)
        fast = tuple(sorted({**lab, "le": "0.005"}.items()))
        under = after.get(f"{name}_bucket", {}).get(fast, 0.0) - before.get(f"{name}_bucket", {}).get(fast, 0.0)
        freed = (after.get("voxloop_gc_collected_objects_total", {}).get(labels, 0.0)
                 - before.get("voxloop_gc_collected_objects_total", {}).get(labels, 0.0))
        out[key] = {"count": int(n), "total_ms": round(1000 * total, 1), "over_5ms": int(n - under),
                    "collected": int(freed)}
    return out or None


def metrics_pool_high_mb(url: str) -> float | None:
    """``voxloop_gpu_pool_bytes{kind="reserved",stat="high"}`` (CUDA pool high-water since start), MiB, or None."""
    try:
        samples = scrape_metrics(url, timeout_s=5)
    except OSError:
        return None
    value = samples.get("voxloop_gpu_pool_bytes", {}).get((("kind", "reserved"), ("stat", "high")))
    return None if value is None else value / 2**20


class VramSampler:
    """Peak GPU memory of a server process, MiB, from ``nvidia-smi`` every ``interval_s`` seconds.

    The process's own ``used_memory`` when nvidia-smi lists ``pid`` (it may not inside a
    container with its own pid namespace); else the memory in use on all GPUs minus
    ``baseline_mb`` (measured before the server started: right on a GPU nothing else uses).
    ``peak_mb()`` is None without nvidia-smi. Both include the CUDA context.
    """

    def __init__(self, pid: int, baseline_mb: float | None, interval_s: float = 1.0) -> None:
        self.pid, self.baseline_mb, self.interval_s = pid, baseline_mb, interval_s
        self.source: str | None = None
        self._peak: float | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name="vram-sampler")
        if shutil.which("nvidia-smi"):
            self._thread.start()

    @staticmethod
    def _query(*fields: str) -> list[list[str]]:
        try:
            out = subprocess.run(["nvidia-smi", f"--query-{fields[0]}={','.join(fields[1:])}",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return []
        if out.returncode != 0:
            return []
        return [[v.strip() for v in line.split(",")] for line in out.stdout.splitlines() if line.strip()]

    @classmethod
    def gpus_used_mb(cls) -> float | None:
        """Memory in use on all GPUs, MiB (None without nvidia-smi)."""
        rows = cls._query("gpu", "memory.used") if shutil.which("nvidia-smi") else []
        return sum(float(r[0]) for r in rows) if rows else None

    def sample(self) -> tuple[float, str] | None:
        """(MiB, source) now, or None when nvidia-smi gives nothing usable."""
        own = [float(r[1]) for r in self._query("compute-apps", "pid", "used_memory")
               if len(r) == 2 and r[0] == str(self.pid) and r[1].replace(".", "", 1).isdigit()]  # fmt: skip
        if own:
            return sum(own), "nvidia-smi: server process used_memory"
        used = self.gpus_used_mb()
        if used is None or self.baseline_mb is None:
            return None
        return used - self.baseline_mb, "nvidia-smi: all GPUs memory.used minus before the server started"

    def _run(self) -> None:
        while not self._stop.is_set():
            got = self.sample()
            if got is not None:
                with self._lock:
                    self._peak = got[0] if self._peak is None else max(self._peak, got[0])
                    self.source = got[1]
            self._stop.wait(self.interval_s)

    def reset(self) -> None:
        with self._lock:
            self._peak = None

    def peak_mb(self) -> float | None:
        with self._lock:
            return self._peak

    def close(self) -> None:
        self._stop.set()
