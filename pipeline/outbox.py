"""A connection's outbox: the bounded queue of events on their way to the client, with room
kept for events while audio waits.

Speech is made faster than real time (on a GPU, a whole sentence's audio at once), and a client
on a slow link or one that reads as it plays takes it more slowly. So audio deltas wait for room
(``wait_room``) instead of filling the queue: the speech stream pauses, its audio stays in the
stream as PCM, and what the client reads frees room for more. The last ``reserve`` places are
kept for every other event (transcripts, errors, ``*.done``), which never wait. A client that
takes nothing while the queue stays at its audio limit for ``stall_s`` seconds is not reading;
so is one whose queue fills up all the way.
"""

from __future__ import annotations

import asyncio
from typing import Any

#: Places kept for events other than audio, at most (a quarter of a small queue).
RESERVE = 64


class Outbox(asyncio.Queue):
    """``asyncio.Queue`` of ``maxsize`` events; audio waits for room below ``audio_limit``."""

    def __init__(self, maxsize: int, stall_s: float) -> None:
        if maxsize < 2:
            raise ValueError(f"an outbox needs at least 2 places, got {maxsize}")
        if stall_s <= 0:
            raise ValueError(f"stall_s must be positive, got {stall_s}")
        super().__init__(maxsize)
        #: Audio waits while this many events are queued.
        self.audio_limit = maxsize - min(RESERVE, max(1, maxsize // 4))
        self.stall_s = stall_s
        self._room = asyncio.Event()
        self._room.set()

    def _get(self) -> Any:  # asyncio.Queue's hook, under every get / get_nowait
        item = super()._get()
        if self.has_room():
            self._room.set()
        return item

    def has_room(self) -> bool:
        """An audio event may be queued now (fewer than ``audio_limit`` events queued)."""
        return self.qsize() < self.audio_limit

    async def wait_room(self) -> bool:
        """Return True once an audio event may be queued; False if the client took nothing for
        ``stall_s`` seconds while the queue stayed at its audio limit."""
        while not self.has_room():
            self._room.clear()
            try:
                await asyncio.wait_for(self._room.wait(), self.stall_s)
            except TimeoutError:
                return False
        return True
