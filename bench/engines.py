"""Engine latency benchmark: VAD per frame, ASR per utterance length, LLM first token / tok/s / cancel.

ASR compares our ``Transcriber`` (short encoder window) with faster-whisper's own
``WhisperModel.transcribe`` (30 s window), same model and decoding options, runs
interleaved. Speech is the bundled Piper voice, framed like VAD output (silence
before and after) to total 1, 2 and 5 s.

Writes ``OUT/engines-<hardware>-<date>.json`` and a PNG beside it.

    python -m bench.engines --reps 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from bench.harness import add_output_arguments, write_json

RATE = 16000
CANDIDATES = [
    "Yes.", "Hello there.", "What time is it?", "What is the capital of France?",
    "I would like a cup of coffee, please.",
    "Please remind me to call my mother at six o'clock this evening.",
    "Explain to me how a rainbow forms after the rain, and why it has colors.",
    "Last summer we hiked through the mountains and cooked dinner over an open fire.",
]
STORY = "Tell me a very long story about a dragon, a knight and a village by the sea."


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def summary(values: list[float]) -> dict:
    """Milliseconds: min, median, p90, max of values in seconds."""
    v = sorted(values)
    return {"min_ms": ms(v[0]), "median_ms": ms(statistics.median(v)),
            "p90_ms": ms(v[min(len(v) - 1, int(0.9 * len(v)))]), "max_ms": ms(v[-1]), "n": len(v)}


def utterance(say, total_s: float) -> tuple[str, np.ndarray]:
    """The longest candidate sentence that fits in ``total_s`` with 0.3 s before, padded to it."""
    best = None
    for text in CANDIDATES:
        pcm = say(text)
        if len(pcm) / RATE <= total_s - 0.35:
            best = (text, pcm)
    text, pcm = best
    tail = int(total_s * RATE) - len(pcm) - int(0.3 * RATE)
    return text, np.concatenate([np.zeros(int(0.3 * RATE), np.int16), pcm, np.zeros(tail, np.int16)])


def bench_vad(cfg, say) -> dict:
    from asr.vad import VoiceActivityDetector

    speech = np.concatenate([say(t) for t in CANDIDATES[3:6]])
    stream = np.concatenate([np.zeros(RATE, np.int16), speech] * 6)  # ~40 s, 1/4 silence
    chunk = RATE * 20 // 1000  # 20 ms client chunks (frames are cfg.vad.frame_ms)
    runs = []
    for _ in range(5):
        det = VoiceActivityDetector.from_config(cfg)
        t = time.perf_counter()
        for i in range(0, len(stream), chunk):
            det.feed(stream[i : i + chunk])
        runs.append((time.perf_counter() - t) / (len(stream) // det.frame_samples))
    return {"frame_ms": cfg.vad.frame_ms, "stream_s": round(len(stream) / RATE, 1),
            "us_per_frame_median": round(statistics.median(runs) * 1e6, 2),
            "us_per_frame_min": round(min(runs) * 1e6, 2)}


def bench_asr(cfg, say, reps: int) -> list[dict]:
    from asr.transcriber import Transcriber

    tr = Transcriber.from_config(cfg)
    tr.warmup()
    rows = []
    for total in (1.0, 2.0, 5.0):
        text, pcm = utterance(say, total)
        audio = pcm.astype(np.float32) / 32768
        ours, full, hyp = [], [], ""
        for _ in range(reps):
            t = time.perf_counter()
            hyp = tr.transcribe(pcm).text
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            segments, _ = tr.whisper_model.transcribe(
                audio, language="en", beam_size=1, temperature=0.0, without_timestamps=True,
                condition_on_previous_text=False, vad_filter=False)
            full_text = " ".join(s.text.strip() for s in segments)
            full.append(time.perf_counter() - t)
        rows.append({"audio_s": total, "reference": text, "ours": hyp, "faster_whisper": full_text,
                     "short_window": summary(ours), "full_window": summary(full)})
        print(f"ASR {total} s: ours {rows[-1]['short_window']['median_ms']} ms, "
              f"30 s window {rows[-1]['full_window']['median_ms']} ms  {hyp!r}", flush=True)
    return rows


def bench_llm(cfg, reps: int) -> dict:
    from llm.batched import BatchedChat, ReplyOptions

    model = BatchedChat.from_config(cfg)
    system = {"role": "system", "content": cfg.llm.system_prompt}
    ttft, rates, gaps = [], [], []
    for i in range(reps):
        q = {"role": "user", "content": f"What is the capital of France? ({i})"}
        for _ in model.stream(f"q{i}", [system, q], ReplyOptions(max_tokens=8)):
            pass
        ttft.append(model.last_stats.first_token_s)
        last = None
        for _ in model.stream(f"s{i}", [system, {"role": "user", "content": STORY}], ReplyOptions(max_tokens=120)):
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            last = now
        s = model.last_stats
        if s.completion_tokens > 10:
            rates.append((s.completion_tokens - 1) / (s.total_s - s.first_token_s))
    history = [system]
    for i in range(10):
        history += [{"role": "user", "content": f"Tell me fact {i} about the ocean and its animals."},
                    {"role": "assistant", "content": "The ocean covers seventy one percent of the "
                     f"planet and is home to whales, dolphins and sharks; fact {i} is that "
                     "plankton makes much of the oxygen we breathe."}]
    history.append({"role": "user", "content": "What is the largest animal in the ocean?"})
    reply = "".join(model.stream("h", history, ReplyOptions(max_tokens=40)))
    cold = model.last_stats
    history += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And the fastest?"}]
    for _ in model.stream("h", history, ReplyOptions(max_tokens=40)):
        pass
    warm = model.last_stats
    cancels = []
    for i in range(reps * 2):
        cancel, set_at = threading.Event(), []
        it = model.stream(f"c{i}", [system, {"role": "user", "content": STORY}],
                          ReplyOptions(max_tokens=400, cancel=cancel))
        next(it)
        threading.Timer(0.05 + 0.02 * i, lambda: (set_at.append(time.perf_counter()),
                                                  cancel.set())).start()
        for _ in it:
            pass
        cancels.append(time.perf_counter() - set_at[0])
    return {
        "first_token_short_prompt": summary(ttft),
        "decode_tok_per_s_median": round(statistics.median(rates), 1),
        "gap_between_deltas": summary(gaps),
        "history": {"prompt_tokens": cold.prompt_tokens,
                    "turn1_cold_first_token_ms": ms(cold.first_token_s),
                    "prefill_tok_per_s": round((cold.prompt_tokens - cold.cached_tokens)
                                               / cold.first_token_s, 1),
                    "turn2_cached_tokens": warm.cached_tokens,
                    "turn2_prompt_tokens": warm.prompt_tokens,
                    "turn2_first_token_ms": ms(warm.first_token_s)},
        "cancel_to_stream_end": summary(cancels),
    }


def plot(asr_rows: list[dict], llm: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    x = np.arange(len(asr_rows))
    a.bar(x - 0.2, [r["short_window"]["median_ms"] for r in asr_rows], 0.4, label="ours (short window)")
    a.bar(x + 0.2, [r["full_window"]["median_ms"] for r in asr_rows], 0.4, label="30 s window")
    a.set_xticks(x, [f"{r['audio_s']:g} s" for r in asr_rows])
    a.set_ylabel("median latency, ms")
    a.set_title("whisper base int8, greedy")
    a.legend()
    h = llm["history"]
    names = ["short prompt", f"turn 1 ({h['prompt_tokens']} tok, cold)", "turn 2 (cached)"]
    vals = [llm["first_token_short_prompt"]["median_ms"], h["turn1_cold_first_token_ms"],
            h["turn2_first_token_ms"]]
    b.bar(names, vals, color="tab:green")
    b.set_yscale("log")
    b.set_ylabel("time to first token, ms")
    b.set_title(f"SmolLM2-135M Q4_1, {llm['decode_tok_per_s_median']} tok/s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    add_output_arguments(ap)
    args = ap.parse_args()
    from bench.piper_speech import PiperSpeech

    from base.config import load_config

    cfg = load_config()
    say = PiperSpeech(cfg).say
    load_before = os.getloadavg()
    vad = bench_vad(cfg, say)
    print("VAD", vad, flush=True)
    asr_rows = bench_asr(cfg, say, args.reps)
    llm = bench_llm(cfg, args.reps)
    print("LLM", llm, flush=True)
    extra = {"vad": vad, "llm": llm, "load_avg_before_after": [load_before, os.getloadavg()],
             "env": {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")
                     if k in os.environ},
             "config": {"asr.cpu_threads": cfg.asr.cpu_threads, "llm.n_threads": cfg.llm.n_threads},
             "note": "shared 2-core host: other processes ran during the measurement"}
    path = write_json("engines", asr_rows, extra, out=args.out)
    plot(asr_rows, llm, path.with_suffix(".png"))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
