"""INT8 decoder vs fp32/fp16/bf16 on the GPU engine: throughput, latency, step time, SNR, WER.

For each variant of ``--precisions`` (``fp32``, ``fp16``, ``bf16``, ``int8`` = the runner's
default int8 options; ``int8-dynamic`` / ``int8-static`` force per-row / calibrated activation
scales; ``fp16-fused``: the decoder's Triton kernels of ``configs/gpu.toml`` (``KERNEL_MODES``); ``+compile`` adds
``torch.compile`` of the decode step, e.g. ``int8-static+compile``) an
in-process ``CudaTtsEngine`` is built as ``bench.tts_load``'s engine mode builds it (power-of-two
decode batch buckets unless ``--fine``), then:

(a) closed-loop load at ``--concurrency`` clients for ``--duration`` s (``harness.closed_loop``
    and ``summarize``): QPS, first-audio and full-sentence latency percentiles;
(b) decode-step time at ``--step-batches`` and chunk ``--step-chunk`` (CUDA events around
    graph replays on CUDA, median of ``--reps``; wall clock of the eager step on CPU);
(c) SNR (dB) against fp32 whole utterances, noise scales 0 (same durations: the encoder
    runs in fp32 everywhere), over ``--snr-sentences`` benchmark sentences;
(d) audio with the voice's default noise scales (same seed for every variant) of
    ``--wav-sentences`` sentences, saved to ``<results>.npz`` for the WER pass.

``--wer NPZ`` (CPU, needs faster-whisper and jiwer) transcribes that audio with the bundled
whisper base and fills ``wer`` in the results JSON beside it. Runs on a box with torch,
onnxruntime, numpy and soxr only (espeak and faster-whisper are imported lazily). Examples::

    python3 -m bench.tts_int8 --voice VOICE.onnx --hardware h200 --out OUT/
    python3 -m bench.tts_int8 --wer OUT/int8-h200-2026-12-01.npz     # CPU machine
    python3 -m bench.tts_int8 --device cpu --max-batch 4 --concurrency 2 --duration 3 \\
        --step-batches 1 --snr-sentences 2 --wav-sentences 2 --out OUT/   # smoke
    python3 -m bench.tts_int8 --make-calibration   # re-phonemize the int8 calibration set

Writes ``<out>/int8-<hardware>-<date>.json`` (a list of rows: precision, qps,
first_audio_p99_ms, snr_db, wer, step_ms, ...), ``.npz`` and ``.png`` beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench.harness import (
    add_common_arguments, closed_loop, command_line, common_arguments, gpu_name, hardware, load_sentences, summarize,
)  # fmt: skip
from bench.tts_backends import CudaBackend

#: Most wanted first: a run cut by a timeout keeps the rows already written.
DEFAULT_PRECISIONS = "fp16,int8-dynamic,int8-static,bf16,fp32"


# ---------------------------------------------------------------- variants


#: Variant modes of fp16 / bf16: the decoder's Triton kernels of ``configs/gpu.toml`` (polyphase
#: upsampling, fused blocks, fused upsampling, fused flow).
KERNEL_MODES = ("fused",)


def parse_variant(name: str) -> tuple[str, str | None, bool]:
    """``int8-dynamic+compile`` -> (runner precision ``int8``, int8 mode ``dynamic``, compile True);
    ``fp16-fused`` -> (``fp16``, ``fused``, False); the mode is None where the runner's default applies."""
    base, compiled = name.removesuffix("+compile"), name.endswith("+compile")
    precision, _, mode = base.partition("-")
    modes = ("static", "dynamic") if precision == "int8" else KERNEL_MODES if precision in ("fp16", "bf16") else ()
    if precision not in ("fp32", "fp16", "bf16", "int8") or (mode and mode not in modes):
        raise SystemExit(
            f"unknown precision variant {name!r} (fp32, fp16|bf16[-fused], int8[-static|-dynamic], "
            "each [+compile])"
        )
    return precision, mode or None, compiled


@contextlib.contextmanager
def int8_mode(mode: str | None):
    """Build engines with ``mode`` activation scales (the runner uses ``int8.DEFAULT_OPTIONS``)."""
    from tts_engine.torch_vits import int8

    saved = int8.DEFAULT_OPTIONS
    if mode is not None:
        int8.DEFAULT_OPTIONS = dataclasses.replace(saved, mode=mode)
    try:
        yield
    finally:
        int8.DEFAULT_OPTIONS = saved


