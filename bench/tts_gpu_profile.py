"""Where the GPU TTS time goes: per-bucket CUDA-graph step times, flow vs decoder, precision.

Measures on the device (CUDA events around graph replays, median of ``--reps``, after
warm-up; inputs are real utterances, never zeros): the two ceilings (bf16 matmul rate,
device copy bandwidth), each decode batch bucket's step time and audio throughput for
each precision and chunk size, encoder step times, the flow/decoder split, FLOPs per
chunk (counted by hooks on every convolution), the SNR of bf16/fp16 against fp32, and
saves GPU audio for the intelligibility check (``--wavs``). Writes
``<out>/tts_gpu_profile-<hardware>-<date>.json``. Example::

    python -m bench.tts_gpu_profile --voice VOICE.onnx --out OUT/ --wavs OUT/gpu_wavs.npz
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench.gpu_steps import decode_one, fill_slots, timed
from bench.harness import add_common_arguments, common_arguments, load_sentences, result_path, write_json
from tts_engine.torch_vits.chunked import decode_windows, gather_windows
from tts_engine.torch_vits.model import pad_ids
from tts_engine.torch_vits.runner import RunnerOptions, StepRunner
from tts_engine.torch_vits.weights import load_vits

SR = 22050


def ceilings() -> dict:
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = timed(lambda: x @ y, 10)
    src = torch.randn(2**29, device="cuda")  # 2 GiB
    dst = torch.empty_like(src)
    copy_ms = timed(lambda: dst.copy_(src), 10)
    return {"bf16_matmul_tflops": round(2 * 8192**3 / ms / 1e9, 1), "copy_tb_s": round(2 * src.numel() * 4 / copy_ms / 1e9, 2)}


def conv_flops(model, z: torch.Tensor, mask: torch.Tensor, geometry) -> float:
    """Multiply-adds x2 of every Conv1d / ConvTranspose1d in one ``decode_windows`` call."""
    total = [0.0]

    def hook(mod, inp, out):
        k = mod.kernel_size[0]
        cin = mod.in_channels // mod.groups
        length = inp[0].shape[-1] if isinstance(mod, torch.nn.ConvTranspose1d) else out.shape[-1]
        total[0] += 2.0 * out.shape[0] * mod.out_channels * cin * k * length

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d))]
    with torch.inference_mode():
        decode_windows(model, z, mask, geometry)
    for h in handles:
        h.remove()
    return total[0]


def profile_runner(model, precision: str, chunk: int, tail: int, batches: list[int], sentences, reps: int) -> dict:
    t0 = time.perf_counter()
    opts = RunnerOptions(chunk_frames=chunk, tail_chunk_frames=tail, max_frames=1024, decode_batches=tuple(batches),
                         encode_batches=(1, 8, 32), phoneme_buckets=(256,), precision=precision)  # fmt: skip
    runner = StepRunner(model, opts, "cuda")
    out = {"precision": precision, "chunk_sizes": opts.chunk_sizes, "capture_s": round(runner.capture_s, 2),
           "build_s": round(time.perf_counter() - t0, 2), "memory_mb": round(runner.memory_mb(), 1), "decode": [],
           "encode": []}  # fmt: skip
    fill_slots(runner, sentences, noise=True)
    for (size, b, lane), step in sorted(runner.decode_steps.items()):
        if lane != "main":  # the fast lane's first-chunk graphs are the same shapes
            continue
        step.inputs[0].copy_(torch.arange(b))
        step.inputs[1].fill_(chunk)  # the second chunk: a window inside the utterance
        step.inputs[2].fill_(1)
        ms = timed(step.graph.replay, reps)
        audio_s = b * runner.geometries[size].chunk_samples / SR
        out["decode"].append({"chunk": size, "batch": b, "step_ms": round(ms, 3),
                              "audio_s_per_s": round(audio_s / ms * 1000, 1)})  # fmt: skip
    for (b, t, lane), step in sorted(runner.encode_steps.items()):
        if lane != "fast":  # the same graphs again on another fast lane
            continue
        ids, lengths = pad_ids([sentences[i % len(sentences)] for i in range(b)], t)
        step.inputs[0].copy_(ids)
        step.inputs[1].copy_(lengths)
        step.inputs[2].copy_(torch.tensor([[0.667, 1.0, 0.8]] * b))
        step.inputs[3].fill_(runner.scratch_slot)
        out["encode"].append({"batch": b, "phonemes": t, "step_ms": round(timed(step.graph.replay, reps), 3)})
    out["split"] = split_flow_decoder(runner, batches, reps)
    return out, runner


def split_flow_decoder(runner: StepRunner, batches: list[int], reps: int) -> list[dict]:
    """Flow alone and decoder alone, each captured as a graph, at a few batch sizes (largest chunk)."""
    geo, model, rows = runner.geometries[max(runner.geometries)], runner.synth_model, []
    for b in [x for x in batches if x in (1, 32, 128)] or batches[-1:]:
        slots = torch.arange(b, device="cuda")
        z, mask = gather_windows(runner.latents, slots, slots * 0, runner.frames[:b], geo)  # first frames: real data
        z, mask = z.to(runner.dtype), mask.to(runner.dtype)
        fc = geo.flow_context
        zi, mi = z[:, :, fc:-fc].contiguous(), mask[:, :, fc:-fc].contiguous()
        res = {"batch": b, "chunk": geo.chunk_frames}
        with torch.inference_mode():
            for name, fn in (("flow", lambda: model.flow.reverse(z, mask)), ("decoder", lambda: model.dec(zi, mi)),
                             ("both", lambda: decode_windows(model, z, mask, geo))):  # fmt: skip
                fn()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fn()
                res[f"{name}_ms"] = round(timed(g.replay, reps), 3)
            res["flops_per_step"] = conv_flops(model, z, mask, geo)
        res["conv_tflops"] = round(res["flops_per_step"] / res["both_ms"] / 1e9, 1)
        rows.append(res)
    return rows


def quality(model, runner: StepRunner, sentences, fp32_audio: dict) -> dict:
    """SNR (dB) of the chunked engine path at ``runner``'s precision against fp32 whole utterances."""
    frames = fill_slots(runner, sentences[:8], noise=False)[:8]
    snrs, max_abs = [], []
    for slot, f in enumerate(frames):
        audio = decode_one(runner, slot, f) / 32767.0
        ref = fp32_audio[slot]
        err = audio - ref
        snrs.append(float(10 * np.log10(np.sum(ref**2) / max(np.sum(err**2), 1e-20))))
        max_abs.append(float(np.abs(err).max()))
    return {"snr_db_min": round(min(snrs), 1), "snr_db_mean": round(float(np.mean(snrs)), 1), "max_abs": round(max(max_abs), 4)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(p)
    p.add_argument("--precisions", default="fp32,bf16,fp16")
    p.add_argument("--chunk", type=int, default=64, help="first chunk, frames")
    p.add_argument("--tail", type=int, default=256, help="largest later chunk, frames")
    p.add_argument("--n-wavs", type=int, default=16)
    p.add_argument("--batches", default="1,8,32,64,128")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--wavs", type=Path, help="save GPU audio of --n-wavs sentences (npz, int16) per precision")
    args = common_arguments(p.parse_args())
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference must be fp32
    torch.backends.cudnn.allow_tf32 = False
    sentences_meta = load_sentences()
    sentences = [s["ids"] for s in sentences_meta]
    batches = [int(b) for b in args.batches.split(",")]
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "ceilings": ceilings(), "runs": []}
    print(json.dumps(report["ceilings"]), flush=True)
    model = load_vits(args.voice, device="cuda")
    with torch.inference_mode():  # fp32 whole-utterance references, noise 0
        fp32_audio = [model.infer(torch.tensor([s], device="cuda"), torch.tensor([len(s)], device="cuda"), 0.0, 1.0, 0.0)[0][0].cpu().numpy()
                      for s in sentences[:8]]  # fmt: skip
    n_wavs = args.n_wavs
    wavs = {"texts": np.array([s["text"] for s in sentences_meta[:n_wavs]])}
    for precision in args.precisions.split(","):
        run, runner = profile_runner(model, precision, args.chunk, args.tail, batches, sentences, args.reps)
        run["quality_vs_fp32"] = quality(model, runner, sentences, fp32_audio)
        if args.wavs is not None:
            frames = fill_slots(runner, sentences[:n_wavs], noise=True)[:n_wavs]
            for slot, f in enumerate(frames):
                wavs[f"{precision}_{slot}"] = decode_one(runner, slot, f)
        report["runs"].append(run)
        print(json.dumps(run), flush=True)
        del runner
        torch.cuda.empty_cache()
    runs = report.pop("runs")
    path = write_json("tts_gpu_profile", runs, report, path=result_path("tts_gpu_profile", "json", args.out, args.hardware, args.date))
    print(f"wrote {path}")
    if args.wavs is not None:
        np.savez_compressed(args.wavs, **wavs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
