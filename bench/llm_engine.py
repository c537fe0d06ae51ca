"""Shared by the LLM benchmarks (``bench.llm_batch``, ``bench.llm_history``): one warm
``BatchedChat`` from the configuration, levels run on it, rows written with the LLM settings."""

from __future__ import annotations

import os
from pathlib import Path

from bench.harness import write_json


def measure(name: str, overrides: list[str], levels: list[int], run, note: str, out: Path):  # noqa: ANN001, ANN201
    """``run(engine, system_prompt, level)`` for each level on one warm engine; writes and returns
    (path of ``<out>/<name>-<hardware>-<date>.json``, rows)."""
    cfg, engine = warm_engine(overrides)
    rows = []
    load_before = os.getloadavg()
    for level in levels:
        rows.append(run(engine, cfg.llm.system_prompt, level))
        print(rows[-1], flush=True)
    path = write_json(name, rows, {**engine_facts(cfg), "load_avg_before_after": [load_before, os.getloadavg()],
                                   "note": note}, out=out)  # fmt: skip
    print(path)
    return path, rows


def warm_engine(overrides: list[str]):  # noqa: ANN201 - (Config, BatchedChat)
    """The configured ``BatchedChat`` (``--set`` overrides applied), after one short warm-up reply."""
    from llm.batched import BatchedChat, ReplyOptions
    from base.config import load_config

    cfg = load_config(None, overrides)
    engine = BatchedChat.from_config(cfg)
    engine.generate("warmup", [{"role": "user", "content": "Hello!"}], ReplyOptions(max_tokens=4))
    engine.release("warmup")
    engine.step()
    return cfg, engine


def engine_facts(cfg) -> dict:  # noqa: ANN001
    """The LLM settings a result file records."""
    return {"config": {k: getattr(cfg.llm, k) for k in ("n_ctx", "max_sequences", "batch_tokens", "n_threads",
                                                       "n_gpu_layers")}}  # fmt: skip