def build(args: argparse.Namespace, variant: str) -> CudaBackend:
    precision, mode, compiled = parse_variant(variant)
    kernels = {}
    if mode in KERNEL_MODES:
        kernels = {"polyphase": True, "fused_blocks": True, "fused_upsampling": True, "fused_flow": True}
    engine_args = argparse.Namespace(
        **{**vars(args), "precision": precision, "compile": compiled, **kernels}
    )
    with int8_mode(mode if precision == "int8" else None):
        backend = CudaBackend(engine_args)
    backend.name = variant
    return backend


# ---------------------------------------------------------------- measurements


def step_times(runner, chunk: int, batches: list[int], reps: int) -> dict[str, float]:
    """Median ms of one decode step per batch (real utterances in every slot; 2nd chunk)."""
    import torch

    from bench.gpu_steps import fill_slots, timed

    sentences = [s["ids"] for s in load_sentences()]
    fill_slots(runner, sentences, noise=True)
    out = {}
    for b in batches:
        step = runner.decode_steps.get((chunk, b, "main"))
        if step is None:
            print(
                f"  no decode step for chunk {chunk} batch {b} (not captured): skipped",
                flush=True,
            )
            continue
        step.inputs[0].copy_(torch.arange(b))
        step.inputs[1].fill_(runner.options.chunk_frames)
        step.inputs[2].fill_(1)
        if step.graph is not None:
            out[str(b)] = round(timed(step.graph.replay, reps), 3)
            continue
        with torch.inference_mode():
            step.fn(*step.inputs)  # warm-up
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                step.fn(*step.inputs)
                if runner.device.type == "cuda":
                    torch.cuda.synchronize(runner.device)
                times.append(1000 * (time.perf_counter() - t0))
        out[str(b)] = round(statistics.median(times), 3)
    return out


def fp32_references(
    voice: str, device: str, sentences: list[list[int]]
) -> list[np.ndarray]:
    """Whole-utterance fp32 audio (noise scales 0), the SNR reference."""
    import torch

    from tts_engine.torch_vits.weights import load_vits

    model = load_vits(voice, device=device)
    refs = []
    with torch.inference_mode():
        for ids in sentences:
            audio, _ = model.infer(
                torch.tensor([ids], device=device),
                torch.tensor([len(ids)], device=device),
                0.0,
                1.0,
                0.0,
            )
            refs.append(audio[0].float().cpu().numpy())
    return refs


def snr_db(ref: np.ndarray, audio: np.ndarray) -> float:
    err = np.sum((audio.astype(np.float64) - ref) ** 2)
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / max(err, 1e-20)))


def quality(runner, sentences: list[list[int]], refs: list[np.ndarray]) -> dict:
    """SNR of the engine's chunk plan (int16 out) at noise 0 against ``refs``, per sentence."""
    from bench.gpu_steps import decode_one, fill_slots

    snrs = []
    for start in range(0, len(sentences), runner.options.max_slots):
        group = sentences[start : start + runner.options.max_slots]
        frames = fill_slots(runner, group, noise=False)[: len(group)]
        for slot, f in enumerate(frames):
            snrs.append(
                snr_db(refs[start + slot], decode_one(runner, slot, f) / 32767.0)
            )
    return {"snr_db": round(float(np.mean(snrs)), 2), "snr_db_min": round(min(snrs), 2),
            "snr_db_per_sentence": [round(s, 2) for s in snrs]}  # fmt: skip


def speech(runner, sentences: list[list[int]], seed: int = 1234) -> list[np.ndarray]:
    """int16 audio with the voice's default noise scales; the same draws for every variant."""
    import torch

    from bench.gpu_steps import decode_one, fill_slots

    out = []
    for start in range(0, len(sentences), runner.options.max_slots):
        group = sentences[start : start + runner.options.max_slots]
        torch.manual_seed(seed + start)
        frames = fill_slots(runner, group, noise=True)[: len(group)]
        out.extend(decode_one(runner, slot, f) for slot, f in enumerate(frames))
    return out


# ---------------------------------------------------------------- the run


