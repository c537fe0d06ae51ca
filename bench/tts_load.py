"""TTS load benchmark: closed-loop clients against the GPU engine and the onnxruntime CPU engine.

Each of N clients speaks one sentence of ``bench/tts_sentences.json`` (English, 8-20 words,
3-5 s with the bundled voice), waits for its last chunk, and repeats, for ``--duration``
seconds. Reported per (backend, N): QPS, audio seconds per second, first-audio and
full-sentence latency p50/p99, RTF (p50 of latency / audio length), peak VRAM (null on CPU).

Modes: ``engine`` calls the engines in-process: ``cuda`` (``CudaTtsEngine.submit``),
``onnx`` (the CPU engine's whole-sentence ``OnnxVits.infer`` + int16, i.e.
``OnnxTtsEngine.synthesize_ids`` at the native rate), ``onnx-stream`` (``synthesize_ids``
of the streaming CPU engine: chunked encoder + decoder ONNX). ``ws``: each client is one
``voxloop.client.RealtimeClient`` connection calling ``speak()`` (``x.tts.speak``, text,
24 kHz) against a TTS-only ``python -m voxloop serve`` process (``server.stages=tts``: no
faster-whisper or llama.cpp needed) the bench starts per backend (``onnx``:
``tts.streaming=false``, ``onnx-stream``: true; ``cuda``: ``configs/gpu.toml`` with the
``--precision``/``--chunk-frames``/``--tail-chunk-frames``/``--max-batch``/``--max-frames``/
``--compile`` values, rows ``ws-cuda-<precision>``; ``--server-arg`` adds settings). Peak
VRAM in ws mode (``peak_vram_source`` says which): the server's CUDA pool high-water mark
from ``/metrics`` when it exports ``voxloop_gpu_pool_bytes``; else sampled from
``nvidia-smi`` once a second: the server process's own memory when nvidia-smi lists its
pid, else the GPUs' memory in use minus what was in use before the server started (both
include the CUDA context, unlike engine mode's ``torch.cuda.max_memory_reserved``); null
without either.
Examples::

    python bench/tts_load.py --backends cuda,onnx --concurrency 1,8,50,128 --hardware h200
    python bench/tts_load.py --backends onnx onnx-stream --concurrency 1 2 4 8 --hardware cpu-2c
    python bench/tts_load.py --mode ws --backends onnx onnx-stream --concurrency 1 2 4 8 --hardware cpu-2c --append
    python bench/tts_load.py --mode ws --backends cuda --concurrency 1,8,50,128 --hardware h200 --append
    python bench/tts_load.py --plot bench/results/tts_load-h200-2026-11-29.json
    python bench/tts_load.py --make-sentences   # rebuild the JSON from tts_sentences.txt

Writes ``bench/results/tts_load-<hardware>-<date>.json`` (a list of rows) and, with
``--plot``, PNGs beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from voxloop.config import GpuConfig

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SENTENCES = ROOT / "bench" / "tts_sentences.json"
RESULTS = ROOT / "bench" / "results"


def load_sentences() -> list[dict]:
    return json.loads(SENTENCES.read_text())["sentences"]


def make_sentences() -> None:
    """Phonemize ``tts_sentences.txt`` (espeak-ng, as the server does) and measure each sentence's audio length."""
    from tts_engine.frontend import TextFrontend
    from tts_engine.onnx_backend import InferenceScales, OnnxVits
    from tts_engine.voice import Voice
    from voxloop import models
    from voxloop.config import load_config

    cfg = load_config()
    path = models.resolve_voice(cfg).path
    voice = Voice.load(path, models.voice_config_path(cfg, path))
    frontend, model = TextFrontend(voice.config), OnnxVits(path)
    lines = (ROOT / "bench" / "tts_sentences.txt").read_text().splitlines()
    rows = []
    for text in (t.strip() for t in lines if t.strip() and not t.startswith("#")):
        (ids,) = list(frontend.sentence_ids(text))
        audio = model.infer(ids, InferenceScales(voice.config.noise_scale, 1.0, voice.config.noise_w))
        rows.append({"text": text, "words": len(text.split()), "ids": ids, "audio_s": round(len(audio) / voice.sample_rate, 3)})
    meta = {"voice": path.name, "sample_rate": voice.sample_rate, "note": "audio_s: one onnxruntime run, default noise"}
    body = ",\n  ".join(json.dumps(r, ensure_ascii=False) for r in rows)  # one sentence per line
    SENTENCES.write_text(json.dumps(meta, ensure_ascii=False)[:-1] + ',\n "sentences": [\n  ' + body + "\n ]\n}\n")
    print(f"wrote {len(rows)} sentences, mean {np.mean([r['audio_s'] for r in rows]):.2f} s of audio")


