"""``pipeline.outbox.Outbox``: audio waits for room below its limit, other events use the reserve,
a client that takes nothing for ``stall_s`` is not reading."""

from __future__ import annotations

import asyncio
import time

import pytest

from pipeline.outbox import RESERVE, Outbox


def test_the_reserve_is_a_quarter_of_a_small_queue_and_at_most_its_constant():
    assert [Outbox(n, 1.0).audio_limit for n in (2, 8, 100, 512)] == [1, 6, 75, 512 - RESERVE]
    with pytest.raises(ValueError, match="at least 2"):
        Outbox(1, 1.0)
    with pytest.raises(ValueError, match="positive"):
        Outbox(8, 0)


async def test_audio_waits_until_the_client_takes_an_event():
    box = Outbox(8, 5.0)
    for i in range(box.audio_limit):
        assert await box.wait_room()
        box.put_nowait(("audio", i))
    waiter = asyncio.create_task(box.wait_room())
    await asyncio.sleep(0.05)
    assert not waiter.done()
    box.put_nowait("transcript")  # other events take the reserve while audio waits
    box.put_nowait("done")
    with pytest.raises(asyncio.QueueFull):
        box.put_nowait("one too many")
    for _ in range(2):
        await box.get()
        await asyncio.sleep(0.01)
        assert not waiter.done()  # still at the audio limit: the events came first
    await box.get()
    assert await asyncio.wait_for(waiter, 1.0) is True


async def test_a_client_that_takes_nothing_for_stall_s_is_not_reading():
    box = Outbox(4, 0.2)
    for _ in range(box.audio_limit):
        box.put_nowait("audio")
    t0 = time.monotonic()
    assert await box.wait_room() is False
    assert 0.2 <= time.monotonic() - t0 < 2.0
