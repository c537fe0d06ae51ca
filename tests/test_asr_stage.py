"""``BatchingAsr``: waiting utterances of one language go to the model in one call (orchestration with a
fake transcriber; that batched transcripts equal single ones with the real model is in test_asr.py)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from conftest import eventually, scaled
from pipeline.asr_stage import BatchingAsr
from pipeline.workers import BACKGROUND, NORMAL, PARTIAL, URGENT
from base.errors import Cancelled, ConfigError, ModelError, Overloaded


class FakeTranscriber:
    """Echoes the first sample of each utterance; the first call blocks until ``release`` is set,
    so the test can queue requests behind it."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, list[int], str | None]] = []
        self.release = threading.Event()
        self.started = threading.Event()
        self.fail = fail

    def _run(self, kind: str, pcms, language):
        self.calls.append((kind, [int(p[0]) for p in pcms], language))
        self.started.set()
        assert self.release.wait(scaled(10))
        if self.fail:
            raise ModelError("model failed")
        return [f"{language}:{int(p[0])}" for p in pcms]

    def transcribe(self, pcm, language=None):
        return self._run("one", [pcm], language)[0]

    def transcribe_batch(self, pcms, language=None):
        return self._run("batch", pcms, language)


def utt(n: int) -> np.ndarray:
    return np.full(160, n, dtype=np.int16)


async def test_waiting_utterances_of_one_language_share_a_call_in_priority_order():
    fake = FakeTranscriber()
    asr = BatchingAsr(fake, max_batch=3)
    try:
        first = asyncio.create_task(asr.transcribe(utt(0), "en"))
        assert await asyncio.to_thread(fake.started.wait, scaled(5))
        # Queued while the model is busy: taken by priority (then arrival), at most max_batch at once.
        later = [asyncio.create_task(asr.transcribe(utt(n), lang, priority=p)) for n, lang, p in
                 [(5, "en", PARTIAL), (1, "en", BACKGROUND), (2, "en", NORMAL), (3, "de", URGENT), (4, "en", NORMAL)]]
        await asyncio.sleep(0.05)
        assert asr.pending() == 6
        fake.release.set()
        assert await first == "en:0"
        assert await asyncio.gather(*later) == ["en:5", "en:1", "en:2", "de:3", "en:4"]
        # 3 (urgent, de), 2 and 4 (normal, en) in the second take: one call per language; then 1
        # (speculative) and 5 (a partial transcript, queued first) together.
        assert fake.calls == [("one", [0], "en"), ("one", [3], "de"), ("batch", [2, 4], "en"), ("batch", [1, 5], "en")]
        assert (asr.calls, asr.utterances) == (4, 6)
        assert await eventually(asr.idle)  # the thread counts a batch until it is free again
    finally:
        asr.close()


async def test_cancelled_before_its_turn_is_never_transcribed():
    fake = FakeTranscriber()
    asr = BatchingAsr(fake, max_batch=4)
    try:
        first = asyncio.create_task(asr.transcribe(utt(0), None))
        assert await asyncio.to_thread(fake.started.wait, scaled(5))
        cancel = threading.Event()
        dropped = asyncio.create_task(asr.transcribe(utt(1), None, cancel=cancel))
        kept = asyncio.create_task(asr.transcribe(utt(2), None))
        await asyncio.sleep(0.05)
        cancel.set()
        fake.release.set()
        await first
        with pytest.raises(Cancelled):
            await dropped
        assert await kept == "None:2"
        assert [c[1] for c in fake.calls] == [[0], [2]]
    finally:
        asr.close()


async def test_a_model_error_reaches_every_caller_of_the_call_and_a_full_queue_refuses_at_once():
    fake = FakeTranscriber(fail=True)
    asr = BatchingAsr(fake, max_batch=8, queue_size=2)
    try:
        first = asyncio.create_task(asr.transcribe(utt(0), "en"))
        assert await asyncio.to_thread(fake.started.wait, scaled(5))
        queued = [asyncio.create_task(asr.transcribe(utt(n), "en")) for n in (1, 2)]
        await asyncio.sleep(0.05)
        with pytest.raises(Overloaded):
            await asr.transcribe(utt(3), "en")  # 2 waiting: the queue is full
        fake.release.set()
        for task in (first, *queued):
            with pytest.raises(ModelError, match="model failed"):
                await task
        assert fake.calls[-1] == ("batch", [1, 2], "en")
    finally:
        asr.close()


def test_max_batch_is_checked():
    with pytest.raises(ValueError):
        BatchingAsr(FakeTranscriber(), max_batch=0)


def test_report_carries_the_models_gpu_share():
    fake = FakeTranscriber()
    asr = BatchingAsr(fake)
    try:
        assert asr.report() == {"calls": 0, "utterances": 0, "pending": 0, "gpu_bytes": None}
        fake.gpu_bytes = 300 * 2**20
        assert asr.report()["gpu_bytes"] == 300 * 2**20
    finally:
        asr.close()


class _Loaded:
    """What ``Transcriber.from_config`` returns, for ``Engines.load_asr_model``: records warm-ups."""

    def __init__(self) -> None:
        self.gpu_bytes = None
        self.warmups: list[int] = []

    def warmup(self, batch: int = 1) -> None:
        self.warmups.append(batch)


def _load(cfg, monkeypatch, used: list[int | None]):  # noqa: ANN001, ANN202
    from asr.transcriber import Transcriber
    from pipeline import engines as engines_module

    loaded = _Loaded()
    monkeypatch.setattr(Transcriber, "from_config", classmethod(lambda cls, c, postprocess=None: loaded))
    readings = iter(used)
    monkeypatch.setattr(engines_module, "device_used_bytes", lambda index=0: next(readings))
    return engines_module.Engines(cfg).load_asr_model(), loaded


def test_the_asr_gpu_share_is_measured_around_load_and_a_full_warm_up_batch(cfg, monkeypatch):
    gpu = cfg.replace("asr", device="cuda", compute_type="float16", max_batch=8)
    model, loaded = _load(gpu, monkeypatch, [1000 * 2**20, 1300 * 2**20])
    assert loaded.warmups == [8] and model.gpu_bytes == 300 * 2**20
    # Over the budget: start-up is refused, saying what took how much and what to change.
    with pytest.raises(ConfigError, match=r"300 MiB .* asr\.gpu_budget_mb = 200"):
        _load(gpu.replace("asr", gpu_budget_mb=200), monkeypatch, [1000 * 2**20, 1300 * 2**20])
    # Unknown (no PyTorch / CUDA to ask): no share, no budget check.
    model, _ = _load(gpu.replace("asr", gpu_budget_mb=200), monkeypatch, [None, None])
    assert model.gpu_bytes is None


def test_on_a_cpu_the_asr_warms_up_alone_and_reports_no_gpu_share(cfg, monkeypatch):
    model, loaded = _load(cfg.replace("asr", max_batch=4), monkeypatch, [])
    assert loaded.warmups == [1] and model.gpu_bytes is None


def test_the_metric_appears_with_a_gpu_share_only():
    from pipeline.trace import _AsrCollector

    report = {"calls": 3, "utterances": 5, "pending": 0, "gpu_bytes": None}
    names = [m.name for m in _AsrCollector(lambda: report).collect()]
    assert names == ["voxloop_asr_calls", "voxloop_asr_utterances"]
    report["gpu_bytes"] = 2**28
    metrics = {m.name: m for m in _AsrCollector(lambda: report).collect()}
    assert metrics["voxloop_asr_gpu_bytes"].samples[0].value == 2**28
