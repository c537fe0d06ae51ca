"""Request buffer pool of the GPU TTS engine (run on CPU with the real voice) and its metrics."""

from __future__ import annotations

import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tts_engine.torch_vits.buffers import MIN_CLASS_BYTES, HostBufferPool, size_class  # noqa: E402


def test_size_classes_are_powers_of_two_from_4_kib():
    assert size_class(1) == MIN_CLASS_BYTES == 4096
    assert size_class(4096) == 4096
    assert size_class(4097) == 8192
    assert size_class(3 * 2**20) == 4 * 2**20


def test_take_give_reuses_within_a_class_and_the_cache_is_bounded():
    pool = HostBufferPool(pinned=False, max_cached_bytes=16384)
    a = pool.take(5000)
    assert a.numel() == 8192 and a.dtype == torch.uint8
    pool.give(a)
    b = pool.take(6000)  # same class: the same block
    assert b.data_ptr() == a.data_ptr()
    assert (pool.counters.allocations, pool.counters.reuses) == (1, 1)
    blocks = [pool.take(8000) for _ in range(3)]  # b is out, so 3 new blocks
    for block in [b, *blocks]:
        pool.give(block)
    assert pool.counters.cached_bytes == 16384  # two 8 KiB blocks kept, two freed
    assert pool.counters.outstanding_bytes == 0
    assert pool.counters.high_water_bytes == 4 * 8192


def test_disabled_pool_allocates_every_time():
    pool = HostBufferPool(pinned=False, max_cached_bytes=0)
    for _ in range(3):
        pool.give(pool.take(100))
    assert (pool.counters.allocations, pool.counters.reuses, pool.counters.cached_bytes) == (3, 0, 0)


def test_a_lease_returns_only_when_its_last_view_is_gone():
    pool = HostBufferPool(pinned=False)
    audio = pool.lease((3000,), np.int16)
    audio[:] = 7
    chunk = audio[1000:2000]
    del audio
    gc.collect()
    assert pool.counters.outstanding_bytes == 8192  # the chunk still holds the block
    other = pool.lease((3000,), np.int16)  # so this must be another block
    other[:] = -1
    assert (chunk == 7).all()
    del chunk, other
    gc.collect()
    assert pool.counters.outstanding_bytes == 0 and pool.counters.cached_bytes == 8192 * 2
    pool.lease((3000,), np.int16)  # reuse
    assert pool.counters.reuses == 1


@pytest.fixture(scope="module")
def make_engine(cfg):
    from tts_engine.torch_vits.cuda_engine import CudaTtsEngine
    from tts_engine.torch_vits.runner import RunnerOptions
    from tts_engine.voice import Voice
    from base import models
    from base.config import GpuConfig

    voice = Voice.load(models.resolve_voice(cfg).path)
    torch.set_num_threads(2)
    made = []

    def make(host_pool_mb: int) -> CudaTtsEngine:
        options = RunnerOptions(chunk_frames=32, tail_chunk_frames=64, max_frames=512, decode_batches=(1, 2, 4),
                                encode_batches=(1, 2, 4), phoneme_buckets=(64, 128), cuda_graphs=False)  # fmt: skip
        engine = CudaTtsEngine(voice, options, device="cpu", gpu=GpuConfig(host_pool_mb=host_pool_mb))
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


def _speak_rounds(engine, ids, rounds: int) -> list[list]:
    """Speak ``ids`` together, ``rounds`` times one after another; the last round's chunks are returned."""
    chunks: list[list] = []
    for _ in range(rounds):
        chunks = [list(r) for r in [engine.submit(i) for i in ids]]
    return chunks


@pytest.mark.slow
def test_engine_stops_allocating_once_warm_and_held_chunks_stay_intact(make_engine):
    engine = make_engine(host_pool_mb=64)
    ids = [list(engine.frontend.sentence_ids(s))[0] for s in ("Hello there, my friend.", "How are you today?")]
    first = _speak_rounds(engine, ids, 1)  # held by the caller while more requests run
    copies = [[c.pcm.copy() for c in chunks] for chunks in first]
    report = engine.memory_report()
    warm = {name: c["allocations"] for name, c in report["host_pools"].items()}
    _speak_rounds(engine, ids, 3)
    gc.collect()
    after = engine.memory_report()["host_pools"]
    # Staging buffers: no allocation after the first round; audio: at most the blocks still held.
    assert after["staging"]["allocations"] == warm["staging"]
    assert after["staging"]["reuses"] > 0 and after["audio"]["reuses"] > 0
    # Audio: new blocks only while older ones are still held (the first round's by this test, each
    # round's until the next round's list is built), so two rounds' worth at most, then reuse.
    assert after["audio"]["allocations"] <= warm["audio"] + 2 * len(ids)
    for chunks, saved in zip(first, copies):  # chunks are views into pooled audio: never reused while held
        assert len(chunks) >= 2 and all(np.array_equal(c.pcm, s) for c, s in zip(chunks, saved))
    assert report["pool"] is None and report["max_batch"] == 4 and report["ooms"] == 0


