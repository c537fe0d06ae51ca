"""CPU TTS benchmark: our OnnxTtsEngine vs piper-tts's PiperVoice, same voice, same threads.

For every sentence of ``bench/sentences_en.txt`` (one run, interleaved, the order of
the two engines alternating) it records the time from the call to the first audio
chunk (first-clause latency) and to the last one, and the seconds of audio made.
RTF = synthesis time / audio duration. A third series measures throughput of our
engine with ``--workers`` 1-thread sessions serving as many threads at once.

Writes ``OUT/tts_cpu-<hardware>-<date>.json`` and a PNG beside it.

    python -m bench.tts_cpu --threads 2
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import threading
import time
from pathlib import Path

import numpy as np

from bench.harness import ROOT, add_output_arguments, command_line, cpu_model, hardware_tag


def percentiles(values: list[float]) -> dict[str, float]:
    a = np.asarray(values)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)), "mean": float(a.mean())}


class Ours:
    name = "voxloop OnnxTtsEngine"

    def __init__(self, cfg, threads: int) -> None:
        from tts_engine.cpu_engine import OnnxTtsEngine

        self.engine = OnnxTtsEngine.from_config(cfg.replace("tts", onnx_threads=threads, onnx_workers=1))

    def speak(self, text: str) -> tuple[float, float, float]:
        """(first-chunk latency s, total s, audio s)."""
        start = time.perf_counter()
        first, samples = None, 0
        for chunk in self.engine.synthesize(text):
            first = first if first is not None else time.perf_counter() - start
            samples += chunk.num_samples
        return first, time.perf_counter() - start, samples / self.engine.sample_rate


class Piper:
    name = "piper-tts PiperVoice"

    def __init__(self, cfg, threads: int) -> None:
        import onnxruntime as ort
        from piper.config import PiperConfig
        from piper.voice import PiperVoice

        from base import models

        onnx = models.resolve_voice(cfg).path
        config = json.loads(models.voice_config_path(cfg, onnx).read_text())
        opts = ort.SessionOptions()  # Piper's own options, with our thread count
        opts.intra_op_num_threads = threads
        session = ort.InferenceSession(str(onnx), sess_options=opts, providers=["CPUExecutionProvider"])
        self.voice = PiperVoice(session=session, config=PiperConfig.from_dict(config))

    def speak(self, text: str) -> tuple[float, float, float]:
        start = time.perf_counter()
        first, samples = None, 0
        for chunk in self.voice.synthesize(text):
            first = first if first is not None else time.perf_counter() - start
            samples += len(chunk.audio_int16_array)
        return first, time.perf_counter() - start, samples / self.voice.config.sample_rate


def interleaved(engines: list, sentences: list[str], warmup: int) -> dict[str, list[tuple[float, float, float]]]:
    for engine in engines:
        for text in sentences[:warmup]:
            engine.speak(text)
    runs: dict[str, list] = {e.name: [] for e in engines}
    for i, text in enumerate(sentences):
        order = engines if i % 2 == 0 else engines[::-1]
        for engine in order:
            runs[engine.name].append(engine.speak(text))
    return runs


def throughput(cfg, workers: int, sentences: list[str]) -> dict:
    """``workers`` threads share one engine with ``workers`` 1-thread sessions; wall-clock RTF."""
    from tts_engine.cpu_engine import OnnxTtsEngine

    engine = OnnxTtsEngine.from_config(cfg.replace("tts", onnx_threads=1, onnx_workers=workers))
    for text in sentences[:workers]:
        list(engine.synthesize(text))
    audio_s = [0.0] * workers

    def work(k: int) -> None:
        for text in sentences[k::workers]:
            audio_s[k] += sum(c.duration_s for c in engine.synthesize(text))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(workers)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {"workers": workers, "threads_per_session": 1, "wall_s": wall, "audio_s": sum(audio_s),
            "rtf": wall / sum(audio_s), "audio_s_per_s": sum(audio_s) / wall}


def summarize(runs: list[tuple[float, float, float]]) -> dict:
    first, total, audio = (list(x) for x in zip(*runs, strict=True))
    return {
        "rtf_overall": sum(total) / sum(audio),
        "rtf": percentiles([t / a for t, a in zip(total, audio, strict=True)]),
        "first_chunk_ms": percentiles([f * 1000 for f in first]),
        "audio_s_total": sum(audio),
        "per_sentence": [{"first_chunk_s": f, "total_s": t, "audio_s": a} for f, t, a in runs],
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["engines"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key, label in ((axes[0], "first_chunk_s", "first-chunk latency (ms)"), (axes[1], None, "RTF")):
        data = []
        for n in names:
            rows = result["engines"][n]["per_sentence"]
            data.append([r[key] * 1000 if key else r["total_s"] / r["audio_s"] for r in rows])
        ax.boxplot(data, tick_labels=names)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    tp = result["throughput"]
    axes[1].axhline(tp["rtf"], color="tab:green", ls="--",
                    label=f"ours, {tp['workers']}x1-thread sessions, parallel: RTF {tp['rtf']:.4f}")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"TTS CPU, {result['threads']} threads, {result['hardware']['cpu']} x{result['hardware']['cores']}"
                 f" — {result['date']}\n{result['command']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads for both engines")
    parser.add_argument("--workers", type=int, default=2, help="sessions for the parallel throughput series")
    parser.add_argument("--warmup", type=int, default=3, help="sentences spoken first and not counted")
    parser.add_argument("--sentences", type=Path, default=ROOT / "bench" / "sentences_en.txt")
    add_output_arguments(parser)
    args = parser.parse_args()

    import onnxruntime

    from base.config import load_config

    cfg = load_config()
    sentences = [s.strip() for s in args.sentences.read_text().splitlines() if s.strip()]
    load_before = os.getloadavg()
    engines = [Ours(cfg, args.threads), Piper(cfg, args.threads)]
    runs = interleaved(engines, sentences, args.warmup)
    tp = throughput(cfg, args.workers, sentences)
    now = dt.datetime.now().astimezone()
    result = {
        "benchmark": "tts_cpu",
        "date": now.isoformat(timespec="seconds"),
        "command": command_line(),
        "hardware": {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform()},
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "note": "CPU shared with other jobs during the run; engines interleaved per sentence so both see the same load",
        "versions": {"onnxruntime": onnxruntime.__version__, "python": platform.python_version()},
        "voice": str(engines[0].engine.voice.model_path.name),
        "threads": args.threads,
        "sentences": len(sentences),
        "warmup_sentences": args.warmup,
        "engines": {e.name: summarize(runs[e.name]) for e in engines},
        "throughput": tp,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"tts_cpu-{hardware_tag()}-{now.strftime('%Y%m%d-%H%M%S')}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out / f"{stem}.png")
    for name, r in result["engines"].items():
        print(f"{name:24} RTF {r['rtf_overall']:.4f} (p50 {r['rtf']['p50']:.4f}, p90 {r['rtf']['p90']:.4f})  "
              f"first chunk p50 {r['first_chunk_ms']['p50']:.0f} ms p90 {r['first_chunk_ms']['p90']:.0f} ms")
    print(f"throughput: {tp['workers']}x1-thread sessions RTF {tp['rtf']:.4f} ({tp['audio_s_per_s']:.1f} audio-s/s)")
    print(args.out / f"{stem}.json")


if __name__ == "__main__":
    main()