def run(args: argparse.Namespace) -> Path:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference must be fp32
    torch.backends.cudnn.allow_tf32 = False
    out = Path(args.out) / f"int8-{args.hardware}-{args.date}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = (
        json.loads(out.read_text()) if args.append and out.exists() else []
    )
    meta = {
        "date": args.date,
        "command": command_line(),
        "gpu": gpu_name(),
        "torch": torch.__version__,
        "host": hardware(),
    }
    out.with_suffix(".meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    bench = load_sentences()
    snr_ids = [s["ids"] for s in bench[: args.snr_sentences]]
    wav_sentences = bench[: args.wav_sentences]
    refs = fp32_references(args.voice, args.device, snr_ids)
    npz_path = out.with_suffix(".npz")
    wavs: dict[str, np.ndarray] = (
        dict(np.load(npz_path)) if args.append and npz_path.exists() else {}
    )
    wavs["texts"] = np.array([s["text"] for s in wav_sentences])
    for variant in args.precisions:
        t0 = time.perf_counter()
        backend = build(args, variant)
        print(
            f"[{variant}] built in {time.perf_counter() - t0:.1f} s: {json.dumps(backend.info)}",
            flush=True,
        )
        backend.reset_peak()
        load = summarize(closed_loop(backend, bench, args.concurrency, args.duration, args.warmup),
                         backend, args.concurrency, args.hardware)  # fmt: skip
        backend.close()  # the scheduler stops; the runner is used directly below
        runner = backend.engine.runner
        row = {"precision": variant, "qps": load["qps"], "first_audio_p99_ms": load["first_audio_p99_ms"],
               "snr_db": None, "wer": None,
               "step_ms": step_times(runner, args.step_chunk, args.step_batches, args.reps),
               "step_chunk": args.step_chunk, "device": args.device, "date": args.date, "load": load}  # fmt: skip
        row.update(quality(runner, snr_ids, refs))
        for i, pcm in enumerate(speech(runner, [s["ids"] for s in wav_sentences])):
            wavs[f"{variant}_{i}"] = pcm
        wavs["sample_rate"] = np.array(backend.sample_rate)
        rows = [r for r in rows if r["precision"] != variant] + [row]
        out.write_text(json.dumps(rows, indent=1) + "\n")
        np.savez_compressed(npz_path, **wavs)
        print(
            json.dumps(
                {
                    k: v
                    for k, v in row.items()
                    if k not in ("load", "snr_db_per_sentence")
                }
            ),
            flush=True,
        )
        del backend, runner
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print(f"wrote {out}, {npz_path}")
    try:
        plot(out)
    except ImportError:  # the GPU box may lack matplotlib
        print(f"no matplotlib here: render later with --plot {out}")
    return out


# ---------------------------------------------------------------- WER (CPU machine)

_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def _number_words(match: re.Match[str]) -> str:
    n = int(match.group())
    if n < 20:
        return _UNITS[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _UNITS[n % 10])
    return match.group()


def normalize(text: str) -> str:
    """As ``tts_intelligibility-*.json``: lowercase, digits < 100 to words, punctuation dropped."""
    text = re.sub(r"\d+", _number_words, text.lower().replace("-", " "))
    return " ".join(re.sub(r"[^\w\s']", " ", text).split())


def wer_pass(npz_path: Path) -> Path:
    """Transcribe every variant's audio in ``npz_path`` (faster-whisper base, bundled) and fill ``wer``."""
    import jiwer
    import soxr
    from faster_whisper import WhisperModel

    from base import models
    from base.config import load_config

    results = npz_path.with_suffix(".json")
    rows = json.loads(results.read_text())
    data = np.load(npz_path)
    texts = [str(t) for t in data["texts"]]
    rate = int(data["sample_rate"])
    whisper = WhisperModel(
        str(models.resolve_asr(load_config()).path), device="cpu", compute_type="int8"
    )
    for row in rows:
        hyps = []
        for i in range(len(texts)):
            audio = soxr.resample(
                data[f"{row['precision']}_{i}"].astype(np.float32) / 32767.0,
                rate,
                16000,
            )
            segments, _ = whisper.transcribe(
                audio, language="en", beam_size=1, vad_filter=False
            )
            hyps.append(" ".join(s.text.strip() for s in segments))
        row["wer"] = round(
            float(
                jiwer.wer([normalize(t) for t in texts], [normalize(h) for h in hyps])
            ),
            4,
        )
        row["transcripts"] = hyps
        print(
            f"{row['precision']}: WER {row['wer']:.4f} over {len(texts)} sentences",
            flush=True,
        )
    results.write_text(json.dumps(rows, indent=1) + "\n")
    plot(results)
    return results


# ---------------------------------------------------------------- plot


def plot(path: Path) -> None:
    """``<results>.png``: QPS, first-audio p99, decode-step time and SNR per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = json.loads(path.read_text())
    names = [r["precision"] for r in rows]
    x = np.arange(len(rows))
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    axes[0].bar(x, [r["qps"] for r in rows])
    axes[0].set_title(f"requests/s at {rows[0]['load']['concurrency']} clients")
    axes[1].bar(x, [r["first_audio_p99_ms"] for r in rows])
    axes[1].set_title("first audio p99, ms")
    batches = sorted({b for r in rows for b in r["step_ms"]}, key=int)
    width = 0.8 / max(1, len(batches))
    for i, b in enumerate(batches):
        axes[2].bar(
            x + i * width,
            [r["step_ms"].get(b, 0) for r in rows],
            width,
            label=f"batch {b}",
        )
    axes[2].set_title(f"decode step, chunk {rows[0]['step_chunk']}, ms")
    axes[2].set_yscale("log")
    axes[2].legend(fontsize=7)
    snr = [min(r["snr_db"], 100.0) for r in rows]
    axes[3].bar(x, snr)
    axes[3].set_title("SNR vs fp32, dB (noise 0; capped at 100)")
    for r, xi, s in zip(rows, x, snr):
        if r.get("wer") is not None:
            axes[3].text(
                xi,
                s,
                f"WER {100 * r['wer']:.1f}%",
                ha="center",
                va="bottom",
                fontsize=7,
            )
    for ax in axes:
        ax.set_xticks(
            x + (0.4 - width / 2 if ax is axes[2] else 0),
            names,
            rotation=20,
            fontsize=8,
        )
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"TTS decoder precision, {path.stem}")
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=110)
    print(f"wrote {path.with_suffix('.png')}")


# ---------------------------------------------------------------- calibration set


def make_calibration() -> None:
    """Re-phonemize the texts of ``calibration_sentences.json`` (espeak-ng, as the server does)."""
    from tts_engine.frontend import TextFrontend
    from tts_engine.torch_vits.int8 import CALIBRATION_SENTENCES
    from tts_engine.voice import Voice
    from base import models
    from base.config import load_config

    cfg = load_config()
    path = models.resolve_voice(cfg).path
    frontend = TextFrontend(
        Voice.load(path, models.voice_config_path(cfg, path)).config
    )
    doc = json.loads(CALIBRATION_SENTENCES.read_text())
    rows = []
    for s in doc["sentences"]:
        (ids,) = list(frontend.sentence_ids(s["text"]))
        rows.append({"text": s["text"], "words": len(s["text"].split()), "ids": ids})
    meta = {"voice": path.name, "note": doc.get("note", "")}
    body = ",\n  ".join(
        json.dumps(r, ensure_ascii=False) for r in rows
    )  # one sentence per line
    CALIBRATION_SENTENCES.write_text(
        json.dumps(meta, ensure_ascii=False)[:-1]
        + ',\n "sentences": [\n  '
        + body
        + "\n ]\n}\n"
    )
    print(f"wrote {len(rows)} sentences to {CALIBRATION_SENTENCES}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--precisions",
        default=DEFAULT_PRECISIONS,
        help="variants, commas: fp32 fp16 bf16 int8 int8-dynamic, +compile",
    )
    p.add_argument(
        "--device", default=None, help="default: cuda when available, else cpu"
    )
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument(
        "--duration",
        type=float,
        default=15.0,
        help="measured seconds of load per variant",
    )
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--step-batches", default="1,32,128")
    p.add_argument("--step-chunk", type=int, default=256)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--snr-sentences", type=int, default=16)
    p.add_argument("--wav-sentences", type=int, default=16)
    p.add_argument("--chunk-frames", type=int, default=64)
    p.add_argument("--tail-chunk-frames", type=int, default=256)
    p.add_argument("--max-batch", type=int, default=128)
    p.add_argument("--max-frames", type=int, default=3072)
    p.add_argument(
        "--fine",
        action="store_true",
        help="tts_load's fine decode batch buckets (default: powers of two, faster start-up)",
    )
    # Read by tts_backends.CudaBackend (keep in step with tts_load's engine options):
    p.add_argument("--cudnn-benchmark", action="store_true", help="RunnerOptions.cudnn_benchmark")
    p.add_argument("--allocator", default="async", choices=["async", "native"])
    add_common_arguments(p)
    p.add_argument(
        "--append",
        action="store_true",
        help="keep other variants' rows in an existing results file",
    )
    p.add_argument(
        "--wer",
        type=Path,
        metavar="NPZ",
        help="only transcribe this npz and fill wer (CPU machine)",
    )
    p.add_argument("--plot", type=Path, help="only render the PNG of this results JSON")
    p.add_argument("--make-calibration", action="store_true")
    args = p.parse_args(argv)
    if args.make_calibration:
        make_calibration()
        return 0
    if args.wer:
        wer_pass(args.wer)
        return 0
    if args.plot:
        plot(args.plot)
        return 0
    args.precisions = [v for v in args.precisions.split(",") if v]
    args.coarse = not args.fine
    for v in args.precisions:
        parse_variant(v)
    args.step_batches = [int(b) for b in args.step_batches.split(",") if b]
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    run(common_arguments(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
