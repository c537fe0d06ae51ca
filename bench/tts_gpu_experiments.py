"""Experiments toward the GPU TTS goals (not part of the engine): is torch.compile worth it?

For the fp16 chunk decoder (flow + HiFi-GAN) at a few (chunk, batch) shapes and for the
encoder step, compares a CUDA graph of the eager code with a CUDA graph of the
``torch.compile``d code (Inductor fuses the elementwise chains between convolutions):
compile seconds, step ms (CUDA events, median), max abs difference. Inputs are real
utterances. Writes ``<out>/tts_gpu_experiments-<hardware>-<date>.json``. Example::

    python -m bench.tts_gpu_experiments --voice VOICE.onnx --hardware h200 --out /tmp/exp
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from bench.gpu_steps import fill_slots, timed
from bench.harness import add_common_arguments, common_arguments, gpu_name, load_sentences, result_path, write_json
from tts_engine.torch_vits.chunked import decode_windows, gather_windows
from tts_engine.torch_vits.runner import RunnerOptions, StepRunner
from tts_engine.torch_vits.weights import load_vits


def graphed(fn, *args):
    """Warm up, capture ``fn(*args)`` as a CUDA graph; returns (graph, output)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(*args)
    return g, out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(p)
    p.add_argument("--shapes", default="64x1,256x1,64x16,256x48", help="chunk x batch")
    p.add_argument("--budget-s", type=float, default=200, help="stop starting new compiles after this")
    args = common_arguments(p.parse_args())
    t_start = time.perf_counter()
    sentences = [s["ids"] for s in load_sentences()]
    model = load_vits(args.voice, device="cuda")
    runner = StepRunner(model, RunnerOptions(chunk_frames=64, tail_chunk_frames=256, max_frames=1024,
                                             decode_batches=(64,), encode_batches=(32,), phoneme_buckets=(256,),
                                             precision="fp16", cuda_graphs=False), "cuda")  # fmt: skip
    fill_slots(runner, sentences, noise=True)
    synth = runner.synth_model
    rows = []
    torch._dynamo.config.cache_size_limit = 64
    compiled = torch.compile(lambda z, m, geo: decode_windows(synth, z, m, geo), dynamic=False)
    with torch.inference_mode():
        for shape in args.shapes.split(","):
            if time.perf_counter() - t_start > args.budget_s:
                break
            chunk, b = (int(x) for x in shape.split("x"))
            geo = runner.geometries[chunk]
            slots = torch.arange(b, device="cuda")
            z, mask = gather_windows(runner.latents, slots, slots * 0 + 64, runner.frames[:b], geo)
            z, mask = z.half(), mask.half()
            g_eager, out_eager = graphed(lambda: decode_windows(synth, z, mask, geo))
            t0 = time.perf_counter()
            compiled(z, mask, geo)
            compile_s = time.perf_counter() - t0
            g_comp, out_comp = graphed(lambda: compiled(z, mask, geo))
            row = {"what": "decode", "chunk": chunk, "batch": b, "compile_s": round(compile_s, 1),
                   "eager_graph_ms": round(timed(g_eager.replay, 20), 3),
                   "compiled_graph_ms": round(timed(g_comp.replay, 20), 3),
                   "max_abs_diff": float((out_eager.float() - out_comp.float()).abs().max())}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
        if time.perf_counter() - t_start < args.budget_s:
            b, t = 8, 256
            ids = torch.zeros(b, t, dtype=torch.long, device="cuda")
            lengths = torch.zeros(b, dtype=torch.long, device="cuda")
            for i in range(b):
                ids[i, : len(sentences[i])] = torch.tensor(sentences[i])
                lengths[i] = len(sentences[i])
            scales = torch.tensor([[0.667, 1.0, 0.8]] * b, device="cuda")

            def encode(ids, lengths, scales):
                x, m_p, logs_p, mask = model.encode(ids, lengths)
                w_ceil, frames = model.durations(x, mask, scales[:, 2], scales[:, 1])
                return model.expand_prior(m_p, logs_p, w_ceil, 1024, scales[:, 0]), frames

            enc_c = torch.compile(encode, dynamic=False)
            g_eager, _ = graphed(encode, ids, lengths, scales)
            t0 = time.perf_counter()
            enc_c(ids, lengths, scales)
            compile_s = time.perf_counter() - t0
            g_comp, _ = graphed(enc_c, ids, lengths, scales)
            row = {"what": "encode", "batch": b, "phonemes": t, "compile_s": round(compile_s, 1),
                   "eager_graph_ms": round(timed(g_eager.replay, 20), 3),
                   "compiled_graph_ms": round(timed(g_comp.replay, 20), 3)}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    path = result_path("tts_gpu_experiments", "json", args.out, args.hardware, args.date)
    print(f"wrote {write_json('tts_gpu_experiments', rows, {'gpu': gpu_name()}, path=path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
