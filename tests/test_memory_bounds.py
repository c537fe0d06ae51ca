"""What keeps the server's memory flat: the C heap handling of ``voxloop serve``
(pipeline/heap.py) and the bound on onnxruntime's arena (measured as this process's RSS,
so each check is a delta)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from conftest import scaled
from pipeline import heap

MIB = 2**20


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * ctypes.CDLL(None).getpagesize()


@pytest.mark.skipif(heap.malloc_heap() is None, reason="needs glibc")
def test_trim_gives_the_free_heap_back(monkeypatch):
    blocks = [np.ones(8192) for _ in range(4096)]  # 64 KiB each, below the mmap threshold: 256 MiB of heap
    keep = blocks[::64]  # a few stay alive, so the heap cannot shrink from its top alone
    del blocks
    assert heap.malloc_heap()["free"] > 200 * MIB
    grown = rss_bytes()
    assert heap.trim()
    assert rss_bytes() < grown - 150 * MIB
    assert len(keep) == 64
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert not heap.limit_arenas()  # the operator's own setting wins


WORDS = ("the quick brown fox jumps over a lazy dog and then runs far away into the hills " * 4).split()


def _engine_and_ids():  # noqa: ANN202 - (OnnxTtsEngine, ids of the first n words)
    from tts_engine.cpu_engine import OnnxTtsEngine
    from base.config import load_config

    engine = OnnxTtsEngine.from_config(load_config(None, [], environ={}))

    def ids(n_words: int) -> list[int]:
        (sentence,) = engine.frontend.sentence_ids(" ".join(WORDS[:n_words]) + ".")
        return sentence

    return engine, ids


def in_fresh_process(fn):  # noqa: ANN001, ANN201
    """``fn()`` in a fresh process: in the suite's own process other tests' allocations blur its RSS."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(fn).result(timeout=scaled(300))


def _rss_around_a_long_sentence() -> tuple[int, int]:
    """In a fresh process: RSS (bytes) once clauses settled the arena, and after one long sentence."""
    from tts_engine.onnx_backend import SHRINK_ARENA_ABOVE_IDS, InferenceScales

    engine, ids = _engine_and_ids()
    scales = InferenceScales(0.0, 1.0, 0.0)
    clause, long = ids(30), ids(60) * 2  # raw ids longer than any sentence of the frontend
    assert len(clause) < SHRINK_ARENA_ABOVE_IDS < len(long)
    for _ in range(3):  # the arena grows to what clauses need, and stays (reused)
        engine.model.infer(clause, scales)
    settled = rss_bytes()
    engine.model.infer(long, scales)
    return settled, rss_bytes()


def test_input_longer_than_any_sentence_does_not_keep_its_arena():
    settled, after = in_fresh_process(_rss_around_a_long_sentence)
    # The long input's run gave the arena back (kept, it would stay at least at `settled`).
    assert after < settled - 50 * MIB, (settled / MIB, after / MIB)


def _memory_over_clauses_of_every_length() -> tuple[dict, list[dict]]:
    """In a fresh process: RSS and malloc's mmapped bytes (onnxruntime's arena regions) of a
    loaded engine, and after each of 24 clauses of 35-490 ids."""
    import random

    from tts_engine.onnx_backend import SHRINK_ARENA_ABOVE_IDS, InferenceScales

    engine, ids = _engine_and_ids()
    scales = InferenceScales(0.667, 1.0, 0.8)  # the voice's own: durations vary from run to run

    def memory() -> dict:
        return {"rss": rss_bytes(), "mmapped": heap.malloc_heap()["mmapped"]}

    loaded = memory()
    rng = random.Random(3)
    after = []
    for n_words in [rng.randint(3, 43) for _ in range(24)]:
        clause = ids(n_words)
        assert len(clause) <= SHRINK_ARENA_ABOVE_IDS
        engine.model.infer(clause, scales)
        after.append(memory())
    return loaded, after


@pytest.mark.skipif(heap.malloc_heap() is None, reason="needs glibc")
def test_clauses_of_every_length_fit_the_arena_reserved_at_start():
    loaded, after = in_fresh_process(_memory_over_clauses_of_every_length)
    mib = [(round(a["rss"] / MIB), round(a["mmapped"] / MIB)) for a in after]
    # The arena was sized at load for the longest clause kept: no clause adds a region to it
    # (one more region would be tens to hundreds of MiB) ...
    assert max(a["mmapped"] for a in after) < loaded["mmapped"] + 8 * MIB, (loaded, mib)
    # ... and RSS only grows by the pages of the reserved regions that runs touch for the first time.
    assert max(a["rss"] for a in after) < loaded["rss"] + 48 * MIB, (loaded, mib)


async def test_every_hub_gives_the_heap_back_only_while_no_session_is_open(monkeypatch):
    # Each server process runs one Hub (front-end processes of ``server.front_ends`` too), so the
    # Hub is where the idle trim lives; sessions here are placeholders (no models needed).
    import asyncio

    from pipeline.engines import Engines
    from pipeline.hub import Hub
    from base.config import load_config

    cfg = load_config(None, ["server.port=0", "trace.path=none"], environ={})
    hub = Hub(cfg, Engines(cfg))
    trims: list[int] = []
    monkeypatch.setattr(heap, "IDLE_TRIM_EVERY_S", 0.01)
    monkeypatch.setattr(heap, "trim", lambda: trims.append(len(hub.sessions)) or True)

    async def trims_after(wait_s: float) -> int:
        before = len(trims)
        await asyncio.sleep(wait_s)
        return len(trims) - before

    await hub.start()
    try:
        assert await trims_after(scaled(0.5)) > 0
        hub.sessions["open"] = object()  # type: ignore[assignment]
        await asyncio.sleep(0.05)  # a look already past its check may still trim once
        assert await trims_after(0.3) == 0
        del hub.sessions["open"]
        assert await trims_after(scaled(0.5)) > 0
    finally:
        await hub.stop(grace_s=0)
    assert await trims_after(0.1) == 0
    assert set(trims) == {0}


def test_no_sentence_of_the_frontend_is_longer_than_the_reserved_arena():
    from tts_engine.frontend import MAX_SENTENCE_PHONEMES, TextFrontend
    from tts_engine.onnx_backend import SHRINK_ARENA_ABOVE_IDS
    from tts_engine.voice import Voice
    from base import models
    from base.config import load_config

    cfg = load_config(None, [], environ={})
    path = models.resolve_voice(cfg).path
    frontend = TextFrontend(Voice.load(path, models.voice_config_path(cfg, path)).config)
    endless = " ".join(WORDS * 10)  # one sentence of 640 words: split at MAX_SENTENCE_PHONEMES
    lengths = [len(ids) for ids in frontend.sentence_ids(endless)]
    assert len(lengths) > 1 and max(lengths) <= SHRINK_ARENA_ABOVE_IDS == 2 * MAX_SENTENCE_PHONEMES + 3