# ---------------------------------------------------------------- backends


class CudaBackend:
    """In-process ``CudaTtsEngine``; one request = one clause streamed in chunks."""

    name = "cuda"

    def __init__(self, args: argparse.Namespace, gpu: GpuConfig | None = None) -> None:
        """``gpu``: the engine's ``GpuConfig`` (default: ``args.allocator``, other fields default)."""
        import torch

        from tts_engine.torch_vits.cuda_engine import CudaTtsEngine, batch_buckets
        from tts_engine.torch_vits.runner import RunnerOptions
        from tts_engine.voice import Voice
        from voxloop.config import GpuConfig

        self.torch = torch
        opts = RunnerOptions(
            chunk_frames=args.chunk_frames, max_frames=args.max_frames, precision=args.precision,
            tail_chunk_frames=args.tail_chunk_frames, decode_batches=batch_buckets(args.max_batch, fine=not args.coarse),
            encode_batches=batch_buckets(args.max_batch, fine=False), compile=args.compile,
            cudnn_benchmark=args.cudnn_benchmark,
        )  # fmt: skip
        t0 = time.perf_counter()
        self.engine = CudaTtsEngine(Voice.load(args.voice), opts, device=args.device, queue_size=4096,
                                    gpu=gpu or GpuConfig(allocator=args.allocator))  # fmt: skip
        self.startup_s = time.perf_counter() - t0
        self.sample_rate = self.engine.sample_rate
        self.name = f"cuda-{args.precision}" + ("-compiled" if args.compile else "") + ("-cudnnbench" if args.cudnn_benchmark else "")
        runner = self.engine.runner
        self.info = {
            "startup_s": round(self.startup_s, 2), "graph_capture_s": round(runner.capture_s, 2),
            "graphs": len(runner._encode_steps) + len(runner._decode_steps),
            "capture_peak_mb": round(runner.capture_peak_mb, 1),
            "memory_after_capture_mb": round(self.torch.cuda.memory_reserved() / 2**20, 1),
            "chunk_frames": args.chunk_frames, "tail_chunk_frames": args.tail_chunk_frames, "compile": args.compile,
            "cudnn_benchmark": args.cudnn_benchmark, "allocator": args.allocator,
            "decode_batches": len(opts.decode_batches),
            "precision": args.precision, "max_batch": args.max_batch,
        }  # fmt: skip

    def speak(self, ids: list[int]) -> tuple[float, int, float]:
        """Blocks until the clause is spoken; returns (first-audio delay s, samples, stall s)."""
        return consume(self.engine.submit(ids), self.sample_rate)

    def reset_peak(self) -> None:
        if self.torch.cuda.is_available():
            self.torch.cuda.reset_peak_memory_stats()

    def peak_vram_mb(self) -> float:
        return self.torch.cuda.max_memory_reserved() / 2**20 if self.torch.cuda.is_available() else 0.0

    def close(self) -> None:
        self.engine.close()


