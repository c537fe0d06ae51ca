"""Host-side ceiling of the GPU TTS scheduler: sentences per second with a GPU that takes no time.

``BatchScheduler`` (the real one) drives a runner whose every launch returns at once (an
orchestration stand-in: no model, no device), so what is measured is the scheduler thread's own
Python work per sentence: admitting, grouping chunks into launches, delivering rows, handing
outcomes out, plus the clients' side, each sentence's ids checked as ``CudaTtsEngine`` checks them
and copied into the encoder's padded rows as ``StepRunner.encode`` does. Closed loop, ``--clients`` clients, sentences of
``--frames`` frames (349 = the load bench's 4.05 s mean at the bundled voice's 22 050 Hz / 256
hop) and ``--ids`` phoneme ids, the GPU engine's shipped shapes (32-frame first chunks, later
chunks up to 256 frames, 2 fast lanes, max batch 128). Two ways of receiving, as the engine has:

- ``sink``: each request's outcomes go to a sink in bulk per step (the served path's
  ``pipeline/engine_link.py``); the sink resubmits a finished client's next sentence;
- ``threads``: one thread per client iterates its request (the load bench's engine mode).

Compare the figure with the served GPU engine's sentences per second: the difference is the time
the scheduler thread leaves for the GPU. Writes ``<out>/tts_scheduler_host-<hardware>-<date>.json``
and a PNG beside it. Example::

    python -m bench.tts_scheduler_host --clients 50 128 --duration 5
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

from bench.harness import add_common_arguments, pyplot, result_path, write_json
from bench.instant_runner import SYMBOLS, InstantRunner
from tts_engine.engine import phoneme_id_array
from tts_engine.torch_vits.runner import batch_buckets
from tts_engine.torch_vits.runner import RunnerOptions
from tts_engine.torch_vits.scheduler import BatchScheduler


def run_level(receive: str, clients: int, chunks_per_step: int, duration_s: float, frames: int, ids: int) -> dict:
    """One closed-loop level; returns its row."""
    options = RunnerOptions(chunk_frames=32, tail_chunk_frames=256, decode_batches=batch_buckets(128),
                            encode_batches=batch_buckets(128, "coarse"), fast_lanes=2,
                            chunks_per_step=chunks_per_step)  # fmt: skip
    scheduler = BatchScheduler(InstantRunner(options, frames), 22050, queue_size=1024)  # type: ignore[arg-type]
    sentence = [int(i) for i in np.random.default_rng(0).integers(1, SYMBOLS, ids)]

    def submit(sink=None):  # noqa: ANN001, ANN202 - as CudaTtsEngine.submit_sentences: ids checked, then queued
        return scheduler.submit(phoneme_id_array(sentence, SYMBOLS), sink=sink)
    done = [0]
    stop = threading.Event()
    try:
        if receive == "sink":

            def sink(outcomes: list) -> None:
                for _, outcome in outcomes:
                    if getattr(outcome, "final", False):
                        done[0] += 1
                        if not stop.is_set():
                            submit(sink)

            t0 = time.perf_counter()
            for _ in range(clients):
                submit(sink)
            time.sleep(duration_s)
            stop.set()
            elapsed, finished = time.perf_counter() - t0, done[0]
        else:

            def client() -> None:
                while not stop.is_set():
                    for _ in submit():
                        pass
                    done[0] += 1

            threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            time.sleep(duration_s)
            stop.set()
            elapsed, finished = time.perf_counter() - t0, done[0]
            for t in threads:
                t.join(10)
        steps, step_s = scheduler.steps, scheduler.step_s
    finally:
        scheduler.close()
    return {"receive": receive, "clients": clients, "chunks_per_step": chunks_per_step, "frames": frames, "ids": ids,
            "sentences_per_s": round(finished / elapsed, 1), "steps": steps,
            "step_mean_ms": round(1000 * step_s / max(1, steps), 3),
            "host_ms_per_sentence": round(1000 * step_s / max(1, finished), 4)}  # fmt: skip


def plot(rows: list[dict], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    labels = [f"{r['receive']}\n{r['clients']} clients\nsteps {r['chunks_per_step']}" for r in rows]
    ax.bar(range(len(rows)), [r["sentences_per_s"] for r in rows], color="tab:blue")
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("sentences / s (GPU time 0)")
    ax.set_title("GPU TTS scheduler, host side alone", fontsize=10)
    fig.tight_layout()
    png = path.with_suffix(".png")
    fig.savefig(png, dpi=110)
    return png


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[50, 128])
    p.add_argument("--chunks-per-step", type=int, nargs="+", default=[1, 0], help="RunnerOptions.chunks_per_step values")
    p.add_argument("--receive", nargs="+", default=["sink", "threads"], choices=["sink", "threads"])
    p.add_argument("--duration", type=float, default=5.0, help="seconds per level")
    p.add_argument("--frames", type=int, default=349, help="frames per sentence")
    p.add_argument("--ids", type=int, default=100, help="phoneme ids per sentence")
    add_common_arguments(p)
    args = p.parse_args(argv)
    rows = []
    for receive in args.receive:
        for clients in args.clients:
            for cps in args.chunks_per_step:
                rows.append(run_level(receive, clients, cps, args.duration, args.frames, args.ids))
                print(rows[-1], flush=True)
    path = write_json("tts_scheduler_host", rows, path=result_path("tts_scheduler_host", "json", args.out,
                                                                     args.hardware, args.date))  # fmt: skip
    print(f"wrote {path} and {plot(rows, path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
