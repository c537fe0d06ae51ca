"""The GPU step runner driven by hand: real utterances in every slot, CUDA-event timing, one slot decoded.

Shared by the GPU profile, experiment and INT8 benchmarks (needs torch).
"""

from __future__ import annotations

import statistics

import numpy as np
import torch

from tts_engine.torch_vits.runner import EncodeItem, StepRunner


def timed(fn, reps: int) -> float:
    """Median ms of ``fn()`` over ``reps`` runs, CUDA events, after 3 warm-ups."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def fill_slots(runner: StepRunner, sentences: list[list[int]], noise: bool) -> list[int]:
    """Encode real sentences into every slot; returns their frame counts."""
    n = runner.options.max_slots
    frames = []
    for start in range(0, n, 32):
        items = [
            EncodeItem(sentences[i % len(sentences)], i, 0.667 if noise else 0.0, 1.0, 0.8 if noise else 0.0)
            for i in range(start, min(n, start + 32))
        ]
        frames.extend(int(f) for f in runner.fetch(runner.encode(items))[0])
    return frames


def decode_one(runner: StepRunner, slot: int, frames: int) -> np.ndarray:
    """One slot's utterance through the engine's chunk plan (first chunk, then larger ones), int16."""
    resampler, done = runner.resampler, 0
    out = np.zeros(resampler.out_samples(frames * runner.geometry.hop_length), np.int16)
    while done < frames:
        size = runner.options.next_chunk(done, frames)
        row = runner.fetch(runner.decode([slot], [done], size))[0][0]
        span = resampler.span(done, min(done + size, frames))
        out[span.start : span.stop] = span.of(row)
        done += size
    return out
