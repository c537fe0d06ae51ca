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


def _rss_around_a_long_sentence() -> tuple[int, int]:
    """In a fresh process: RSS (bytes) once clauses settled the arena, and after one long sentence."""
    from tts_engine.cpu_engine import OnnxTtsEngine
    from tts_engine.onnx_backend import SHRINK_ARENA_ABOVE_IDS, InferenceScales
    from voxloop.config import load_config

    engine = OnnxTtsEngine.from_config(load_config(None, [], environ={}))
    words = ("the quick brown fox jumps over a lazy dog and then runs far away into the hills " * 4).split()
    scales = InferenceScales(0.0, 1.0, 0.0)

    def ids(n_words: int) -> list[int]:
        (sentence,) = engine.frontend.sentence_ids(" ".join(words[:n_words]) + ".")
        return sentence

    clause, long = ids(30), ids(60)
    assert len(clause) < SHRINK_ARENA_ABOVE_IDS < len(long)
    for _ in range(3):  # the arena grows to what clauses need, and stays (reused)
        engine.model.infer(clause, scales)
    settled = rss_bytes()
    engine.model.infer(long, scales)
    return settled, rss_bytes()


def test_a_long_sentence_does_not_keep_its_arena():
    # A fresh process: in the suite's own process other tests' allocations blur its RSS.
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        settled, after = pool.submit(_rss_around_a_long_sentence).result(timeout=scaled(300))
    # The long sentence's run gave the arena back (kept, it would stay at least at `settled`).
    assert after < settled - 50 * MIB, (settled / MIB, after / MIB)