class OnnxBackend:
    """The CPU engine's inference path: a pool of 1-thread onnxruntime sessions, whole clause."""

    name = "onnx-cpu"

    def __init__(self, args: argparse.Namespace, workers: int) -> None:
        from tts_engine.onnx_backend import InferenceScales, OnnxVits, to_int16
        from tts_engine.voice import Voice

        voice = Voice.load(args.voice)
        self.sample_rate = voice.sample_rate
        self.scales = InferenceScales(voice.config.noise_scale, voice.config.length_scale, voice.config.noise_w)
        threads = max(1, (os.cpu_count() or 1) // workers)
        self.model = OnnxVits(args.voice, threads=threads, workers=workers)
        self.to_int16 = to_int16
        self.info = {"workers": workers, "threads_per_worker": threads, "cpu": cpu_name()}

    def speak(self, ids: list[int]) -> tuple[float, int, float]:
        t0 = time.perf_counter()
        pcm = self.to_int16(self.model.infer(ids, self.scales))
        return time.perf_counter() - t0, len(pcm), 0.0

    def reset_peak(self) -> None:
        pass

    def peak_vram_mb(self) -> None:
        return None

    def close(self) -> None:
        pass


class OnnxStreamBackend(OnnxBackend):
    """The streaming CPU engine: ``OnnxTtsEngine.synthesize_ids`` over the chunked export, chunk by chunk."""

    name = "onnx-stream-cpu"

    def __init__(self, args: argparse.Namespace, workers: int) -> None:
        from tts_engine.cpu_engine import OnnxTtsEngine
        from tts_engine.onnx_streaming import ChunkPlan
        from tts_engine.voice import Voice
        from voxloop import models
        from voxloop.config import load_config

        cfg = load_config(overrides=[f"tts.voice_path={args.voice}"])
        plan = ChunkPlan(args.cpu_chunk_frames or cfg.tts.chunk_frames,
                         args.cpu_tail_chunk_frames or cfg.tts.tail_chunk_frames or ChunkPlan.tail_frames)  # fmt: skip
        threads = max(1, (os.cpu_count() or 1) // workers)
        chunked_dir = models.resolve_chunked_voice(cfg).path  # exports once (needs torch) when missing
        self.engine = OnnxTtsEngine(Voice.load(args.voice), threads=threads, workers=workers,
                                    chunked_dir=chunked_dir, chunk_plan=plan)  # fmt: skip
        self.sample_rate = self.engine.sample_rate
        self.info = {"workers": workers, "threads_per_worker": threads, "cpu": cpu_name(),
                     "chunk_frames": plan.first_frames, "tail_chunk_frames": plan.tail_frames}  # fmt: skip

    def speak(self, ids: list[int]) -> tuple[float, int, float]:
        return consume(self.engine.synthesize_ids(ids), self.sample_rate)


def consume(chunks, sample_rate: int) -> tuple[float, int, float]:
    """Read a clause's chunks: (first-audio delay s, samples, stall s).

    Stall: how long a listener playing from the first chunk's arrival would wait for
    later chunks (audio gaps), summed over the clause.
    """
    t0 = time.perf_counter()
    first, samples, stall = None, 0, 0.0
    for chunk in chunks:
        now = time.perf_counter()
        if first is None:
            first = now - t0
        else:
            stall += max(0.0, now - (t0 + first + stall + samples / sample_rate))
        samples += chunk.num_samples
    return first or 0.0, samples, stall


# ---------------------------------------------------------------- the load loop


def closed_loop(backend, sentences: list[dict], clients: int, duration_s: float, warmup_s: float) -> list[dict]:
    """Run ``clients`` threads for warm-up + ``duration_s``; records of requests started after warm-up."""
    records: list[dict] = []
    lock = threading.Lock()
    t_start = time.perf_counter()
    t_measure, t_end = t_start + warmup_s, t_start + warmup_s + duration_s
    errors: list[BaseException] = []

    def client(index: int) -> None:
        k = 0
        try:
            while time.perf_counter() < t_end:
                sentence = sentences[(index * 13 + k) % len(sentences)]
                k += 1
                t0 = time.perf_counter()
                first, samples, stall = backend.speak(sentence["ids"])
                t1 = time.perf_counter()
                if t0 >= t_measure:
                    with lock:
                        records.append({"start": t0, "end": t1, "first_s": first, "latency_s": t1 - t0,
                                        "audio_s": samples / backend.sample_rate, "stall_s": stall})  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed: {errors[0]!r}") from errors[0]
    return records


def summarize(records: list[dict], backend, clients: int, hardware: str) -> dict:
    t0 = min(r["start"] for r in records)
    elapsed = max(r["end"] for r in records) - t0
    first = np.array([r["first_s"] for r in records]) * 1000
    lat = np.array([r["latency_s"] for r in records]) * 1000
    audio = np.array([r["audio_s"] for r in records])
    rtf = lat / 1000 / audio
    stall = np.array([r["stall_s"] for r in records if r.get("stall_s") is not None]) * 1000
    peak = backend.peak_vram_mb()
    return {
        "backend": backend.name, "hardware": hardware, "concurrency": clients, "requests": len(records),
        "qps": round(len(records) / elapsed, 2), "audio_seconds_per_second": round(audio.sum() / elapsed, 1),
        "audio_s_per_request": round(float(audio.mean()), 3),
        "first_audio_p50_ms": round(float(np.percentile(first, 50)), 2),
        "first_audio_p99_ms": round(float(np.percentile(first, 99)), 2),
        "latency_p50_ms": round(float(np.percentile(lat, 50)), 2),
        "latency_p99_ms": round(float(np.percentile(lat, 99)), 2),
        "rtf": float(f"{np.percentile(rtf, 50):.3g}"), "rtf_aggregate": float(f"{elapsed / audio.sum():.3g}"),
        # audio gaps a listener would hear between a clause's chunks (engine mode only)
        "stall_p99_ms": round(float(np.percentile(stall, 99)), 1) if len(stall) else None,
        "stalled_pct": round(100 * float(np.mean(stall > 0)), 1) if len(stall) else None,
        "peak_vram_mb": None if peak is None else round(peak, 1), "elapsed_s": round(elapsed, 2), **backend.info,
    }  # fmt: skip


def cpu_name() -> str:
    """CPU model and core count, e.g. ``Intel(R) Xeon(R) Processor x2``."""
    from bench.common import cpu_model

    return f"{cpu_model()} x{os.cpu_count()}"


def run(args: argparse.Namespace) -> Path:
    """Every (backend, level) row is written as soon as it is measured (a timeout loses no rows)."""
    sentences = load_sentences()
    levels = args.concurrency
    out = Path(args.out) / f"tts_load-{args.hardware}-{args.date}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = json.loads(out.read_text()) if args.append and out.exists() else []
    write_meta(out, args, sentences)

    def record(row: dict) -> None:
        rows.append({**row, "mode": args.mode, "date": args.date})
        out.write_text(json.dumps(rows, indent=1) + "\n")
        print(json.dumps(row), flush=True)

    for name in args.backends:
        if args.mode == "ws":
            from bench.tts_load_ws import WsBackend, ws_closed_loop

            backend = WsBackend(args, name, max(levels))
            print(f"[{backend.name}] {json.dumps(backend.info)}", flush=True)
            duration, warmup = (args.duration, args.warmup) if name == "cuda" else (args.cpu_duration, 1.0)
            try:
                for clients in levels:
                    backend.reset_peak()
                    records = asyncio.run(ws_closed_loop(backend.url, sentences, clients, duration, warmup))
                    record(summarize(records, backend, clients, args.hardware))
            finally:
                backend.close()
        elif name == "cuda":
            backend = CudaBackend(args)
            print(f"[{backend.name}] {json.dumps(backend.info)}", flush=True)
            for clients in levels:
                backend.reset_peak()
                record(summarize(closed_loop(backend, sentences, clients, args.duration, args.warmup),
                                 backend, clients, args.hardware))  # fmt: skip
            if args.steps_report:
                sched = backend.engine.scheduler
                print(f"[{backend.name}] steps {sched.steps}, mean step {1000 * sched.step_s / max(1, sched.steps):.2f} ms")
            backend.close()
        elif name in ("onnx", "onnx-stream"):
            cls = OnnxBackend if name == "onnx" else OnnxStreamBackend
            for clients in levels:
                backend = cls(args, workers=min(clients, os.cpu_count() or 1))
                record(summarize(closed_loop(backend, sentences, clients, args.cpu_duration, 1.0),
                                 backend, clients, args.hardware))  # fmt: skip
        else:
            raise SystemExit(f"unknown backend {name!r}")
    print(f"wrote {out}")
    return out


def write_meta(out: Path, args: argparse.Namespace, sentences: list[dict]) -> None:
    """``<results>.meta.json``: date, hardware, the exact commands that wrote the rows."""
    meta_path = out.with_suffix(".meta.json")
    commands = [" ".join(sys.argv)]
    if args.append and meta_path.exists():
        commands = json.loads(meta_path.read_text()).get("commands", []) + commands
    meta = {"date": args.date, "commands": commands, "gpu": gpu_name(), "cpu": cpu_name(), "mode": args.mode,
            "sentences": len(sentences),
            "mean_sentence_audio_s": round(float(np.mean([s["audio_s"] for s in sentences])), 3)}  # fmt: skip
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")


def gpu_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    except ImportError:
        return "none"


def plot(path: Path) -> None:
    """PNGs beside ``path``: throughput and latency against concurrency, per backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = json.loads(path.read_text())
    backends = sorted({r["backend"] for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for b in backends:
        rs = sorted((r for r in rows if r["backend"] == b), key=lambda r: r["concurrency"])
        n = [r["concurrency"] for r in rs]
        axes[0].plot(n, [r["qps"] for r in rs], "o-", label=b)
        axes[1].plot(n, [r["latency_p50_ms"] for r in rs], "o-", label=f"{b} p50")
        axes[1].plot(n, [r["latency_p99_ms"] for r in rs], "x--", label=f"{b} p99")
        axes[2].plot(n, [r["first_audio_p50_ms"] for r in rs], "o-", label=f"{b} p50")
        axes[2].plot(n, [r["first_audio_p99_ms"] for r in rs], "x--", label=f"{b} p99")
    titles = ("requests per second", "full-sentence latency, ms", "first audio, ms")
    for ax, title in zip(axes, titles):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"TTS closed-loop load, {path.stem}")
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=110)
    print(f"wrote {path.with_suffix('.png')}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["engine", "ws"], default="engine",
                   help="engine: in-process; ws: RealtimeClient.speak (x.tts.speak) against a server started here")  # fmt: skip
    p.add_argument("--backends", nargs="+", default=["cuda,onnx"],
                   help="cuda, onnx, onnx-stream (also in ws mode); spaces or commas")  # fmt: skip
    p.add_argument("--concurrency", nargs="+", default=["1,8,50,128"], help="client counts; spaces or commas")
    p.add_argument("--duration", type=float, default=15.0, help="measured seconds per level (GPU, both modes)")
    p.add_argument("--cpu-duration", type=float, default=10.0, help="measured seconds per level (CPU backends, both modes)")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--voice", default=os.environ.get("VOXLOOP_TTS__VOICE_PATH"), help="Piper .onnx (default: bundled)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", default="fp16", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--cpu-chunk-frames", type=int, help="onnx-stream first chunk, frames (default: tts.chunk_frames)")
    p.add_argument("--cpu-tail-chunk-frames", type=int, help="onnx-stream later chunks (default: tts.tail_chunk_frames)")
    p.add_argument("--ws-workers", type=int, help="ws: the server's tts.onnx_workers (default: CPU count)")
    p.add_argument("--server-arg", action="append", default=[], help="ws: extra server args, e.g. --server-arg=--set=x.y=z")
    p.add_argument("--chunk-frames", type=int, default=64)
    p.add_argument("--tail-chunk-frames", type=int, default=256)
    p.add_argument("--max-batch", type=int, default=128)
    p.add_argument("--max-frames", type=int, default=3072)
    p.add_argument("--compile", action="store_true", help="torch.compile the chunk decoder before capture")
    p.add_argument("--cudnn-benchmark", action="store_true", help="cuDNN algorithm timing at start-up (tts.cudnn_benchmark)")
    p.add_argument("--allocator", default="async", choices=["async", "native"], help="gpu.allocator")
    p.add_argument("--coarse", action="store_true", help="power-of-two decode batch buckets only (faster start-up)")
    p.add_argument("--hardware", default="local")
    p.add_argument("--date", default=dt.date.today().isoformat())
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--steps-report", action="store_true")
    p.add_argument("--append", action="store_true", help="add rows to an existing results file")
    p.add_argument("--plot", type=Path, help="only render PNGs from this results JSON")
    p.add_argument("--make-sentences", action="store_true")
    args = p.parse_args(argv)
    args.backends = [b for item in args.backends for b in item.split(",") if b]
    args.concurrency = [int(n) for item in args.concurrency for n in item.split(",") if n]
    if args.make_sentences:
        make_sentences()
        return 0
    if args.plot:
        plot(args.plot)
        return 0
    if args.voice is None:
        from bench.common import default_voice

        args.voice = default_voice()
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
