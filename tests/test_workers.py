"""ModelWorker: priority classes, FIFO within a class, the full-queue policy, cancelled jobs."""

from __future__ import annotations

import asyncio
import threading

import pytest

from conftest import eventually, scaled
from pipeline.workers import BACKGROUND, NORMAL, URGENT, ModelWorker
from base.errors import Cancelled, Overloaded


async def blocked_worker(queue_size: int) -> tuple[ModelWorker, threading.Event, asyncio.Future]:
    """A one-thread worker whose thread is busy until the returned gate is set."""
    worker: ModelWorker = ModelWorker("test", [object()], queue_size=queue_size)
    gate, started = threading.Event(), threading.Event()
    running = worker.submit(lambda _: (started.set(), gate.wait(scaled(10))))
    assert started.wait(scaled(5))
    return worker, gate, running


async def test_priority_classes_run_first_then_in_order_and_a_full_queue_refuses():
    worker, gate, running = await blocked_worker(queue_size=4)
    order: list[str] = []
    jobs = [("partial", BACKGROUND), ("clause 2", NORMAL), ("first clause", URGENT), ("clause 3", NORMAL)]
    futures = [worker.submit(lambda _, name=name: order.append(name), priority=p) for name, p in jobs]
    with pytest.raises(Overloaded) as info:
        worker.submit(lambda _: None, priority=URGENT)  # the queue holds 4: refused at once, not queued
    assert info.value.code == "server_overloaded" and info.value.retry_after_ms > 0
    gate.set()
    await asyncio.wait_for(asyncio.gather(running, *futures), scaled(5))
    assert order == ["first clause", "clause 2", "clause 3", "partial"]
    assert await eventually(worker.idle)  # the thread counts a job until it is free again
    worker.close()


async def test_a_job_cancelled_while_queued_never_runs():
    worker, gate, running = await blocked_worker(queue_size=4)
    cancel = threading.Event()
    ran = []
    queued = worker.submit(lambda _: ran.append(1), cancel=cancel)
    cancel.set()
    gate.set()
    with pytest.raises(Cancelled):
        await asyncio.wait_for(queued, scaled(5))
    await running
    assert ran == []
    worker.close()
