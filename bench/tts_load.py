"""TTS load benchmark: closed-loop clients against the GPU engine and the onnxruntime CPU engine.

Each of N clients speaks one sentence of ``bench/tts_sentences.json`` (English, 8-20 words,
3-5 s with the bundled voice), waits for its last chunk, and repeats, for ``--duration``
seconds. Reported per (backend, N): QPS, audio seconds per second, first-audio and
full-sentence latency p50/p99, RTF (p50 of latency / audio length), peak VRAM (null on CPU);
engine mode ``cuda`` rows also carry ``scheduler``: what the GPU scheduler did in the level
(warm-up included): steps, launches and mean time per lane, rows per launch, and padding
(bucket rows unused, encoder phoneme ids unused, decoder frames computed but not handed out), %;
with ``--gpu-profile S``, also ``gpu_timeline``: the level run S seconds more under PyTorch's
profiler, its kernels per CUDA stream, busy and overlap % (``bench.gpu_timeline``; not timed).

Modes: ``engine`` calls the engines in-process: ``cuda`` (``CudaTtsEngine.submit``, one thread per
client iterating its request; with ``--engine-clients sinks`` the clients are sinks the scheduler
thread calls once per finished launch, as the served path receives, and rows are ``cuda-...-sinks``:
the engine without the bench's 50-128 threads sharing its interpreter lock; the clients then queue
their next sentences at the same instant and fall into step, every launch carrying all of them: the
most batched arrival pattern, an upper bound rather than what spread-out clients get),
``onnx`` (the CPU engine's whole-sentence ``OnnxVits.infer`` + int16, i.e.
``OnnxTtsEngine.synthesize_ids`` at the native rate), ``onnx-stream`` (``synthesize_ids``
of the streaming CPU engine: chunked encoder + decoder ONNX). ``ws``: each client is one
WebSocket session in ``bench.ws_clients`` (client processes apart from the server, one per 16
sessions or ``--ws-sessions-per-process``; permessage-deflate offered; ``x.tts.speak`` back to back; audio at ``--rate`` Hz as
JSON/base64 and, in a second set of rows, binary: ``--ws-formats``) against a TTS-only
``python -m voxloop serve`` process (``server.stages=tts``: no
faster-whisper or llama.cpp needed) the bench starts per backend (``onnx``:
``tts.streaming=false``, ``onnx-stream``: true; ``cuda``: the ``--config`` file's; ``--server-arg``
adds settings). ``--config FILE`` (``cuda``: needed in ws mode; in engine mode instead of the per-setting
flags, which also build the engine's other forms, ``runner.RunnerOptions``) takes the GPU engine's settings from a config file, with
``--set SECTION.KEY=VALUE`` over it: in-process ``CudaTtsEngine.from_config``, served the server started
with that file and those ``--set``s: both modes run what a server of that file runs (rows
``cuda-<precision>-<stem>[-<key=value>...]``, ``config`` and ``sets`` in each). Peak
VRAM in ws mode (``peak_vram_source`` says which): the server's CUDA pool high-water mark
from ``/metrics`` when it exports ``voxloop_gpu_pool_bytes``; else sampled from
``nvidia-smi`` once a second: the server process's own memory when nvidia-smi lists its
pid, else the GPUs' memory in use minus what was in use before the server started (both
include the CUDA context, unlike engine mode's ``torch.cuda.max_memory_reserved``); null
without either.
Examples::

    python -m bench.tts_load --backends cuda,onnx --concurrency 1,8,50,128 --hardware h200
    python -m bench.tts_load --backends onnx onnx-stream --concurrency 1 2 4 8 --hardware cpu-2c
    python -m bench.tts_load --mode ws --backends onnx onnx-stream --concurrency 1 2 4 8 --hardware cpu-2c --append
    # the engine's plain forms against some of its measured ones, in-process:
    python -m bench.tts_load --backends cuda --concurrency 50 --hardware h200 --allocator native --fast-lanes 2 \\
        --polyphase --fused-blocks --fused-upsampling --fused-flow --chunks-per-step 0 --main-in-flight 2
    # configs/gpu.toml as shipped, and with one setting changed, engine then served:
    python -m bench.tts_load --config configs/gpu.toml --backends cuda --concurrency 1 50 --hardware h200
    python -m bench.tts_load --config configs/gpu.toml --set tts.fast_lanes=1 --backends cuda \
        --concurrency 50 --hardware h200 --append
    python -m bench.tts_load --mode ws --config configs/gpu.toml --backends cuda --concurrency 50 1 --ws-formats json \
        --hardware h200 --append
    python -m bench.tts_load --plot bench/results/tts_load-h100-2026-12-06-ship.json
    python -m bench.tts_load --make-sentences   # rebuild the JSON from tts_sentences.txt

Writes ``OUT/tts_load-<hardware>-<date>.json`` (a list of rows) and, with
``--plot``, PNGs beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from bench.harness import (
    ROOT, SENTENCES, add_common_arguments, closed_loop, closed_loop_sinks, command_line, common_arguments, cpu_name, gpu_name,
    load_sentences, server_audio_parts, summarize,
)  # fmt: skip
from bench.gpu_timeline import profile_kernels
from bench.tts_backends import CudaBackend, OnnxBackend, OnnxStreamBackend, scheduler_breakdown, scheduler_counters
from bench.ws_clients import SESSIONS_PER_PROCESS
from base.config import BATCH_BUCKET_LEVELS, TEXT_ENCODER_PRODUCTS

#: Engine-mode rows: clients are threads in the bench process calling the engine; audio stays int16 at
#: the engine's rate (the voice's, or ``--output-rate`` resampled on the GPU; no serialization, no socket).
ENGINE_CLIENTS = {"client_processes": 0}


def engine_clients(backend) -> dict:  # noqa: ANN001 - a bench.tts_backends backend
    """``ENGINE_CLIENTS`` with the audio format the engine hands out (``int16@native`` or ``int16@<rate>``)."""
    rate = getattr(backend, "output_rate", 0)
    return {"audio_format": f"int16@{rate}" if rate else "int16@native", **ENGINE_CLIENTS}


def make_sentences() -> None:
    """Phonemize ``tts_sentences.txt`` (espeak-ng, as the server does) and measure each sentence's audio length."""
    from tts_engine.frontend import TextFrontend
    from tts_engine.onnx_backend import InferenceScales, OnnxVits
    from tts_engine.voice import Voice
    from base import models
    from base.config import load_config

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


