"""Experiments toward the GPU TTS goals (not part of the engine): is torch.compile worth it, and
the fused Triton residual blocks (``tts_engine/torch_vits/kernels/fused_resblock.py``)?

For the fp16 chunk decoder (flow + HiFi-GAN) at a few (chunk, batch) shapes and for the
encoder step, compares a CUDA graph of the eager code with a CUDA graph of the
``torch.compile``d code (Inductor fuses the elementwise chains between convolutions):
compile seconds, step ms (CUDA events, median), max abs difference; and each variant's flow alone
on the same windows (``<variant>_flow_graph_ms``: the flow's share of the step, whose 32-frame
context on each side of every chunk makes it compute ~1.6 frames per audio frame). Inputs are real
utterances. ``--fused`` adds the decoder with fused residual blocks, ``--polyphase`` the one whose
upsampling runs as ``PolyphaseUp`` (and with both, both; each eager and compiled),
``--fused-upsampling`` both plus the fused input, upsampling and output convolutions
(``fused_upsample``; ``--row-tiles``: in other tile shapes too; ``--fused-flow``: and with the
flow's fused WaveNet layers, ``fused_flow``, and with ``--gate-tiles`` in other tile shapes of its
kernels); ``--flow-precision N``: per sentence, SNR against
fp32 of the fp16 flow (PyTorch's and fused) and of the audio after it; ``--tiles`` times one residual step (dilated convolution,
activation, mask, bias, residual) per channel count, cuDNN + PyTorch's pointwise ops against the
fused kernel in each tile shape; ``--resample`` times the decoder step's resampling to 24 kHz both
ways (``resample.FUSED_MAX_SAMPLES``); ``--encoder-products`` compares the text encoder's feed-forward
products (``tts.text_encoder_products``) and its fused attention (``RunnerOptions.fused_attention``): graph ms
per batch, and the durations against cuBLAS's
(phonemes whose frames move over the bench and calibration sentences x noise draws). Writes ``<out>/tts_gpu_experiments-<hardware>-<date>.json``. Example::

    python -m bench.tts_gpu_experiments --voice VOICE.onnx --hardware h200 --out OUT/ [--fused --tiles]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import torch

from bench.gpu_steps import dims, fill_slots, graphed, timed
from bench.harness import add_common_arguments, common_arguments, gpu_name, load_sentences, result_path, write_json
from tts_engine.torch_vits.chunked import decode_windows, gather_windows
from tts_engine.torch_vits.model import pad_ids
from tts_engine.torch_vits.runner import RunnerOptions, StepRunner
from tts_engine.torch_vits.weights import load_vits


def kernel_profile(fn, reps: int = 5, top: int = 30) -> list[dict]:
    """GPU ms per call of the ``top`` kernels of ``fn()`` (torch.profiler over ``reps`` calls), largest first."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    kernels = {}  # kernels have self GPU time; the operators that launch them have none of their own
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
        if us > 0:
            kernels[e.key[:140]] = [us, e.count]
    total = sum(v[0] for v in kernels.values())
    rows = [{"kernel": name, "ms_per_call": round(us / 1000 / reps, 4), "launches_per_call": n // reps,
             "share": round(us / total, 4)} for name, (us, n) in kernels.items()]  # fmt: skip
    rows.sort(key=lambda r: -r["ms_per_call"])
    print(f"profile: {total / 1000 / reps:.2f} GPU ms per call, {sum(v[1] for v in kernels.values()) // reps} kernels", flush=True)
    for r in rows[:top]:
        print(f"  {r['ms_per_call']:8.3f} ms x{r['launches_per_call']:<3} {r['share']:6.1%}  {r['kernel'][:110]}", flush=True)
    return rows[:top]


