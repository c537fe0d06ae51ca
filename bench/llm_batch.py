"""LLM continuous batching: N concurrent replies on one ``BatchedChat``, one ``llama_decode`` per step.

For each N: N new conversations (story requests, so replies run long; the configured
system prompt already cached) submitted together, greedy, at most ``--tokens`` tokens each. Reports the prompt phase, the step time while all N
decode (p50/p90), aggregate and per-conversation tokens/s, and the share of a step
spent outside ``llama_decode`` (batch building, sampling, detokenizing: host work that
grows with N).

Writes ``OUT/llm_batch-<hardware>-<date>.json``.

    python -m bench.llm_batch --sizes 1 2 4 8
    python -m bench.llm_batch --sizes 1 8 64 200 --set llm.n_gpu_layers=99 --set llm.max_sequences=200 \\
        --set llm.batch_tokens=512        # on a GPU host
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.harness import add_output_arguments
from bench.llm_engine import measure

QUESTIONS = [f"Tell me a long story about {thing}." for thing in (
    "a dragon and a knight", "a lighthouse keeper", "a lost cat in Paris", "a robot who learns to paint",
    "two sisters at sea", "a village by a volcano", "a clockmaker's apprentice", "a fox and a crow")]


def run_level(engine, system: str, n: int, tokens: int) -> dict:
    from llm.batched import ReplyOptions

    options = ReplyOptions(temperature=0.0, max_tokens=tokens)
    replies = [engine.submit(f"n{n}-{i}", [{"role": "system", "content": system},
                                           {"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"}],
                             options) for i in range(n)]
    t0 = time.perf_counter()
    prompt_s, steps = None, []
    while not all(r.done for r in replies):
        t = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t
        if engine.last_batch[1] == n and engine.last_batch[0] == n:  # every conversation decoding
            prompt_s = prompt_s if prompt_s is not None else t - t0
            steps.append((dt, engine.last_decode_s))  # llama_decode apart from the host work
    wall = time.perf_counter() - t0
    for r in replies:
        engine.release(r.session)
    engine.step()
    step = np.array([s for s, _ in steps]) if steps else np.array([np.nan])
    host = np.array([s - d for s, d in steps]) if steps else np.array([np.nan])
    completion = sum(r.stats.completion_tokens for r in replies)
    return {
        "n": n, "tokens_each": tokens, "completion_tokens": completion, "wall_s": round(wall, 3),
        "prompt_phase_s": None if prompt_s is None else round(prompt_s, 3),
        "full_steps": len(steps),
        "step_p50_ms": round(float(np.median(step)) * 1000, 2),
        "step_p90_ms": round(float(np.percentile(step, 90)) * 1000, 2),
        "host_share_of_step": round(float(np.median(host) / np.median(step)), 3),
        "aggregate_tok_per_s": round(n / float(np.median(step)), 1),
        "per_conversation_tok_per_s": round(1 / float(np.median(step)), 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    add_output_arguments(p)
    args = p.parse_args(argv)
    measure("llm_batch", args.overrides, args.sizes, lambda engine, system, n: run_level(engine, system, n, args.tokens),
            "steps counted only while every conversation of the level decodes one token", args.out)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
