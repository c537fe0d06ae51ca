"""GPU TTS under real out-of-memory: batch degradation, retry hints, client backoff, recovery.

The engine runs eagerly (no CUDA graphs: activation memory then grows with the batch) under a
device memory limit (``gpu.memory_limit_mb``, PyTorch's per-process fraction) set just above what
``--fit-batch`` requests of 256-frame chunks need, while ``--clients`` closed-loop clients speak
sentences with exponential backoff (``retry_after_ms`` x 2^attempt, up to ``--attempts`` tries),
as ``RealtimeClient.speak`` does. Then the limit is lifted and the batch must grow back.

    python3 -m bench.tts_oom --voice VOICE.onnx --hardware h200

Writes ``tts_oom-<hardware>-<date>.json``: requests, share that eventually succeeded (the seed's
figure: >= 99.8 %), first-try share, refusals and their retry hints, OOMs, lowest batch limit,
time for the limit to grow back.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

from bench.harness import add_common_arguments, common_arguments, load_sentences, result_path, write_json


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(p)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--duration", type=float, default=20.0, help="seconds under the memory limit")
    p.add_argument("--fit-batch", type=int, default=4, help="requests the limit leaves room for")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--attempts", type=int, default=10)
    p.add_argument("--retry-after-ms", type=int, default=200)
    p.add_argument("--allocator", default="native", choices=["native", "async"])
    args = common_arguments(p.parse_args(argv))

    from tts_engine.torch_vits.gpu_memory import configure_allocator

    configure_allocator(args.allocator)
    import torch

    from tts_engine.torch_vits.cuda_engine import CudaTtsEngine
    from tts_engine.torch_vits.runner import batch_buckets
    from tts_engine.torch_vits.runner import RunnerOptions
    from tts_engine.voice import Voice
    from base.config import GpuConfig
    from base.errors import Overloaded

    opts = RunnerOptions(chunk_frames=64, tail_chunk_frames=256, max_frames=3072, precision="fp16", cuda_graphs=False,
                         decode_batches=batch_buckets(args.max_batch, "coarse"),
                         encode_batches=batch_buckets(args.max_batch, "coarse"))  # fmt: skip
    engine = CudaTtsEngine(Voice.load(args.voice), opts, queue_size=4096, oom_retry_after_ms=args.retry_after_ms,
                           gpu=GpuConfig(allocator=args.allocator))  # fmt: skip
    scheduler, sentences = engine.scheduler, load_sentences()
    longest = max(sentences, key=lambda s: len(s["ids"]))["ids"]

    # Memory one request needs: the peak of a batch-1 sentence over the idle footprint.
    for _ in engine.submit(longest):
        pass
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    idle = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for _ in engine.submit(longest):
        pass
    per_request = torch.cuda.max_memory_allocated() - idle
    limit = idle + args.fit_batch * per_request
    total = torch.cuda.get_device_properties(0).total_memory
    print(f"idle {idle / 2**20:.0f} MiB, one request {per_request / 2**20:.0f} MiB -> limit {limit / 2**20:.0f} MiB")

    stats = {"ok": 0, "ok_first_try": 0, "failed": 0, "refusals": 0, "retry_hints_ms": set(), "attempts_max": 1}
    lock, stop = threading.Lock(), threading.Event()
    lowest = [scheduler.max_batch]

    def client(index: int) -> None:
        k = 0
        while not stop.is_set():
            ids = sentences[(index * 7 + k) % len(sentences)]["ids"]
            k += 1
            for attempt in range(args.attempts):
                try:
                    chunks = list(engine.submit(ids))
                    ok = bool(chunks) and chunks[-1].final
                    break
                except Overloaded as exc:
                    with lock:
                        stats["refusals"] += 1
                        stats["retry_hints_ms"].add(exc.retry_after_ms)
                    time.sleep(min(5.0, exc.retry_after_ms / 1000 * 2**attempt))
            else:
                ok = False
            with lock:
                stats["ok" if ok else "failed"] += 1
                stats["ok_first_try"] += int(ok and attempt == 0)
                stats["attempts_max"] = max(stats["attempts_max"], attempt + 1)

    def monitor() -> None:
        while not stop.is_set():
            lowest.append(scheduler.max_batch)
            time.sleep(0.01)

    torch.cuda.set_per_process_memory_fraction(limit / total)
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    threads.append(threading.Thread(target=monitor, daemon=True))
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(args.duration)
    ooms_limited, lowest_batch = scheduler.ooms, min(lowest)
    torch.cuda.set_per_process_memory_fraction(1.0)  # memory is back
    t_lift = time.monotonic()
    regrown_after = None
    while time.monotonic() - t_lift < 30:
        if scheduler.max_batch == scheduler.max_slots:
            regrown_after = time.monotonic() - t_lift
            break
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(60)
    elapsed = time.monotonic() - t0
    requests = stats["ok"] + stats["failed"]
    row = {
        "hardware": args.hardware, "clients": args.clients, "allocator": args.allocator, "cuda_graphs": False,
        "limit_mb": round(limit / 2**20), "idle_mb": round(idle / 2**20), "per_request_mb": round(per_request / 2**20),
        "fit_batch": args.fit_batch, "max_batch": args.max_batch, "seconds_limited": args.duration,
        "requests": requests, "succeeded": stats["ok"], "succeeded_pct": round(100 * stats["ok"] / max(1, requests), 3),
        "first_try_pct": round(100 * stats["ok_first_try"] / max(1, requests), 2), "failed": stats["failed"],
        "refusals": stats["refusals"], "retry_after_ms_seen": sorted(stats["retry_hints_ms"]),
        "attempts_max": stats["attempts_max"], "ooms": ooms_limited, "lowest_max_batch": lowest_batch,
        "regrown_to_max_after_s": None if regrown_after is None else round(regrown_after, 2),
        "ooms_total": scheduler.ooms, "qps": round(requests / elapsed, 1),
    }  # fmt: skip
    engine.close()
    write_json("tts_oom", [row], {"hardware_name": args.hardware},
               path=result_path("tts_oom", "json", args.out, args.hardware, args.date))  # fmt: skip
    print(json.dumps(row, indent=1))
    ok = row["succeeded_pct"] >= 99.8 and row["ooms"] > 0 and regrown_after is not None
    print("PASS" if ok else "FAIL: needs >= 99.8 % eventually served, an OOM, and the batch grown back")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
