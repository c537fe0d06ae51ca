"""The GPU TTS engine's scheduling against a model of its GPU: engine-mode load with no GPU.

``configs/gpu.toml`` (with ``--variant`` overrides, as ``voxloop --set`` takes them) builds the real
``CudaTtsEngine`` and ``BatchScheduler``; only the step runner is a stand-in,
``bench.instant_runner.InstantRunner``, whose every launch keeps its lane busy for the time the same
CUDA graph took on a GPU at that padded batch (``GpuTimes``: the ``graph_ms`` of a ``bench.tts_load
--graph-times`` row, ``--gpu-times``), and which gives each sentence the frames of its audio. Load
as ``bench.tts_load``'s engine mode: the load bench's 40 sentences (their espeak-ng ids, frames from
their audio seconds), a thread per client, closed loop; rows as its rows (``scheduler``: the same
breakdown) plus ``gpu_busy_pct`` (modeled GPU seconds queued per second, in %), ``gpu_idle_pct``
(of the level's time, the share in which the modeled GPU ran no launch) and
``frames_per_audio_frame`` (``chunk_work``: the frames the flow and the decoder compute per frame of
the load's audio in the variant's chunk sizes).

How the lanes share the GPU (``--gpu-capacity``, ``bench.instant_runner.SharedGpu``): launches
running at once on different lanes (CUDA streams) share it, each at ``min(1, C / k)`` of its own
speed with ``k`` of them: ``C`` = 1, no overlap (the GPU's work takes as long as one launch after
another: a lower bound); ``inf``, lanes side by side at full speed (more overlap than streams get:
an upper bound). Kernel traces on the H200 saw its two streams overlap 34 % of the busy time; fit
``C`` on one measured row and check it on the others.

``--measured`` tts_load results: each row at the same clients and scheduling settings (fast lanes,
chunk sizes, buckets, launches in flight, decoding ahead) is this model's check; a row says its
measured QPS (mean, min, max of the matching rows) and ``model_of_measured_pct``. What-if:
``--scale ENCODER DECODER`` multiplies the graph times (0.5: kernels twice as fast; such rows have
no measured check).

``RunnerOptions.flow_once`` variants: with ``flowed`` and ``flow`` graph times in ``--gpu-times`` (a
``--graph-times`` row of a ``--flow-once`` run) its launches take those; else ``--flow-cost`` says
how a measured windowed chunk's graph splits between the flow and the decoder
(``bench.instant_runner.FlowCost``).

Not modeled: the host work of a real launch (staging the inputs, the copies, the graph replay:
the stand-in's launches cost the scheduler thread less), launches slowing each other beyond the two
bounds, and the noise of durations (each sentence always its one frame count). On a host slower
than the GPU host's CPU the scheduler's own work weighs more. A model's figure is no GPU figure:
it ranks settings and says what kernels would need to be faster; confirm on the GPU. ::

    python -m bench.tts_gpu_model --gpu-times bench/results/tts_load-h100-2026-12-06-ship.json \\
        --measured bench/results/tts_load-h100-2026-12-06-lanes.json --clients 1 50 \\
        --variant shipped --variant fine tts.encode_batch_buckets=fine
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from bench.harness import ROOT, add_common_arguments, closed_loop, load_sentences, pyplot, report, save_png, summarize
from bench.instant_runner import HOP, FlowCost, GpuTimes, StandInEngine
from bench.tts_backends import scheduler_breakdown, scheduler_counters
from tts_engine.torch_vits.chunked import ChunkGeometry
from tts_engine.torch_vits.runner import RunnerOptions
from base.config import load_config

#: Settings a measured row must share with a variant to check it (``bench.tts_load``'s row keys):
#: the scheduling, and the kernels (their graph times are the model's).
SETTINGS = ("fast_lane", "fast_lanes", "chunk_frames", "tail_chunk_frames", "encode_batches", "decode_batches",
            "main_in_flight", "chunks_per_step", "speculate_frames", "speculate_below", "max_batch", "phoneme_buckets",
            "precision", "polyphase", "fused_blocks", "fused_upsampling", "fused_flow",
            "encoder_convs", "fused_duration_predictor", "fused_text_encoder", "text_encoder_products", "fused_prior",
            "fused_attention", "fused_attention_tile", "flow_once",
            "output_rate")  # fmt: skip


def voice_contexts(voice: str | None) -> tuple[int, int, int]:
    """The flow's and the decoder's context and the flow's ``conv_radius``, frames, of ``voice``
    (default: ``configs/gpu.toml``'s)."""
    from tts_engine.torch_vits.weights import load_vits
    from base import models

    cfg = load_config(ROOT / "configs" / "gpu.toml", [f"tts.voice_path={voice}"] if voice else [], environ={})
    model = load_vits(models.resolve_voice(cfg).path)
    return model.flow.receptive_radius, model.dec.receptive_radius, model.flow.conv_radius


def result_rows(path: Path) -> list[dict]:
    """The rows of a result file: a list of rows (``bench.tts_load``), or ``{"rows": [...]}``."""
    data = json.loads(Path(path).read_text())
    return data["rows"] if isinstance(data, dict) else data


def load_graph_ms(path: Path, row: int | None = None) -> tuple[dict[str, float], dict]:
    """The ``graph_ms`` of a tts_load result (a list of rows, or ``{"rows": [...]}``): of its
    ``row``-th row, or of the first row that has them; returns (graph_ms, where they came from)."""
    rows = result_rows(path)
    with_times = [(i, r) for i, r in enumerate(rows) if r.get("graph_ms")]
    if not with_times:
        raise SystemExit(f"{path}: no row has graph_ms (bench.tts_load --graph-times)")
    i, r = with_times[0] if row is None else next(((i, r) for i, r in with_times if i == row), (None, None))
    if r is None:
        raise SystemExit(f"{path}: row {row} has no graph_ms (rows with them: {[i for i, _ in with_times]})")
    return r["graph_ms"], {"file": str(path), "row": i, "backend": r.get("backend"), "date": r.get("date"),
                           "hardware": r.get("hardware")}  # fmt: skip


def settings(engine) -> dict:  # noqa: ANN001 - CudaTtsEngine
    """The engine's settings as a tts_load row names them (``SETTINGS``)."""
    o = engine.runner.options
    named = {k: getattr(o, k) for k in SETTINGS if hasattr(o, k)}
    return {**named, "encode_batches": len(o.encode_batches), "decode_batches": len(o.decode_batches),
            "max_batch": engine.scheduler.max_batch, "phoneme_buckets": list(o.phoneme_buckets)}  # fmt: skip


def measured_qps(rows: list[dict], clients: int, setting: dict) -> dict | None:
    """QPS of the engine-mode ``rows`` at ``clients`` whose settings (those each row has) are ``setting``'s."""
    qps = [r["qps"] for r in rows if r.get("mode") == "engine" and r.get("concurrency") == clients
           and all(r[k] == v for k, v in setting.items() if k in r)]  # fmt: skip
    if not qps:
        return None
    return {"mean": round(float(np.mean(qps)), 1), "min": min(qps), "max": max(qps), "n": len(qps)}


def chunk_work(options: RunnerOptions, flow_context: int, dec_context: int, edge_frames: int,
               frames: Iterable[int], conv_radius: int = 0) -> dict:  # fmt: skip
    """Frames the flow and the decoder compute per frame of audio for utterances of ``frames``
    frames in ``options``' chunk sizes (``ChunkGeometry``'s windows; no padding rows, no chunks
    decoded ahead): first chunks as the engine decodes them (no context before them on a fast lane,
    ``ChunkGeometry.first``), and under ``first_with_context`` as a symmetric window would (before
    2026-12-05, or with ``fast_lane = "off"``). With ``options.flow_once`` the flow's frames are the
    first chunks' windows and each utterance's packed segment (``chunked.pack_flow``: from the context
    before its second chunk to its end, and ``conv_radius`` gap frames; no bucket padding)."""
    frames = list(frames)
    if options.flow_once:
        before = max(0, options.chunk_frames - dec_context - edge_frames - flow_context)
        first = ChunkGeometry(options.chunk_frames, flow_context, dec_context, HOP, edge_frames, first=True)
        flow = sum(first.window_frames + (n - before + conv_radius if n > options.chunk_frames else 0) for n in frames)
        windowed = chunk_work(dataclasses.replace(options, flow_once=False), flow_context, dec_context, edge_frames,
                              frames)  # fmt: skip
        return {**windowed, "flow": round(flow / sum(frames), 3), "flow_windowed": windowed["flow"]}
    geometries = {c: ChunkGeometry(c, flow_context, dec_context, HOP, edge_frames) for c in options.chunk_sizes}
    firsts = {trim: ChunkGeometry(options.chunk_frames, flow_context, dec_context, HOP, edge_frames, first=trim)
              for trim in (True, False)}  # fmt: skip
    work = {trim: [0, 0] for trim in firsts}
    audio = 0
    for n in frames:
        for start, size in options.chunk_plan(n):
            for trim, counts in work.items():
                g = firsts[trim] if start == 0 else geometries[size]
                counts[0] += g.window_frames
                counts[1] += g.decoder_frames
        audio += n
    engine_trims = options.fast_lane != "off"
    per = {trim: {"flow": round(f / audio, 3), "decoder": round(d / audio, 3)} for trim, (f, d) in work.items()}
    return {**per[engine_trims], "first_with_context": per[False]}


def frames_by_ids(sentences: list[dict], rate: int) -> dict[bytes, int]:
    """Each sentence's frames (its audio seconds at ``rate`` / the hop), keyed by its int64 ids' bytes."""
    return {np.asarray(s["ids"], np.int64).tobytes(): round(s["audio_s"] * rate / HOP) for s in sentences}


def run_variant(name: str, sets: list[str], capacity: float, times: GpuTimes, args: argparse.Namespace,
                measured: list[dict], sentences: list[dict], frames: dict[bytes, int],
                contexts: tuple[int, int, int]) -> list[dict]:  # fmt: skip
    """Each ``--clients`` level of one variant at one capacity; ``frames``: ``frames_by_ids`` of ``sentences``;
    ``contexts``: the voice's flow and decoder context and flow convolution radius, frames (``chunk_work``)."""
    overrides = ["tts.device=cpu", *([f"tts.voice_path={args.voice}"] if args.voice else []), *sets]
    flow_cost = FlowCost(args.flow_cost, *contexts)
    backend = StandInEngine(overrides, lambda ids: frames[ids.tobytes()], 0.0, gpu_times=times,
                            gpu_capacity=None if capacity == float("inf") else capacity, flow_cost=flow_cost)  # fmt: skip
    backend.name = f"model-c{capacity:g}-{name}"
    rows = []
    try:
        setting = settings(backend.engine)
        runner, scheduler = backend.engine.runner, backend.engine.scheduler
        work = chunk_work(runner.options, *contexts[:2], runner.resampler.edge_frames, frames.values(), contexts[2])
        for clients in args.clients:
            before, gpu_s, busy_s, t0 = scheduler_counters(scheduler), runner.gpu_s, runner.busy_s, time.perf_counter()
            row = summarize(closed_loop(backend, sentences, clients, args.duration, args.warmup), backend, clients,
                            args.hardware)  # fmt: skip
            busy = (runner.gpu_s - gpu_s) / (args.duration + args.warmup)
            idle = None if busy_s is None else 100 * (1 - (runner.busy_s - busy_s) / (time.perf_counter() - t0))
            scaled = any(v != 1 for v in times.scale.values())
            check = None if scaled else measured_qps(measured, clients, setting)  # no GPU ran faster kernels
            label = name + ("".join(f" {k} x{v:g}" for k, v in times.scale.items() if v != 1) if scaled else "")
            rows.append({**row, "variant": label, "sets": sets, "gpu_capacity": str(capacity), "scale": times.scale,
                         "gpu_busy_pct": round(100 * busy, 1), "gpu_idle_pct": None if idle is None else round(idle, 1),
                         "frames_per_audio_frame": work, **setting,
                         "scheduler": scheduler_breakdown(before, scheduler_counters(scheduler)),
                         "measured_qps": check,
                         "model_of_measured_pct": round(100 * row["qps"] / check["mean"], 1) if check else None})  # fmt: skip
            print(rows[-1], flush=True)
    finally:
        backend.close()
    return rows


def plot(rows: list[dict], path: Path) -> Path:
    plt = pyplot()
    levels = sorted({r["concurrency"] for r in rows})
    n = len({r["variant"] for r in rows})
    fig, axes = plt.subplots(1, len(levels), figsize=(max(5.0, 0.9 * n + 2) * len(levels), 4.5), squeeze=False)
    for ax, clients in zip(axes[0], levels):
        level = [r for r in rows if r["concurrency"] == clients]
        variants = list(dict.fromkeys(r["variant"] for r in level))
        x = np.arange(len(variants))
        capacities = list(dict.fromkeys(r["gpu_capacity"] for r in level))
        width = 0.8 / (len(capacities) + 1)
        for k, c in enumerate(capacities):
            qps = [next((r["qps"] for r in level if r["variant"] == v and r["gpu_capacity"] == c), 0) for v in variants]
            ax.bar(x + k * width, qps, width, label=f"model, capacity {c}")
        measured = [next((r["measured_qps"] for r in level if r["variant"] == v and r["measured_qps"]), None)
                    for v in variants]  # fmt: skip
        if any(measured):
            mean = [m["mean"] if m else 0 for m in measured]
            err = [[max(0, m["mean"] - m["min"]) if m else 0 for m in measured],
                   [max(0, m["max"] - m["mean"]) if m else 0 for m in measured]]  # fmt: skip
            ax.bar(x + len(capacities) * width, mean, width, yerr=err, capsize=3, color="tab:gray",
                   label="measured (min-max)")
        ax.set_xticks(x + len(capacities) * width / 2, variants, fontsize=7, rotation=30, ha="right")
        ax.set_title(f"{clients} clients", fontsize=10)
        ax.set_ylabel("sentences / s")
        ax.legend(fontsize=7)
    fig.suptitle("GPU TTS scheduling against measured graph times (no GPU)", fontsize=10)
    return save_png(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu-times", type=Path, required=True, help="a bench.tts_load result with graph_ms")
    p.add_argument("--gpu-times-row", type=int, help="which of its rows (default: the first with graph_ms)")
    p.add_argument("--measured", type=Path, nargs="*", default=[], help="tts_load results to check the model against")
    p.add_argument("--variant", nargs="+", action="append", metavar=("NAME", "SECTION.KEY=VALUE"),
                   help="a name and configs/gpu.toml overrides (default: one variant, 'shipped', none)")
    p.add_argument("--gpu-capacity", type=float, nargs="+", default=[1.0, float("inf")],
                   help="launches' work the GPU does at once (1: no overlap; inf: lanes side by side)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 50])
    p.add_argument("--duration", type=float, default=8.0, help="measured seconds per level")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds per level before measuring")
    p.add_argument("--scale", type=float, nargs=2, action="append", metavar=("ENCODER", "DECODER"),
                   help="factors on the encoder's and the decoders' graph times, a run of every variant per pair "
                        "(default: 1 1, as measured)")  # fmt: skip
    p.add_argument("--flow-cost", type=float, metavar="RATIO",
                   help="for RunnerOptions.flow_once variants when --gpu-times has no flowed / flow graph times: the flow's "
                        "GPU time per frame relative to the decoder's (bench.instant_runner.FlowCost)")  # fmt: skip
    add_common_arguments(p)
    args = p.parse_args(argv)
    graph_ms, source = load_graph_ms(args.gpu_times, args.gpu_times_row)
    measured = [r for path in args.measured for r in result_rows(path)]
    sentences = load_sentences()
    frames = frames_by_ids(sentences, json.loads((ROOT / "bench" / "tts_sentences.json").read_text())["sample_rate"])
    contexts = voice_contexts(args.voice)
    rows = []
    for encoder, decoder in args.scale or [(1.0, 1.0)]:
        times = GpuTimes(graph_ms, {"encode": encoder, "decode": decoder})
        for name, *sets in args.variant or [["shipped"]]:
            for capacity in args.gpu_capacity:
                rows += run_variant(name, sets, capacity, times, args, measured, sentences, frames, contexts)
    extra = {"gpu_times": source, "graph_ms": graph_ms, "measured": [str(p) for p in args.measured],
             "flow_cost": args.flow_cost,
             "runner": "InstantRunner (each launch its graph's measured time at its padded batch, GpuTimes)"}  # fmt: skip
    report("tts_gpu_model", rows, extra, args, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
