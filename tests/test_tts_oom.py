"""GPU TTS scheduler under out-of-memory, on CPU with the real voice and injected OOMs:
the batch limit drops, requests are re-queued or fail with Overloaded, clients retry
with backoff and all finish, and the limit grows back once the fault is lifted."""

from __future__ import annotations

import logging
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from conftest import scaled  # noqa: E402
from base.errors import Overloaded  # noqa: E402

RETRY_AFTER_MS = 20
SENTENCES = ["Hello there.", "How are you today?", "Fine, thanks.", "See you soon."]


@pytest.fixture(scope="module", params=[(1, 1), (0, 1), (0, 2), (0, 2, True)],
                ids=["one-chunk-per-step", "all-chunks-per-step", "all-chunks-two-main-launches", "flow-once"])
def engine(cfg, request):
    """``chunks_per_step`` 0: a request's later chunks (32 frames each here) go in one step as rows of
    one launch, so a failed launch holds several rows of each of its requests; ``main_in_flight`` 2:
    main launches keep their own staged buffers (given back when an OOM drops them); ``flow_once``: the
    flow of a launch that an OOM drops runs again with its rows."""
    from tts_engine.torch_vits.cuda_engine import CudaTtsEngine
    from tts_engine.torch_vits.runner import RunnerOptions
    from tts_engine.voice import Voice
    from base import models

    torch.set_num_threads(2)
    options = RunnerOptions(
        chunk_frames=32, max_frames=512, decode_batches=(1, 2, 4, 8), encode_batches=(1, 2, 4, 8),
        phoneme_buckets=(64, 128), cuda_graphs=False, chunks_per_step=request.param[0],
        main_in_flight=request.param[1], flow_once=request.param[2] if len(request.param) > 2 else False,
    )  # fmt: skip
    engine = CudaTtsEngine(
        Voice.load(models.resolve_voice(cfg).path), options, device="cpu", oom_retry_after_ms=RETRY_AFTER_MS
    )
    engine.scheduler.regrow_steps = 4
    yield engine
    engine.close()


def speak_with_retries(engine, ids, refusals: list[Overloaded], attempts: int = 10) -> bool:
    """Speak one clause as ``RealtimeClient.speak`` does: on Overloaded wait retry_after_ms, doubling."""
    for attempt in range(attempts):
        try:
            chunks = list(engine.submit(ids))
        except Overloaded as exc:
            refusals.append(exc)
            time.sleep(exc.retry_after_ms / 1000 * 2**attempt)
            continue
        return bool(chunks) and chunks[-1].final and sum(len(c.pcm) for c in chunks) > 0
    return False


def wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + scaled(timeout_s)
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.slow
def test_oom_shrinks_the_batch_fails_only_batch_one_and_grows_back(engine, caplog):
    caplog.set_level(logging.INFO, logger="tts_engine.torch_vits.scheduler")
    scheduler = engine.scheduler
    ids = [list(engine.frontend.sentence_ids(s))[0] for s in SENTENCES]
    assert scheduler.max_batch == scheduler.max_slots == 8

    succeeded: list[int] = []  # padded batches of the launches that ran
    state = {"above": 2}

    def fault(batch: int) -> None:
        if state["above"] is not None and batch > state["above"]:
            raise torch.OutOfMemoryError(f"injected OOM at batch {batch}")
        succeeded.append(batch)

    scheduler.fault = fault
    refusals: list[Overloaded] = []
    done: list[bool] = []
    lowest = [scheduler.max_batch]

    def client(k: int) -> None:
        for n in range(5):  # 8 clients x 5 = 40 requests
            done.append(speak_with_retries(engine, ids[(k + n) % len(ids)], refusals))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    try:
        assert wait_for(lambda: lowest.append(scheduler.max_batch) or len(done) >= 8, 30)
        assert scheduler.ooms >= 1 and min(lowest) <= 2
        assert succeeded and max(succeeded) <= 2  # no launch above the fault's limit ran
        state["above"] = 0  # no memory at all: batch-1 launches fail, their clients back off
        assert wait_for(lambda: len(refusals) >= 2, 10)
        state["above"] = None  # memory is back
    finally:
        state["above"] = None
        for t in threads:
            t.join(scaled(60))
    assert not any(t.is_alive() for t in threads)

    assert len(done) == 40 and sum(done) / len(done) >= 0.998
    assert refusals and all(r.retry_after_ms == RETRY_AFTER_MS and r.code == "server_overloaded" for r in refusals)

    def burst() -> bool:  # some load, so that steps run and the limit can grow
        requests = [engine.submit(ids[i % len(ids)]) for i in range(8)]
        for r in requests:
            list(r)
        return scheduler.max_batch == scheduler.max_slots

    assert wait_for(burst, 30)
    assert max(succeeded) > 2  # bigger batches run again
    messages = [r.getMessage() for r in caplog.records]
    assert any("out of memory" in m and "max batch 8 ->" in m for m in messages)
    assert any("-> 8 after" in m for m in messages)