@pytest.mark.slow
def test_without_the_pool_every_request_allocates(make_engine):
    engine = make_engine(host_pool_mb=0)
    ids = [list(engine.frontend.sentence_ids("Good morning to you."))[0]]
    _speak_rounds(engine, ids, 1)
    before = engine.memory_report()["host_pools"]["audio"]["allocations"]
    _speak_rounds(engine, ids, 3)
    after = engine.memory_report()["host_pools"]
    assert after["audio"]["allocations"] == before + 3 and after["audio"]["reuses"] == 0
    assert after["staging"]["reuses"] == 0


@pytest.mark.slow
def test_memory_report_is_exported_as_prometheus_gauges(make_engine):
    from prometheus_client import generate_latest

    from pipeline.trace import Metrics

    engine = make_engine(host_pool_mb=64)
    _speak_rounds(engine, [list(engine.frontend.sentence_ids("One more."))[0]], 1)
    metrics = Metrics()
    metrics.watch_tts_memory(engine.memory_report)
    text = generate_latest(metrics.registry).decode()
    assert 'voxloop_tts_host_pool_bytes{kind="high_water",pool="audio"}' in text
    assert "voxloop_tts_host_pool_reuses_total" in text or "voxloop_tts_host_pool_allocations_total" in text
    assert "voxloop_tts_max_batch 4.0" in text
    assert "voxloop_gpu_pool_bytes" not in text  # no device pool on CPU: not faked
    fake_pool = {k: 1.0 for k in ("reserved", "reserved_high", "used", "used_high", "graph_reserved",
                                  "graph_reserved_high", "device_total", "device_used")}  # fmt: skip
    metrics2 = Metrics()
    metrics2.watch_tts_memory(lambda: {**engine.memory_report(), "pool": fake_pool})
    text2 = generate_latest(metrics2.registry).decode()
    assert 'voxloop_gpu_pool_bytes{kind="used",stat="high"} 1.048576e+06' in text2
    # The device's figures, per replica when each replica has a GPU of its own (bench/scaleout).
    assert "voxloop_gpu_device_used_bytes 1.048576e+06" in text2
    assert "voxloop_gpu_device_total_bytes 1.048576e+06" in text2


class _FakeStep:
    """Stands in for a captured graph: capturing it adds ``mb`` MiB to a fake device footprint."""

    def __init__(self, memory: "_FakeMemory", mb: int) -> None:
        self.memory, self.mb = memory, mb

    def capture(self) -> None:
        self.memory.used += self.mb * 2**20


class _FakeMemory:
    backend = "native"

    def __init__(self) -> None:
        self.used = 0

    def footprint(self) -> int:
        return self.used


def test_a_stage_budget_keeps_the_batches_that_fit_and_refuses_when_none_does():
    """Orchestration of the budget rule (the memory figures are faked; on CUDA they are measured)."""
    from tts_engine.torch_vits.runner import StepRunner
    from base.errors import ConfigError

    runner = StepRunner.__new__(StepRunner)  # only _capture_stage's state
    runner.memory, runner.stage_bytes = _FakeMemory(), {}
    steps = {(chunk, b, "main"): _FakeStep(runner.memory, b * 10) for chunk in (64, 256) for b in (1, 2, 4, 8)}
    kept = runner._capture_stage("decode", steps, budget_mb=130)  # b1: 20, b2: +40, b4: +80 = 140 > 130
    assert kept == (1, 2) and sorted(steps) == [(64, 1, "main"), (64, 2, "main"), (256, 1, "main"), (256, 2, "main")]
    assert runner.stage_bytes["decode"] == 60 * 2**20
    runner.memory = _FakeMemory()
    with pytest.raises(ConfigError, match="tts_encode_budget_mb = 5"):
        runner._capture_stage("encode", {(1, 64): _FakeStep(runner.memory, 10)}, budget_mb=5)
    runner.memory.backend = "cudaMallocAsync"
    with pytest.raises(ConfigError, match="allocator = 'native'"):
        runner._capture_stage("decode", {(64, 1, "main"): _FakeStep(runner.memory, 1)}, budget_mb=5)
