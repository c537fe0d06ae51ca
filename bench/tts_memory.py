"""GPU TTS memory: the device pool (async vs native allocator) and the request buffer pool (on vs off).

Each variant runs in its own process (the allocator is chosen before CUDA starts): the engine
from ``configs/gpu.toml``'s shapes, ``--clients`` closed-loop clients for ``--duration`` seconds
after a warm-up, then reports

- device memory: the pool's high-water marks (reserved/used, cuda-python on the async pool;
  PyTorch's counters on the native one), graph memory, each stage's start-up memory;
- host memory: buffer allocations per request (pool misses, staging + audio), pinned host
  allocations made through PyTorch (``torch.cuda.host_memory_stats``), the Python heap's peak
  (tracemalloc: numpy arrays), the process's peak RSS;
- QPS and first-audio / sentence p99 under the same load (the pool must not cost speed).

    python3 -m bench.tts_memory --voice VOICE.onnx --hardware h200

Writes ``tts_memory-<hardware>-<date>.json`` (rows: variant, allocator, host_pool, ...) and a PNG.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tracemalloc
from pathlib import Path

from bench.harness import ROOT, add_common_arguments, closed_loop, common_arguments, load_sentences, result_path, summarize, write_json

VARIANTS = {  # name: (allocator, host pool MiB, cuDNN benchmark at start-up)
    "async-pool": ("async", 256, False),
    "async-nopool": ("async", 0, False),
    "native-pool": ("native", 256, False),
    "native-pool-cudnnbench": ("native", 256, True),
}


def child(args: argparse.Namespace) -> dict:
    """One variant in this process: returns its row."""
    allocator, pool_mb, cudnn_benchmark = VARIANTS[args.variant]
    from tts_engine.torch_vits.gpu_memory import configure_allocator

    configure_allocator(allocator)  # first, before anything touches CUDA
    import numpy as np
    import torch

    from bench.tts_backends import CudaBackend
    from base.config import GpuConfig

    engine_args = argparse.Namespace(
        voice=args.voice, device="cuda", precision="fp16", chunk_frames=64, tail_chunk_frames=256, max_frames=3072,
        max_batch=args.max_batch, coarse=True, compile=False, cudnn_benchmark=cudnn_benchmark, allocator=allocator,
    )  # fmt: skip
    backend = CudaBackend(engine_args, gpu=GpuConfig(allocator=allocator, host_pool_mb=pool_mb))
    engine = backend.engine

    sentences = load_sentences()
    closed_loop(backend, sentences, args.clients, 2.0, 0.0)  # warm: pools reach their working set
    host_stats = getattr(torch.cuda, "host_memory_stats", lambda: {})
    before = {"pools": {k: dict(v) for k, v in engine.memory_report()["host_pools"].items()}, "host": host_stats()}
    engine.memory.reset_high_water()
    tracemalloc.start()
    records = closed_loop(backend, sentences, args.clients, args.duration, 0.0)
    heap_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    report = engine.memory_report()
    after_host = host_stats()
    n = len(records)
    pools = report["host_pools"]
    allocs = sum(pools[k]["allocations"] - before["pools"][k]["allocations"] for k in pools)
    takes = allocs + sum(pools[k]["reuses"] - before["pools"][k]["reuses"] for k in pools)
    row = summarize(records, backend, args.clients, args.hardware)  # with the engine's start-up info
    pool = report["pool"]
    row.update({
        "variant": args.variant, "host_pool_mb": pool_mb, "requests": n,
        "buffer_takes_per_request": round(takes / max(1, n), 2),
        "buffer_allocations_per_request": round(allocs / max(1, n), 3),
        "pinned_host_allocs_per_request": (
            round((after_host.get("num_host_alloc", 0) - before["host"].get("num_host_alloc", 0)) / max(1, n), 3)
            if after_host else None),
        "host_pool_high_water_mb": round(sum(p["high_water_bytes"] for p in pools.values()) / 2**20, 1),
        "python_heap_peak_mb": round(heap_peak / 2**20, 1),
        "rss_peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "device_pool": pool, "stages_mb": report["stages_mb"],
        "peak_vram_mb": round(max(pool["reserved_high"] + pool["graph_reserved_high"], 0), 1),
        "torch_max_reserved_mb": round(torch.cuda.max_memory_reserved() / 2**20, 1),
        "audio_s_mean": round(float(np.mean([r["audio_s"] for r in records])), 2) if records else None,
    })  # fmt: skip
    engine.close()
    return row


def plot(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["variant"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = [("peak_vram_mb", "peak device memory, MiB (pool + graphs)"),
              ("buffer_allocations_per_request", "host buffer allocations / request"),
              ("qps", "QPS")]  # fmt: skip
    for ax, (key, title) in zip(axes, panels):
        ax.bar(names, [r.get(key) or 0 for r in rows], color="#4477aa")
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.suptitle(f"GPU TTS memory at {rows[0]['concurrency']} clients ({rows[0]['hardware']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(p)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--variant", help=argparse.SUPPRESS)  # child mode
    args = common_arguments(p.parse_args(argv))
    if args.variant:
        print("ROW " + json.dumps(child(args)), flush=True)
        return 0
    out = result_path("tts_memory", "json", args.out, args.hardware, args.date)
    rows: list[dict] = []
    for variant in args.variants:
        cmd = [sys.executable, "-m", "bench.tts_memory", "--voice", args.voice, "--hardware", args.hardware, "--clients",
               str(args.clients), "--duration", str(args.duration), "--max-batch", str(args.max_batch), "--variant", variant]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        lines = [ln[4:] for ln in proc.stdout.splitlines() if ln.startswith("ROW ")]
        if proc.returncode != 0 or not lines:
            print(f"{variant}: failed (rc {proc.returncode})\n{proc.stderr[-3000:]}", flush=True)
            rows.append({"variant": variant, "error": proc.stderr[-1500:]})
        else:
            rows.append(json.loads(lines[-1]))
            r = rows[-1]
            print(f"{variant}: {r['qps']} QPS, first p99 {r['first_audio_p99_ms']} ms, peak VRAM {r['peak_vram_mb']} MiB, "
                  f"allocs/request {r['buffer_allocations_per_request']}, heap peak {r['python_heap_peak_mb']} MiB", flush=True)  # fmt: skip
        write_json("tts_memory", rows, {"hardware_name": args.hardware}, path=out)
    ok = [r for r in rows if "error" not in r]
    if ok:
        plot(out.with_suffix(".png"), ok)
    print(f"wrote {out}")
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