def run(args: argparse.Namespace) -> Path:
    """Every (backend, level) row is written as soon as it is measured (a timeout loses no rows)."""
    sentences = load_sentences()
    levels = args.concurrency
    out = Path(args.out) / f"tts_load-{args.hardware}-{args.date}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = json.loads(out.read_text()) if args.append and out.exists() else []
    write_meta(out, args, sentences)

    def record(row: dict) -> None:
        rows.append({"mode": args.mode, **row, "date": args.date})
        out.write_text(json.dumps(rows, indent=1) + "\n")
        print(json.dumps(row), flush=True)

    for name in args.backends:
        if args.mode == "ws":
            from bench.tts_load_ws import WsBackend, gc_pauses
            from bench.ws_clients import run_load

            backend = WsBackend(args, name, max(levels))
            print(f"[{backend.name}] {json.dumps(backend.info)}", flush=True)
            duration, warmup = (args.duration, args.warmup) if name == "cuda" else (args.cpu_duration, 1.0)
            try:
                for fmt, rate in [(f, r) for r in args.rate for f in args.ws_formats]:
                    for clients in levels:
                        backend.reset_peak()
                        before = backend.scrape()
                        row = run_load(backend.url, clients, duration, warmup, fmt, rate,
                                       processes=-(-clients // args.ws_sessions_per_process))
                        after = backend.scrape()
                        peak = backend.peak_vram_mb()
                        record({"backend": backend.name, "hardware": args.hardware, **row,
                                **server_audio_parts(before, after),
                                "server_gc_pauses": gc_pauses(before, after),
                                "peak_vram_mb": None if peak is None else round(peak, 1), **backend.info})
            finally:
                backend.close()
        elif name == "cuda":
            backend = CudaBackend(args)
            if args.graph_times is not None:
                from bench.gpu_steps import graph_times

                ids, batches = [s["ids"] for s in sentences], tuple(args.graph_times or (1, 16, 64))
                backend.info["graph_ms"] = graph_times(backend.engine.runner, ids, batches)
            print(f"[{backend.name}] {json.dumps(backend.info)}", flush=True)
            start = scheduler_counters(backend.engine.scheduler)
            if args.engine_clients == "sinks":
                backend.name += "-sinks"

                def loop(clients: int, duration_s: float, warmup_s: float) -> list[dict]:
                    return closed_loop_sinks(lambda ids, sink: backend.engine.submit_sentences([ids], sink=sink),
                                             backend.sample_rate, sentences, clients, duration_s, warmup_s)
            else:

                def loop(clients: int, duration_s: float, warmup_s: float) -> list[dict]:
                    return closed_loop(backend, sentences, clients, duration_s, warmup_s)

            for clients in levels:
                backend.reset_peak()
                before = scheduler_counters(backend.engine.scheduler)
                row = summarize(loop(clients, args.duration, args.warmup), backend, clients, args.hardware)
                record({**row, **engine_clients(backend), "engine_clients": args.engine_clients,
                        "scheduler": scheduler_breakdown(before, scheduler_counters(backend.engine.scheduler))})
                if args.gpu_profile and clients in args.gpu_profile_levels:
                    keep = None
                    if args.gpu_trace:
                        keep = out.with_name(f"{out.stem}-{backend.name}-{clients}-kernels.json.gz")
                    _, timeline = profile_kernels(lambda c=clients: loop(c, args.gpu_profile, 0.5), keep=keep)
                    print(f"[{backend.name}] gpu timeline, {clients} clients: {json.dumps(timeline)}", flush=True)
                    rows[-1]["gpu_timeline"] = {"clients": clients, "seconds": args.gpu_profile, **timeline}
                    out.write_text(json.dumps(rows, indent=1) + "\n")
            if args.steps_report:  # the whole run at once (each row has its level's)
                print(f"[{backend.name}] {json.dumps(scheduler_breakdown(start, scheduler_counters(backend.engine.scheduler)))}")
            backend.close()
        elif name in ("onnx", "onnx-stream"):
            cls = OnnxBackend if name == "onnx" else OnnxStreamBackend
            for clients in levels:
                backend = cls(args, workers=min(clients, os.cpu_count() or 1))
                record({**summarize(closed_loop(backend, sentences, clients, args.cpu_duration, 1.0),
                                    backend, clients, args.hardware), **engine_clients(backend)})  # fmt: skip
        else:
            raise SystemExit(f"unknown backend {name!r}")
    print(f"wrote {out}")
    return out


def write_meta(out: Path, args: argparse.Namespace, sentences: list[dict]) -> None:
    """``<results>.meta.json``: date, hardware, the exact commands that wrote the rows."""
    meta_path = out.with_suffix(".meta.json")
    commands = [command_line()]
    if args.append and meta_path.exists():
        commands = json.loads(meta_path.read_text()).get("commands", []) + commands
    meta = {"date": args.date, "commands": commands, "gpu": gpu_name(), "cpu": cpu_name(), "mode": args.mode,
            "sentences": len(sentences),
            "mean_sentence_audio_s": round(float(np.mean([s["audio_s"] for s in sentences])), 3)}  # fmt: skip
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")


def plot(path: Path) -> None:
    """PNGs beside ``path``: throughput and latency against concurrency, per backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = json.loads(path.read_text())

    def series(r: dict) -> str:  # backend, then for ws rows the audio format and server settings
        extra = [f"delta {a.rsplit('=', 1)[1]} ms" for a in r.get("server_args", []) if "audio_delta_ms=" in a]
        lane = r.get("fast_lane")  # rows of 2026-12-02 runs before the modes were named: True / False
        if lane is not None:
            extra.append(f"fast lane {({True: 'overlap', False: 'off'}).get(lane, lane)}")
        if r.get("fast_lanes", 1) > 1:
            extra.append(f"x{r['fast_lanes']}")
        if r.get("variant"):  # set by hand on rows whose code differed but whose options did not
            extra.append(r["variant"])
        return " ".join([r["backend"], *([r["audio_format"]] if r.get("mode") == "ws" else []), *extra])

    backends = sorted({series(r) for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.5 + 0.22 * len(backends)))
    for i, b in enumerate(backends):
        color = f"C{i % 10}"
        rs = sorted((r for r in rows if series(r) == b), key=lambda r: r["concurrency"])
        n = [r["concurrency"] for r in rs]
        axes[0].plot(n, [r["qps"] for r in rs], "o-", color=color, label=b)
        for ax, key in ((axes[1], "latency"), (axes[2], "first_audio")):
            ax.plot(n, [r[f"{key}_p50_ms"] for r in rs], "o-", color=color)
            ax.plot(n, [r[f"{key}_p99_ms"] for r in rs], "x--", color=color)
    titles = ("requests per second", "full-sentence latency, ms (o p50, x p99)", "first audio, ms (o p50, x p99)")
    for ax, title in zip(axes, titles):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    # One legend for the three panels, below them: the series names are long.
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", fontsize=7, ncol=1, frameon=False)
    fig.suptitle(f"TTS closed-loop load, {path.stem}")
    fig.tight_layout(rect=(0, 0.045 * len(backends) / (1 + 0.04 * len(backends)), 1, 0.96))
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
    p.add_argument("--device", default="cuda")
    engine = p.add_argument_group("GPU engine settings (cuda; refused beside --config, which takes them from its file)")
    engine.add_argument("--precision", default="fp16", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--cpu-chunk-frames", type=int, help="onnx-stream first chunk, frames (default: tts.chunk_frames)")
    p.add_argument("--cpu-tail-chunk-frames", type=int, help="onnx-stream later chunks (default: tts.tail_chunk_frames)")
    p.add_argument("--ws-formats", nargs="+", default=["json,binary"],
                   help="ws: audio formats, rows in this order: json (base64 in JSON, what OpenAI-style clients use), binary")
    p.add_argument("--rate", type=int, nargs="+", default=[24000],
                   help="ws: output sample rate(s) the clients ask for, Hz (22050, the voice's own, needs no resampling)")
    p.add_argument("--ws-sessions-per-process", type=int, default=SESSIONS_PER_PROCESS,
                   help="ws: client sessions per client process (each process one asyncio loop; a user's client holds one)")
    p.add_argument("--ws-workers", type=int, help="ws: the server's tts.onnx_workers (default: CPU count)")
    p.add_argument("--server-arg", action="append", default=[], help="ws: extra server args, e.g. --server-arg=--set=x.y=z")
    p.add_argument("--config", type=Path,
                   help="cuda, both modes: the GPU engine's settings from this config file, as a server started with "
                        "it has them (e.g. configs/gpu.toml as shipped), with --set over it; the per-setting flags "
                        "below (GPU engine settings) are then refused")  # fmt: skip
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="with --config: a setting over the file (repeatable), e.g. --set tts.fast_lanes=1")
    engine.add_argument("--chunk-frames", type=int, default=64)
    engine.add_argument("--tail-chunk-frames", type=int, default=256)
    engine.add_argument("--max-batch", type=int, default=128)
    engine.add_argument("--max-frames", type=int, default=3072)
    engine.add_argument("--compile", action="store_true", help="torch.compile the chunk decoder before capture")
    engine.add_argument("--compile-encoder", action="store_true", help="torch.compile the encoder step too")
    engine.add_argument("--cudnn-benchmark", action="store_true", help="cuDNN algorithm timing at start-up (RunnerOptions.cudnn_benchmark)")
    engine.add_argument("--cudnn-benchmark-limit", type=int, default=10,
                   help="most cuDNN algorithms timed per shape (RunnerOptions.cudnn_benchmark_limit; 0: all)")
    engine.add_argument("--cudnn-benchmark-stages", nargs="+", choices=("encode", "decode"), default=["encode", "decode"],
                   help="RunnerOptions.cudnn_benchmark_stages: with --cudnn-benchmark, the stages whose convolutions are timed")
    engine.add_argument("--allocator", default="async", choices=["async", "native"], help="gpu.allocator")
    engine.add_argument("--batch-buckets", choices=BATCH_BUCKET_LEVELS, default="fine",
                   help="decoder batch buckets (tts.batch_buckets; default: %(default)s)")
    engine.add_argument("--coarse", dest="batch_buckets", action="store_const", const="coarse",
                   help="--batch-buckets coarse: power-of-two decoder batches only (faster start-up)")
    engine.add_argument("--encode-batch-buckets", choices=BATCH_BUCKET_LEVELS, default="coarse",
                   help="encoder batch buckets (tts.encode_batch_buckets; default: %(default)s)")
    engine.add_argument("--encode-fine", dest="encode_batch_buckets", action="store_const", const="fine",
                   help="--encode-batch-buckets fine: less row padding, more graphs")
    add_common_arguments(p)
    p.add_argument("--engine-clients", choices=("threads", "sinks"), default="threads",
                   help="engine mode, cuda: one thread per client iterating its request (threads), or clients "
                        "as sinks called on the scheduler thread per launch, as the served path receives (sinks)")
    p.add_argument("--steps-report", action="store_true", help="also print the scheduler breakdown of the whole run")
    engine.add_argument("--fast-lane", choices=("overlap", "exclusive", "off"), default="overlap",
                   help="RunnerOptions.fast_lane: new requests' encoder + first chunk on a high-priority stream (default overlap)")
    engine.add_argument("--fast-lanes", type=int, default=1, help="tts.fast_lanes: fast-lane streams side by side (overlap)")
    engine.add_argument("--speculate-frames", type=int, default=0, help="tts.speculate_frames: frames decoded ahead (0: off)")
    engine.add_argument("--speculate-below", type=int, default=2, help="tts.speculate_below: ... while at most this many run")
    engine.add_argument("--flow-once", action="store_true",
                   help="RunnerOptions.flow_once: the later chunks' flow once per utterance, packed, not per chunk window")
    engine.add_argument("--polyphase", action="store_true", help="RunnerOptions.polyphase: upsampling as plain convolutions")
    engine.add_argument("--fused-blocks", action="store_true", help="RunnerOptions.fused_blocks: residual blocks as fused Triton kernels")
    engine.add_argument("--fused-upsampling", action="store_true",
                   help="RunnerOptions.fused_upsampling: the decoder's input, upsampling and output convolutions as fused Triton kernels")
    engine.add_argument("--fused-flow", action="store_true", help="RunnerOptions.fused_flow: the flow's WaveNet layers as fused Triton kernels")
    engine.add_argument("--chunks-per-step", type=int, default=1,
                   help="RunnerOptions.chunks_per_step: later chunks of a request per scheduler step (0: all it has left)")
    engine.add_argument("--main-in-flight", type=int, default=1, help="RunnerOptions.main_in_flight: main-lane launches queued at once")
    engine.add_argument("--encoder-convs", choices=("cudnn", "gemm"), default="cudnn",
                   help="RunnerOptions.encoder_convs: the fp32 encoder's convolutions through cuDNN or as cuBLAS products")
    engine.add_argument("--fused-duration-predictor", action="store_true",
                   help="RunnerOptions.fused_duration_predictor: the duration predictor's layers and splines as fused Triton kernels")
    engine.add_argument("--fused-text-encoder", action="store_true",
                   help="RunnerOptions.fused_text_encoder: the text encoder's feed-forward elementwise work fused into its tap stacking")
    engine.add_argument("--text-encoder-products", choices=TEXT_ENCODER_PRODUCTS, default="cublas",
                   help="tts.text_encoder_products: with --fused-text-encoder, its products through cuBLAS or as "
                        "Triton convolutions skipping the padding, in that precision")  # fmt: skip
    engine.add_argument("--fused-attention", action="store_true",
                   help="RunnerOptions.fused_attention: the text encoder's relative-position attention as one Triton kernel per layer")
    engine.add_argument("--fused-prior", action="store_true",
                   help="RunnerOptions.fused_prior: the prior's expansion to frames as one Triton kernel writing the slot latents")
    engine.add_argument("--output-rate", type=int, default=0,
                   help="tts.output_rate: the engine resamples each chunk to this rate on the GPU, Hz (0: the voice's)")
    engine.add_argument("--phoneme-buckets", type=int, nargs="+",
                   help="tts.phoneme_buckets: phoneme-id lengths of the encoder's graphs (default: the engine's)")
    p.add_argument("--gpu-profile", type=float, default=0.0, metavar="SECONDS",
                   help="engine cuda: after a level, run it this long again under the profiler and add the kernel "
                        "timeline (bench.gpu_timeline) to its row as gpu_timeline (0: off)")
    p.add_argument("--gpu-profile-levels", type=int, nargs="+", default=[50], help="levels --gpu-profile applies to")
    p.add_argument("--gpu-trace", action="store_true",
                   help="with --gpu-profile: also keep its kernels (name, stream, start, duration) beside the results, "
                        "<results>-<backend>-<clients>-kernels.json.gz")
    p.add_argument("--graph-times", type=int, nargs="*", metavar="BATCH",
                   help="engine cuda: before the levels, time one replay of each graph the scheduler launches most "
                        "(encoder, first chunk, later chunks) alone at these batches (none given: 1 16 64); "
                        "in the backend's info as graph_ms (bench.gpu_steps.graph_times)")
    p.add_argument("--append", action="store_true", help="add rows to an existing results file")
    p.add_argument("--plot", type=Path, help="only render PNGs from this results JSON")
    p.add_argument("--make-sentences", action="store_true")
    args = p.parse_args(argv)
    if args.sets and args.config is None:
        p.error("--set needs --config (the per-setting flags set the engine without one)")
    if args.config is not None:
        dests = dict.fromkeys(action.dest for action in engine._group_actions)  # --coarse, --encode-fine share theirs
        given = [f"--{dest.replace('_', '-')}" for dest in dests if getattr(args, dest) != p.get_default(dest)]
        if given:
            p.error(f"--config takes the GPU engine's settings from {args.config}; {', '.join(given)} would not "
                    "apply: set them with --set SECTION.KEY=VALUE")  # fmt: skip
    args.backends = [b for item in args.backends for b in item.split(",") if b]
    args.concurrency = [int(n) for item in args.concurrency for n in item.split(",") if n]
    args.ws_formats = [f for item in args.ws_formats for f in item.split(",") if f]
    if args.make_sentences:
        make_sentences()
        return 0
    if args.plot:
        plot(args.plot)
        return 0
    run(common_arguments(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
