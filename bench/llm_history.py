"""LLM first token against the conversation's cached history: one ``BatchedChat``, one conversation.

For each history length (``--turns`` earlier user/assistant pairs of fixed text after the system
prompt): the history is read into a fresh conversation ahead (``BatchedChat.prefill``, as after a
history cut), then a new user turn is submitted and timed to its first token (``max_tokens`` 1,
greedy): the new tokens are read with attention over every cached one. Repeated ``--repeats``
times per length; reports cached and new prompt tokens and the first token's p50 / min.

Writes ``OUT/llm_history-<hardware>-<date>.json`` (+ ``.png``).

    python -m bench.llm_history --turns 0 8 16 24 32
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.harness import add_output_arguments
from bench.llm_engine import measure

USER = "Tell me one thing about the {} in a sentence or two."
ASSISTANT = ("The {} is a fine subject: people have written about it for centuries, and there is always "
             "one more detail worth a closer look.")
THINGS = ["sea", "moon", "forest", "river", "desert", "city", "mountain", "garden", "library", "harbour"]
QUESTION = "And what would you say is the most surprising fact about it?"


def history(system: str, turns: int) -> list[dict]:
    messages = [{"role": "system", "content": system}]
    for i in range(turns):
        thing = THINGS[i % len(THINGS)]
        messages += [{"role": "user", "content": USER.format(thing)}, {"role": "assistant", "content": ASSISTANT.format(thing)}]
    return messages


def run_level(engine, system: str, turns: int, repeats: int) -> dict:
    from llm.batched import ReplyOptions

    first, cached, read = [], [], []
    for k in range(repeats):
        session = f"h{turns}-{k}"
        messages = history(system, turns)
        ahead = engine.prefill(session, messages)
        while not ahead.done:
            engine.step()
        t0 = time.perf_counter()
        _, stats = engine.generate(session, [*messages, {"role": "user", "content": QUESTION}],
                                   ReplyOptions(max_tokens=1, temperature=0.0))  # fmt: skip
        wall = time.perf_counter() - t0
        first.append(stats.first_token_s if stats.first_token_s is not None else wall)
        cached.append(stats.cached_tokens)
        read.append(stats.prompt_tokens - stats.cached_tokens)
        engine.release(session)
        engine.step()
    ms = np.array(first) * 1000
    return {"turns": turns, "repeats": repeats, "cached_tokens": int(np.median(cached)), "new_tokens": int(np.median(read)),
            "first_token_p50_ms": round(float(np.median(ms)), 1), "first_token_min_ms": round(float(ms.min()), 1)}  # fmt: skip


def plot(path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    x = [r["cached_tokens"] for r in rows]
    ax.plot(x, [r["first_token_p50_ms"] for r in rows], "o-", label="p50")
    ax.plot(x, [r["first_token_min_ms"] for r in rows], "x--", label="min")
    ax.set_xlabel("cached history, tokens")
    ax.set_ylabel(f"first token after ~{rows[0]['new_tokens']} new tokens, ms")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, nargs="+", default=[0, 8, 16, 24, 32])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    add_output_arguments(p)
    args = p.parse_args(argv)
    path, rows = measure("llm_history", args.overrides, args.turns,
                         lambda engine, system, turns: run_level(engine, system, turns, args.repeats),
                         "first token of a new user turn after its history was read ahead; one conversation, greedy", args.out)
    plot(path, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
