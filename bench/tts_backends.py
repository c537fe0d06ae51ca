"""The TTS backends of the load benchmarks: each speaks one clause per ``speak(ids)`` call.

``speak`` returns (first-audio delay s, samples, stall s) and blocks until the clause is done, as
``bench.harness.closed_loop`` expects; ``info`` is merged into every result row.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench.harness import Listening, cpu_name

if TYPE_CHECKING:
    from base.config import Config, GpuConfig


def bucket_levels(args: argparse.Namespace) -> tuple[str, str]:
    """(decoder, encoder) batch bucket levels (``base.config.BATCH_BUCKET_LEVELS``) of ``bench.tts_load``'s
    ``--batch-buckets`` / ``--encode-batch-buckets``, or of a namespace that says ``coarse`` /
    ``encode_fine`` (other benches'); default fine and coarse, as ``configs/gpu.toml``."""
    decode = getattr(args, "batch_buckets", None) or ("coarse" if getattr(args, "coarse", False) else "fine")
    encode = getattr(args, "encode_batch_buckets", None) or ("fine" if getattr(args, "encode_fine", False) else "coarse")
    return decode, encode


def config_of(args: argparse.Namespace) -> Config:
    """``bench.tts_load --config``: that file with ``--voice`` and each ``--set`` over it, and the
    environment's ``VOXLOOP_*`` settings as the server of a ws run reads them."""
    from base.config import load_config

    return load_config(args.config, [f"tts.voice_path={args.voice}", *args.sets])


def config_tag(args: argparse.Namespace) -> str:
    """The backend-name suffix of a ``--config`` run: the file's stem and each ``--set``, e.g.
    ``-gpu-fast_lanes=1``."""
    sets = "".join(f"-{s.removeprefix('tts.')}" for s in args.sets)
    return f"-{Path(args.config).stem}{sets}"


def cuda_variant(args: argparse.Namespace, timing_tag: bool) -> str:
    """The backend-name suffix for the GPU engine's start-up options, e.g. ``-compiled-encoder-limit3``
    (``timing_tag``: ``-cudnnbench`` when cuDNN times its algorithms, before the limit)."""
    timing, limit = args.cudnn_benchmark, getattr(args, "cudnn_benchmark_limit", 10)
    stages = getattr(args, "cudnn_benchmark_stages", ("encode", "decode"))
    return (("-compiled" if args.compile else "") + ("-encoder" if getattr(args, "compile_encoder", False) else "")
            + ("-cudnnbench" if timing_tag and timing else "") + (f"-limit{limit}" if timing and limit != 10 else "")
            + ("".join(f"-timed-{s}" for s in stages) if timing and set(stages) != {"encode", "decode"} else "")
            + ("" if (levels := bucket_levels(args))[0] == "fine" else f"-{levels[0]}")
            + ("" if levels[1] == "coarse" else f"-enc{levels[1]}")
            + (f"-maxframes{args.max_frames}" if getattr(args, "max_frames", 3072) != 3072 else "")
            + (f"-ahead{args.speculate_frames}" if getattr(args, "speculate_frames", 0) else "")
            + ("-flowonce" if getattr(args, "flow_once", False) else "")
            + (f"-steps{getattr(args, 'chunks_per_step', 1)}" if getattr(args, "chunks_per_step", 1) != 1 else "")
            + (f"-inflight{getattr(args, 'main_in_flight', 1)}" if getattr(args, "main_in_flight", 1) != 1 else "")
            + ("-polyphase" if getattr(args, "polyphase", False) else "")
            + ("-fused" if getattr(args, "fused_blocks", False) else "")
            + ("-fusedup" if getattr(args, "fused_upsampling", False) else "")
            + ("-fusedflow" if getattr(args, "fused_flow", False) else "")
            + ("-gemmenc" if getattr(args, "encoder_convs", "cudnn") == "gemm" else "")
            + (f"-ids{len(args.phoneme_buckets)}" if getattr(args, "phoneme_buckets", None) else "")
            + ("-fuseddp" if getattr(args, "fused_duration_predictor", False) else "")
            + ("-fusedenc" if getattr(args, "fused_text_encoder", False) else "")
            + (f"-{args.text_encoder_products}" if getattr(args, "text_encoder_products", "cublas") != "cublas" else "")
            + ("-fusedprior" if getattr(args, "fused_prior", False) else "")
            + ("-fusedattn" if getattr(args, "fused_attention", False) else "")
            + (f"-out{args.output_rate}" if getattr(args, "output_rate", 0) else ""))


class CudaBackend:
    """In-process ``CudaTtsEngine``; one request = one clause streamed in chunks."""

    name = "cuda"

    def __init__(self, args: argparse.Namespace, gpu: GpuConfig | None = None) -> None:
        """The engine of ``args.config`` with ``args.sets`` (``bench.tts_load --config``: its ``[gpu]`` too),
        else of the per-setting flags; ``gpu``: then the engine's ``GpuConfig`` (default: ``args.allocator``,
        other fields default)."""
        import torch

        from tts_engine.torch_vits.cuda_engine import CudaTtsEngine

        self.torch = torch
        t0 = time.perf_counter()
        if getattr(args, "config", None) is not None:  # the settings of a config file, as the server has them
            cfg = config_of(args)
            self.engine = CudaTtsEngine.from_config(cfg.replace("tts", device=args.device))
            self.startup_s = time.perf_counter() - t0
            self.name = f"cuda-{cfg.tts.precision}" + config_tag(args)
            allocator, max_batch = cfg.gpu.allocator, cfg.tts.max_batch
        else:
            self.engine = self._from_flags(args, gpu)
            self.startup_s = time.perf_counter() - t0
            self.name = f"cuda-{args.precision}" + cuda_variant(args, timing_tag=True)
            allocator, max_batch = args.allocator, args.max_batch
        opts = self.engine.runner.options
        self.sample_rate = self.engine.sample_rate
        self.output_rate = opts.output_rate
        runner = self.engine.runner
        self.info = {
            "startup_s": round(self.startup_s, 2), "graph_capture_s": round(runner.capture_s, 2),
            "capture_s_by_stage": {k: round(v, 2) for k, v in runner.stage_capture_s.items()},
            "graphs": len(runner.encode_steps) + len(runner.decode_steps) + len(runner.flow_steps),
            "capture_peak_mb": round(runner.capture_peak_mb, 1),
            "memory_after_capture_mb": round(self.torch.cuda.memory_reserved() / 2**20, 1),
            "chunk_frames": opts.chunk_frames, "tail_chunk_frames": opts.tail_chunk_frames, "compile": opts.compile,
            "compile_encoder": opts.compile_encoder, "cudnn_benchmark": opts.cudnn_benchmark,
            "cudnn_benchmark_limit": opts.cudnn_benchmark_limit,
            "cudnn_benchmark_stages": list(opts.cudnn_benchmark_stages), "allocator": allocator, "fast_lane": opts.fast_lane,
            "fast_lanes": opts.fast_lanes, "speculate_frames": opts.speculate_frames, "speculate_below": opts.speculate_below,
            "flow_once": opts.flow_once,
            "polyphase": opts.polyphase, "fused_blocks": opts.fused_blocks,
            "fused_upsampling": opts.fused_upsampling, "fused_flow": opts.fused_flow, "chunks_per_step": opts.chunks_per_step,
            "main_in_flight": opts.main_in_flight, "encoder_convs": opts.encoder_convs,
            "phoneme_buckets": list(opts.phoneme_buckets), "fused_duration_predictor": opts.fused_duration_predictor,
            "fused_text_encoder": opts.fused_text_encoder, "text_encoder_products": opts.text_encoder_products,
            "fused_prior": opts.fused_prior, "fused_attention": opts.fused_attention,
            "fused_attention_tile": opts.fused_attention_tile,
            "decode_batches": len(opts.decode_batches), "encode_batches": len(opts.encode_batches), "output_rate": opts.output_rate,
            "precision": opts.precision, "max_batch": max_batch, "max_frames": opts.max_frames,
        }  # fmt: skip
        if getattr(args, "config", None) is not None:
            self.info.update(config=str(args.config), sets=list(args.sets))

    @staticmethod
    def _from_flags(args: argparse.Namespace, gpu: GpuConfig | None):  # noqa: ANN205 - CudaTtsEngine
        """The engine of ``bench.tts_load``'s per-setting flags (the engine's own defaults where not given)."""
        from tts_engine.torch_vits.cuda_engine import CudaTtsEngine
        from tts_engine.torch_vits.runner import RunnerOptions, batch_buckets
        from tts_engine.voice import Voice
        from base.config import GpuConfig

        fast_lane = getattr(args, "fast_lane", "overlap")  # callers building their own Namespace may omit it
        fast_lanes = getattr(args, "fast_lanes", 1)
        decode_level, encode_level = bucket_levels(args)
        opts = RunnerOptions(
            chunk_frames=args.chunk_frames, max_frames=args.max_frames, precision=args.precision,
            tail_chunk_frames=args.tail_chunk_frames, decode_batches=batch_buckets(args.max_batch, decode_level),
            encode_batches=batch_buckets(args.max_batch, encode_level),
            compile=args.compile,
            compile_encoder=getattr(args, "compile_encoder", False),
            cudnn_benchmark=args.cudnn_benchmark, cudnn_benchmark_limit=getattr(args, "cudnn_benchmark_limit", 10),
            cudnn_benchmark_stages=tuple(getattr(args, "cudnn_benchmark_stages", ("encode", "decode"))),
            fast_lane=fast_lane, fast_lanes=fast_lanes, speculate_frames=getattr(args, "speculate_frames", 0),
            speculate_below=getattr(args, "speculate_below", 2), flow_once=getattr(args, "flow_once", False),
            polyphase=getattr(args, "polyphase", False),
            fused_blocks=getattr(args, "fused_blocks", False),
            fused_upsampling=getattr(args, "fused_upsampling", False), fused_flow=getattr(args, "fused_flow", False),
            chunks_per_step=getattr(args, "chunks_per_step", 1),
            main_in_flight=getattr(args, "main_in_flight", 1), encoder_convs=getattr(args, "encoder_convs", "cudnn"),
            fused_duration_predictor=getattr(args, "fused_duration_predictor", False),
            fused_text_encoder=getattr(args, "fused_text_encoder", False),
            text_encoder_products=getattr(args, "text_encoder_products", "cublas"),
            fused_prior=getattr(args, "fused_prior", False),
            fused_attention=getattr(args, "fused_attention", False),
            output_rate=getattr(args, "output_rate", 0),
            **({"phoneme_buckets": tuple(args.phoneme_buckets)} if getattr(args, "phoneme_buckets", None) else {}),
        )  # fmt: skip
        return CudaTtsEngine(Voice.load(args.voice), opts, device=args.device, queue_size=4096,
                             gpu=gpu or GpuConfig(allocator=args.allocator))  # fmt: skip

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
        from tts_engine.chunked_voice import resolve_chunked_voice
        from base.config import load_config

        cfg = load_config(overrides=[f"tts.voice_path={args.voice}"])
        plan = ChunkPlan(args.cpu_chunk_frames or cfg.tts.chunk_frames,
                         args.cpu_tail_chunk_frames or cfg.tts.tail_chunk_frames or ChunkPlan.tail_frames)  # fmt: skip
        threads = max(1, (os.cpu_count() or 1) // workers)
        chunked_dir = resolve_chunked_voice(cfg).path  # exports once (needs torch) when missing
        self.engine = OnnxTtsEngine(Voice.load(args.voice), threads=threads, workers=workers,
                                    chunked_dir=chunked_dir, chunk_plan=plan)  # fmt: skip
        self.sample_rate = self.engine.sample_rate
        self.info = {"workers": workers, "threads_per_worker": threads, "cpu": cpu_name(),
                     "chunk_frames": plan.first_frames, "tail_chunk_frames": plan.tail_frames}  # fmt: skip

    def speak(self, ids: list[int]) -> tuple[float, int, float]:
        return consume(self.engine.synthesize_ids(ids), self.sample_rate)


def scheduler_counters(scheduler) -> dict:
    """A ``BatchScheduler``'s running counters (steps, lanes, launches), for ``scheduler_breakdown``."""
    return {"steps": scheduler.steps, "step_s": scheduler.step_s, "lane_launches": dict(scheduler.lane_launches),
            "lane_s": dict(scheduler.lane_s), **scheduler.launch_stats}  # fmt: skip


def scheduler_breakdown(before: dict, after: dict) -> dict:
    """What the GPU scheduler did between two ``scheduler_counters`` (a level, its warm-up
    included): steps and their mean wall time; per lane, launches and mean time from launch to
    hand-out; rows per encoder / decoder launch; padding: rows of the captured buckets not used,
    phoneme ids of the encoder's buckets not used, decoder frames computed but not handed out
    (padding rows, chunk tails past an utterance's end, rows decoded ahead and dropped), in %; with
    ``flow_once``, its packed flow launches per step and the share of their frames that were gaps and
    padding, in %."""
    d = {k: after[k] - before[k] for k in after if not isinstance(after[k], dict)}
    launches = {lane: after["lane_launches"][lane] - before["lane_launches"][lane] for lane in after["lane_launches"]}
    lane_s = {lane: after["lane_s"][lane] - before["lane_s"][lane] for lane in after["lane_s"]}

    def pct(part: float, whole: float) -> float | None:
        return round(100 * part / whole, 1) if whole else None

    return {
        "steps": d["steps"], "step_mean_ms": round(1000 * d["step_s"] / max(1, d["steps"]), 2),
        "lane_launches": launches,
        "lane_mean_ms": {lane: round(1000 * lane_s[lane] / n, 2) for lane, n in launches.items() if n},
        "encode_rows_per_launch": round(d["encode_rows"] / max(1, d["encode_launches"]), 2),
        "decode_rows_per_launch": round(d["decode_rows"] / max(1, d["decode_launches"]), 2),
        "encode_padding_rows_pct": pct(d["encode_padded_rows"] - d["encode_rows"], d["encode_padded_rows"]),
        "encode_padding_ids_pct": pct(d["encode_padded_ids"] - d["encode_ids"], d["encode_padded_ids"]),
        "decode_padding_rows_pct": pct(d["decode_padded_rows"] - d["decode_rows"], d["decode_padded_rows"]),
        "decode_frames_not_out_pct": pct(d["decode_padded_frames"] - d["decode_frames_out"], d["decode_padded_frames"]),
        **({"flow_launches_per_step": round(d["flow_launches"] / max(1, d["steps"]), 2),
            "flow_padding_pct": pct(d["flow_frames"] - d["flow_frames_used"], d["flow_frames"])}
           if d.get("flow_launches") else {}),
    }  # fmt: skip


def consume(chunks, sample_rate: int) -> tuple[float, int, float]:
    """Read a clause's chunks: (first-audio delay s, samples, stall s) (``bench.harness.Listening``)."""
    heard = Listening(sample_rate, time.perf_counter())
    for chunk in chunks:
        heard.chunk(time.perf_counter(), chunk.num_samples)
    return heard.first or 0.0, heard.samples, heard.stall