def tile_rows(synth, batch: int = 48, frames: int = 278) -> list[dict]:
    """One residual step (kernel 7, dilation 12, masked) per decoder stage's channel count, at a
    256-frame chunk's decoder window for ``batch`` rows: cuDNN + pointwise ops (graph), the same
    compiled, and the fused kernel in each tile shape (graph); then in the shipped tile's channel block
    with ``time_rows`` tiles in three time blocks and two warp counts: keys ``fused_<CO>x<T>w<W>[t]_ms``
    (``t``: time rows)."""
    from torch.nn import functional as F

    from tts_engine.torch_vits.kernels import fused_resblock as fr

    rows = []
    dec = synth.dec
    for stage, up in enumerate(dec.ups):
        conv = dec.resblocks[stage * dec.num_kernels + dec.num_kernels - 1].convs[-1]
        c, length = conv.in_channels, frames * math.prod(dec.upsample_rates[: stage + 1])
        x = torch.randn(batch, c, length, device="cuda", dtype=conv.weight.dtype)
        m = torch.ones(batch, 1, length, device="cuda", dtype=x.dtype)
        m[:, :, length - length // 5 :] = 0

        def torch_step(x=x, m=m, conv=conv):
            return conv(F.leaky_relu(x, 0.1) * m) + x

        g, ref = graphed(torch_step)
        row = {"what": "residual step", "channels": c, "samples": length, "batch": batch,
               "kernel": conv.kernel_size[0], "dilation": conv.dilation[0], "cudnn_graph_ms": round(timed(g.replay, 20), 3)}  # fmt: skip
        step_c = torch.compile(torch_step, dynamic=False)
        g, _ = graphed(step_c)
        row["compiled_graph_ms"] = round(timed(g.replay, 20), 3)
        w, b = fr.tap_major(conv), conv.bias.detach()
        out = torch.empty_like(x)
        shipped_co = fr.TILES[c][0]
        variants = [(bc, bt, nw, False) for bc in (16, 32, 64, 128) for bt in (64, 128, 256) for nw in (4, 8) if bc <= c]
        variants += [(shipped_co, bt, nw, True) for bt in (64, 128, 256) for nw in (4, 8)]
        for tiles in variants:
            key = f"fused_{tiles[0]}x{tiles[1]}w{tiles[2]}{'t' if tiles[3] else ''}"
            try:
                g, _ = graphed(lambda tiles=tiles: fr.conv_step(x, w, b, conv.dilation[0], m, x, out, tiles=tiles))
                row[f"{key}_ms"] = round(timed(g.replay, 20), 3)
                row[f"{key}_diff"] = float((out.float() - ref.float()).abs().max())
            except Exception as exc:  # a tile shape out of the GPU's resources
                row[f"{key}_error"] = str(exc)[:120]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def resample_rows(shapes: list[tuple[int, int]], in_rate: int = 22050, out_rate: int = 24000) -> list[dict]:
    """The decoder step's resampling (``resample.ChunkResampler.int16``) per (chunk, batch) shape, CUDA
    graph: PyTorch's gather + matrix product against the Triton kernel (``fused``), both forced;
    what ``FUSED_MAX_SAMPLES`` chooses between."""
    from tts_engine.torch_vits import resample

    plain = resample.ChunkResampler(in_rate, out_rate, 256, "cuda")
    fused = resample.ChunkResampler(in_rate, out_rate, 256, "cuda", fused=True)
    fused.fused_max_samples = 1 << 62  # time the kernel at every shape
    rows = []
    for chunk, batch in shapes:
        audio = torch.rand(batch, (chunk + 2 * plain.edge_frames) * 256, device="cuda").half() - 0.5
        starts = torch.arange(batch, device="cuda") * 3
        frames = starts + chunk + 40
        row = {"what": "resample", "rates": [in_rate, out_rate], "chunk": chunk, "batch": batch,
               "output_samples": batch * plain.row_samples(chunk), "fused_max_samples": resample.FUSED_MAX_SAMPLES}  # fmt: skip
        for name, r in (("product", plain), ("kernel", fused)):
            g, _ = graphed(lambda r=r: r.int16(audio, starts, frames, chunk))
            row[f"{name}_graph_ms"] = round(timed(g.replay, 50), 4)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def flow_precision_rows(model, sentences: list[list[int]]) -> list[dict]:
    """Per sentence (whole utterance, no noise): SNR in dB against the fp32 model of the flow's output
    and of the audio, for the fp16 model's flow as PyTorch runs it, the same with the fused flow
    (``fused_flow``), and an fp32 flow before the fp16 decoder (what the flow's rounding costs)."""
    import copy

    from tts_engine.torch_vits.kernels import fused_flow

    def snr(ref: torch.Tensor, x: torch.Tensor) -> float:
        ref, x = ref.double(), x.double()
        return round(float(10 * torch.log10((ref**2).sum() / ((ref - x) ** 2).sum().clamp_min(1e-30))), 2)

    device = next(model.parameters()).device
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # the fp32 reference in full fp32 (cuDNN would use TF32); restored below
    half = copy.deepcopy(model).half()
    half.dec.use_polyphase()
    half.dec.use_fused_blocks()
    fused = copy.deepcopy(half)
    fused_flow.use_fused_flow(fused.flow)
    zero, one = torch.zeros(1, device=device), torch.ones(1, device=device)
    rows = []
    for ids in sentences:
        x, m_p, logs_p, x_mask = model.encode(*pad_ids([ids], device=device))
        w_ceil, frames = model.durations(x, x_mask, zero, one)
        z_p = model.expand_prior(m_p, logs_p, w_ceil, int(frames.max()), zero)
        mask = model.frame_mask(frames, int(frames.max())).to(z_p.dtype)
        z_ref = model.flow.reverse(z_p, mask)
        audio_ref = model.dec(z_ref * mask, mask)
        z16, m16 = z_p.half(), mask.half()
        row = {"what": "flow_precision", "frames": int(frames)}
        for name, flow in (("fp16", half.flow), ("fp16_fused", fused.flow)):
            z = flow.reverse(z16, m16)
            row[f"{name}_flow_snr_db"] = snr(z_ref, z.float())
            row[f"{name}_audio_snr_db"] = snr(audio_ref, half.dec(z * m16, m16).float())
        row["fp32_flow_audio_snr_db"] = snr(audio_ref, half.dec(z_ref.half() * m16, m16).float())
        rows.append(row)
        print(json.dumps(row), flush=True)
    torch.backends.cudnn.allow_tf32 = tf32
    return rows


def encoder_products_rows(model, sentences: list[list[int]], tiles: list[str] = (), batches=(1, 16, 64),
                          draws: int = 8, profile_batch: int = 0) -> list[dict]:
    """Per ``fused_ffn.PRODUCTS`` (the voice's text encoder with ``gemm`` convolutions and the fused
    feed-forward in that precision; "cublas" first, the shipped reference, bit for bit
    ``encoder_convs = "gemm"``): the encoder's CUDA graph ms at each batch (256-id bucket, the sentences
    repeated), and against "cublas": the largest difference of the encoder's states, and over all
    ``sentences`` in one padded batch x (``draws`` draws of the duration noise at ``noise_w`` 0.8, and
    ``noise_w`` 0) the phonemes whose frame count moves, the frames moved and the sentences whose
    length moves. The duration predictor is the same (``gemm``) in every row. ``tiles``: more rows for
    "tf32x3", "tf32" and "fp16x3" with the Triton convolution in those tile shapes ("COxTxKxWxS": output
    channels, time steps, input channels per product, warps, stages; ``fused_ffn.CONV_TILES``). Then
    "tf32x3" again with the relative-position attention as one kernel per layer (``RunnerOptions.fused_attention``;
    ``"attention": true`` in its row). ``profile_batch``: also the GPU time
    by kernel of the text encoder and the duration predictor (eager) at that many sentences."""
    from tts_engine.torch_vits.kernels import fused_attention, fused_ffn
    from tts_engine.torch_vits.kernels.gemm_conv import use_gemm_convs

    base = copy.deepcopy(model)
    for part in (base.enc_p, base.dp):
        use_gemm_convs(part)
    n = len(sentences)
    padded, lengths = pad_ids(sentences, 256, device="cuda")
    gen = torch.Generator("cuda").manual_seed(11)
    noises = [torch.randn(n, 2, padded.shape[1], device="cuda", generator=gen) for _ in range(draws)]
    noise_w = [torch.full((n,), 0.8, device="cuda")] * draws + [torch.zeros(n, device="cuda")]
    length_scale = torch.ones(n, device="cuda")
    rows, ref = [], None
    default_tiles, default_rows = fused_ffn.CONV_TILES, fused_ffn.MIN_ROWS
    variants = [(p, None, False) for p in fused_ffn.PRODUCTS]
    variants += [(p, spec, False) for spec in tiles for p in ("tf32x3", "tf32", "fp16x3")]
    variants += [("tf32x3", None, True)]
    for products, spec, attention in variants:
        m = copy.deepcopy(base)
        fused_ffn.use_fused_ffn(m.enc_p, products)
        if attention:
            fused_attention.use_fused_attention(m.enc_p, products)
        fused_ffn.CONV_TILES = {**default_tiles, products: dims(spec)} if spec else default_tiles
        fused_ffn.MIN_ROWS = 1  # every batch through the Triton convolution
        with torch.inference_mode():
            x, _, _, mask = m.encode(padded, lengths)
            w = [m.durations(x, mask, nw, length_scale, noise=nz)[0] for nw, nz in zip(noise_w, [*noises, noises[0]])]
            row = {"what": "encoder_products", "products": products, "attention": attention,
                   "sentences": n, "draws": draws,
                   "phonemes": int(mask.sum()) * len(w), "ids_of_bucket_pct": round(100 * float(lengths.float().mean()) / 256, 1)}  # fmt: skip
            if products != "cublas":
                row["tiles"] = "x".join(map(str, fused_ffn.CONV_TILES[products]))
            if ref is None:
                ref = (x, w)
            else:
                row["state_max_abs_diff"] = float((x - ref[0]).abs().max())
                row["state_peak"] = float(ref[0].abs().max())
                row["phonemes_moved"] = sum(int((a != b).sum()) for a, b in zip(w, ref[1]))
                row["frames_moved"] = int(sum((a - b).abs().sum() for a, b in zip(w, ref[1])))
                row["sentences_moved"] = sum(int((a.sum(1) != b.sum(1)).sum()) for a, b in zip(w, ref[1]))
                row["sentence_draws"] = n * len(w)
            for b in batches:
                pick = torch.arange(b, device="cuda") % n
                g, _ = graphed(m.encode, padded[pick].contiguous(), lengths[pick].contiguous())
                row[f"graph_ms_{b}"] = round(timed(g.replay, 20), 3)
            if profile_batch:
                pick = torch.arange(profile_batch, device="cuda") % n
                ids, lens = padded[pick].contiguous(), lengths[pick].contiguous()

                def encode_and_durations(ids=ids, lens=lens, m=m, pick=pick):
                    x, _, _, mask = m.encode(ids, lens)
                    m.durations(x, mask, noise_w[0][pick], length_scale[pick], noise=noises[0][pick])

                row[f"profile_{profile_batch}"] = kernel_profile(encode_and_durations)
        rows.append(row)
        print(json.dumps(row), flush=True)
    fused_ffn.CONV_TILES, fused_ffn.MIN_ROWS = default_tiles, default_rows
    return rows


def plot(path: Path) -> Path:
    """PNG beside a result file, one panel per kind of row present: decoder step ms per variant and shape;
    residual step ms per channel count; resampling ms; text encoder ms per feed-forward products."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = json.loads(path.read_text())["rows"]
    kinds = {k: [r for r in rows if r["what"] == k] for k in ("decode", "residual step", "resample", "encoder_products")}
    kinds = {k: v for k, v in kinds.items() if v}
    widths = [max(7.5, 0.55 * len(v)) if k == "encoder_products" else 7.5 for k, v in kinds.items()]
    fig, axes = plt.subplots(1, len(kinds), figsize=(sum(widths), 6.5), squeeze=False, width_ratios=widths)
    panels = dict(zip(kinds, axes[0]))
    if "decode" in panels:
        ax, decode = panels["decode"], kinds["decode"]
        variants = sorted({k[: -len("_graph_ms")] for r in decode for k in r if k.endswith("_graph_ms")})
        for i, v in enumerate(variants):
            xs = [j + i / (len(variants) + 1) for j in range(len(decode))]
            ax.bar(xs, [r.get(f"{v}_graph_ms", 0) for r in decode], width=1 / (len(variants) + 1), label=v)
        ax.set_xticks(range(len(decode)), [f"{r['chunk']} frames x {r['batch']}" for r in decode])
        ax.set_ylabel("decoder step (flow + HiFi-GAN), ms, CUDA graph")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    if "residual step" in panels:
        ax, steps = panels["residual step"], kinds["residual step"]
        kinds_of_tile = {"fused, fp16 (best tile)": lambda k: "t_" not in k,
                         "fused, fp16, time rows": lambda k: "t_" in k}  # fmt: skip
        width = 0.8 / (2 + len(kinds_of_tile))
        for j, r in enumerate(steps):
            best = [min([v for k, v in r.items() if k.startswith("fused_") and k.endswith("_ms") and keep(k)] or [float("nan")])
                    for keep in kinds_of_tile.values()]  # fmt: skip
            heights = [r["cudnn_graph_ms"], r["compiled_graph_ms"], *best]
            ax.bar([j - 0.4 + width * (i + 0.5) for i in range(len(heights))], heights, width=width,
                   color=[f"C{i}" for i in range(len(heights))],
                   label=["cuDNN + pointwise", "compiled", *kinds_of_tile] if j == 0 else None)  # fmt: skip
        ax.set_xticks(range(len(steps)), [f"{r['channels']} ch x {r['samples']} x {r['batch']}" for r in steps])
        ax.set_ylabel("one residual step (kernel 7, dilation 12), ms")
        ax.legend(fontsize=8)
    if "resample" in panels:
        ax, resample = panels["resample"], kinds["resample"]
        for j, r in enumerate(resample):
            ax.bar([j - 0.2, j + 0.2], [r["product_graph_ms"], r["kernel_graph_ms"]], width=0.4, color=["C0", "C3"],
                   label=["gather + matrix product", "Triton kernel"] if j == 0 else None)  # fmt: skip
        ax.set_xticks(range(len(resample)), [f"{r['chunk']} frames x {r['batch']}" for r in resample])
        ax.set_ylabel("resampling in a decoder step, ms, CUDA graph")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    if "encoder_products" in panels:
        ax, enc = panels["encoder_products"], kinds["encoder_products"]
        batches = sorted(int(k.rsplit("_", 1)[1]) for k in enc[0] if k.startswith("graph_ms_"))
        for j, b in enumerate(batches):
            ax.bar([i + (j - 1) * 0.27 for i in range(len(enc))], [r[f"graph_ms_{b}"] for r in enc], width=0.27,
                   label=f"{b} sentences x 256 ids")  # fmt: skip
        names = [r["products"] + (" + attention" if r.get("attention") else "")
                 for r in enc]  # fmt: skip
        labels = [f"{name} {r.get('tiles', '')}\n{r['phonemes_moved']} moved" if "phonemes_moved" in r else name
                  for name, r in zip(names, enc)]  # fmt: skip
        ax.set_xticks(range(len(enc)), labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(f"text encoder, ms, CUDA graph (phoneme durations moved of {enc[0]['phonemes']})")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle(path.stem)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=90)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(p)
    p.add_argument("--plot", type=Path, help="only draw the PNG of this result file")
    p.add_argument("--shapes", default="64x1,256x1,64x16,256x48", help="chunk x batch")
    p.add_argument("--budget-s", type=float, default=200, help="stop starting new compiles after this")
    p.add_argument("--cudnn-benchmark-limit", type=int, default=3,
                   help="cuDNN times this many algorithms per shape, as configs/gpu.toml (0: cuDNN's heuristics only)")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled rows (and the encoder)")
    p.add_argument("--fused", action="store_true", help="add the decoder with fused Triton residual blocks")
    p.add_argument("--polyphase", action="store_true", help="add the decoder with polyphase upsampling (and both)")
    p.add_argument("--fused-upsampling", action="store_true",
                   help="add the decoder with fused blocks, polyphase and fused input/upsampling/output convolutions")
    p.add_argument("--fused-flow", action="store_true",
                   help="with --fused-upsampling: add that decoder with the flow's WaveNet layers fused too")
    p.add_argument("--gate-tiles", nargs="+", default=[], metavar="TxW",
                   help="with --fused-flow: also time the decode step with these (time steps, warps) of "
                        "fused_flow's gate and res/skip kernels, e.g. 32x4 (default: GATE_TILES)")
    p.add_argument("--row-tiles", nargs="+", default=[], metavar="RxMxW",
                   help="with --fused-upsampling: also time it with these (BLOCK_R, BLOCK_M, num_warps) of "
                        "fused_upsample's row kernel, e.g. 64x64x4 (default: its ROW_TILES)")
    p.add_argument("--tiles", action="store_true", help="time one residual step per channel count and tile shape")
    p.add_argument("--flow-precision", type=int, default=0, metavar="N",
                   help="per sentence of the first N: SNR against fp32 of the fp16 flow (PyTorch's and fused) and "
                        "of the audio, and of the audio with an fp32 flow before the fp16 decoder")
    p.add_argument("--resample", action="store_true",
                   help="per shape: the decoder step's 22 050 -> 24 000 Hz resampling, matrix product vs Triton kernel")
    p.add_argument("--encoder-products", action="store_true",
                   help="the text encoder's feed-forward products (tts.text_encoder_products): graph ms, durations moved")
    p.add_argument("--conv-tiles", nargs="+", default=[], metavar="COxTxKxWxS",
                   help="with --encoder-products: also the Triton convolution in these tile shapes")
    p.add_argument("--profile", action="store_true",
                   help="per shape: GPU time by kernel of the eager decoder (and the fused one with --fused); "
                        "with --encoder-products: of the text encoder and duration predictor at 16 sentences")
    args = p.parse_args()
    if args.plot:
        print(f"wrote {plot(args.plot)}")
        return 0
    args = common_arguments(args)
    t_start = time.perf_counter()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark_limit > 0
    torch.backends.cudnn.benchmark_limit = max(args.cudnn_benchmark_limit, 1)
    sentences = [s["ids"] for s in load_sentences()]
    model = load_vits(args.voice, device="cuda")
    runner = StepRunner(model, RunnerOptions(chunk_frames=32, tail_chunk_frames=256, max_frames=1024,
                                             decode_batches=(64,), encode_batches=(32,), phoneme_buckets=(256,),
                                             precision="fp16", cuda_graphs=False), "cuda")  # fmt: skip
    fill_slots(runner, sentences, noise=True)
    synth = runner.synth_model
    rows = tile_rows(synth) if args.tiles else []
    if args.resample:
        rows += resample_rows([dims(spec) for spec in args.shapes.split(",")])
    if args.flow_precision:
        with torch.inference_mode():
            rows += flow_precision_rows(model, sentences[: args.flow_precision])
    if args.encoder_products:
        from tts_engine.torch_vits.int8 import CALIBRATION_SENTENCES

        calibration = [s["ids"] for s in json.loads(CALIBRATION_SENTENCES.read_text())["sentences"]]
        rows += encoder_products_rows(model, sentences + calibration, args.conv_tiles, profile_batch=16 if args.profile else 0)
    torch._dynamo.config.cache_size_limit = 64
    from tts_engine.torch_vits.kernels import fused_flow, fused_upsample

    default_tiles = fused_upsample.ROW_TILES
    default_gate = (fused_flow.GATE_TILES, fused_flow.RES_SKIP_TILES)
    # (name, fused blocks, polyphase upsampling, fused upsampling tiles or None, fused flow: False or
    # its (gate, res/skip) tiles)
    variants = [("eager", False, False, None, False)]
    if args.fused:
        variants.append(("fused", True, False, None, False))
    if args.polyphase:
        variants.append(("polyphase", False, True, None, False))
    if args.fused and args.polyphase or args.fused_upsampling:
        variants.append(("fused_polyphase", True, True, None, False))
    if args.fused_upsampling:
        variants.append(("fused_up", True, True, default_tiles, False))
        for spec in args.row_tiles:
            variants.append((f"fused_up_{spec}", True, True, dims(spec), False))
        if args.fused_flow:
            variants.append(("fused_up_flow", True, True, default_tiles, default_gate))
            for spec in args.gate_tiles:
                tiles = dims(spec)
                variants.append((f"fused_up_flow_{spec}", True, True, default_tiles, (tiles, tiles)))
    with torch.inference_mode():
        for shape in [s for s in args.shapes.split(",") if s]:
            if time.perf_counter() - t_start > args.budget_s:
                break
            chunk, b = dims(shape)
            geo = runner.geometries[chunk]
            slots = torch.arange(b, device="cuda")
            z, mask = gather_windows(runner.latents, slots, slots * 0 + 64, runner.frames[:b], geo)
            z, mask = z.half(), mask.half()
            row = {"what": "decode", "chunk": chunk, "batch": b}
            out_eager = None
            for name, fused, poly, up_tiles, flow in variants:
                synth.dec.use_fused_blocks(fused)
                synth.dec.use_polyphase(poly)
                if flow:
                    fused_flow.GATE_TILES, fused_flow.RES_SKIP_TILES = flow
                fused_flow.use_fused_flow(synth.flow, bool(flow))
                if up_tiles is not None:
                    fused_upsample.ROW_TILES = up_tiles
                    synth.dec.use_fused_upsampling()
                try:
                    g, out = graphed(lambda: decode_windows(synth, z, mask, geo))
                    row[f"{name}_graph_ms"] = round(timed(g.replay, 20), 3)
                    g_flow, _ = graphed(lambda: synth.flow.reverse(z, mask))  # its flow alone, same window
                    row[f"{name}_flow_graph_ms"] = round(timed(g_flow.replay, 20), 3)
                    out_eager = out.clone() if out_eager is None else out_eager
                    row[f"{name}_max_abs_diff"] = float((out_eager.float() - out.float()).abs().max())
                    if args.profile:
                        row[f"{name}_profile"] = kernel_profile(lambda: decode_windows(synth, z, mask, geo))
                    if not args.no_compile and time.perf_counter() - t_start < args.budget_s:
                        t0 = time.perf_counter()  # a new function: no guard shares another variant's graph
                        compiled = torch.compile(lambda z, m, geo: decode_windows(synth, z, m, geo), dynamic=False)
                        compiled(z, mask, geo)
                        row[f"compiled_{name}_compile_s"] = round(time.perf_counter() - t0, 1)
                        g, out = graphed(lambda: compiled(z, mask, geo))
                        row[f"compiled_{name}_graph_ms"] = round(timed(g.replay, 20), 3)
                        row[f"compiled_{name}_max_abs_diff"] = float((out_eager.float() - out.float()).abs().max())
                        if args.profile:
                            row[f"compiled_{name}_profile"] = kernel_profile(lambda: compiled(z, mask, geo))
                except Exception as exc:  # e.g. Dynamo / Inductor not taking the user kernels
                    row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                finally:
                    synth.dec.use_fused_blocks(False)
                    synth.dec.use_polyphase(False)
                    synth.dec.use_fused_upsampling(False)
                    fused_flow.use_fused_flow(synth.flow, False)
                    fused_upsample.ROW_TILES = default_tiles
                    fused_flow.GATE_TILES, fused_flow.RES_SKIP_TILES = default_gate
            rows.append(row)
            print(json.dumps(row), flush=True)
        if not args.no_compile and time.perf_counter() - t_start < args.budget_s:
            b, t = 8, 256
            ids, lengths = pad_ids(sentences[:b], t, device="cuda")
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
