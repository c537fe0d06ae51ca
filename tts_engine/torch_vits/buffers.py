"""Request buffer pool: host memory for the GPU engine's per-step inputs and per-request audio.

Buffers come in size classes (powers of two, 4 KiB and up) and return to a free list instead of
being freed, so a serving engine stops allocating once its working set is reached. On CUDA the
blocks are pinned (page-locked), which makes host<->device copies asynchronous.

Two ways to hold a block:

- ``take(nbytes)`` / ``give(block)``: explicit, for buffers the engine itself owns between two
  points of a step (staged inputs, device->host outputs).
- ``lease(shape, dtype)``: a numpy array whose block returns to the pool when the array and
  every view of it are garbage; used for a request's audio, whose chunks (views into it) go to
  callers that may keep them. Nothing is reused while a view is alive.

``max_cached_bytes`` bounds what the free lists keep; a returned block beyond it is freed.
With ``max_cached_bytes = 0`` the pool is disabled: every request allocates (for comparison).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np
import torch

MIN_CLASS_BYTES = 4096


@dataclass
class PoolCounters:
    """Since creation: blocks allocated (misses), taken from a free list (hits), bytes now
    outstanding and cached, and the highest total (outstanding + cached) held."""

    allocations: int = 0
    reuses: int = 0
    outstanding_bytes: int = 0
    cached_bytes: int = 0
    high_water_bytes: int = 0
    allocated_bytes: int = 0


def size_class(nbytes: int) -> int:
    """Smallest power of two >= ``nbytes`` (at least ``MIN_CLASS_BYTES``)."""
    return max(MIN_CLASS_BYTES, 1 << max(0, int(nbytes) - 1).bit_length())


class HostBufferPool:
    """Size-class free lists of uint8 host tensors; thread-safe."""

    def __init__(self, *, pinned: bool, max_cached_bytes: int = 256 * 2**20) -> None:
        self.pinned = pinned
        self.max_cached_bytes = max_cached_bytes
        self.counters = PoolCounters()
        self._free: dict[int, list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_cached_bytes > 0

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 block of at least ``nbytes`` (contents undefined); hand it back with ``give``."""
        cls = size_class(nbytes)
        c = self.counters
        with self._lock:
            free = self._free.get(cls)
            if free:
                block = free.pop()
                c.reuses += 1
                c.cached_bytes -= cls
                c.outstanding_bytes += cls
                return block
            c.allocations += 1
            c.allocated_bytes += cls
            c.outstanding_bytes += cls
            c.high_water_bytes = max(c.high_water_bytes, c.outstanding_bytes + c.cached_bytes)
        return torch.empty(cls, dtype=torch.uint8, pin_memory=self.pinned)

    def give(self, block: torch.Tensor) -> None:
        """Return a block from ``take``; it is kept for reuse while the cache has room."""
        cls = block.numel()
        c = self.counters
        with self._lock:
            c.outstanding_bytes -= cls
            if c.cached_bytes + cls <= self.max_cached_bytes:
                self._free.setdefault(cls, []).append(block)
                c.cached_bytes += cls

    def take_array(self, shape: tuple[int, ...], dtype: np.dtype | type) -> tuple[torch.Tensor, np.ndarray]:
        """``take`` a block and view its start as a numpy array of ``shape``/``dtype``."""
        dt = np.dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize
        block = self.take(nbytes)
        return block, block.numpy()[:nbytes].view(dt).reshape(shape)

    def lease(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """A numpy array backed by a pooled block that returns when the array and its views are gone."""
        block, array = self.take_array(shape, dtype)
        return np.asarray(_Lease(self, block, array))


class _Lease:
    """Owner of a leased block: numpy views keep it alive; when the last goes, the block returns."""

    __slots__ = ("__array_interface__", "_array", "_block", "_pool")

    def __init__(self, pool: HostBufferPool, block: torch.Tensor, array: np.ndarray) -> None:
        self._pool, self._block, self._array = pool, block, array
        self.__array_interface__ = array.__array_interface__

    def __del__(self) -> None:
        self._pool.give(self._block)


__all__ = ["HostBufferPool", "PoolCounters", "size_class"]
