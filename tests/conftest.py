"""Shared test helpers: timeouts scaled by VOXLOOP_TEST_TIMEOUT_SCALE."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import pytest

TIMEOUT_SCALE = float(os.environ.get("VOXLOOP_TEST_TIMEOUT_SCALE", "1"))

# The GPU engine's default allocator (gpu.allocator = "async"), chosen before any test touches
# CUDA: a test that starts CUDA first would otherwise fix PyTorch's native allocator for the process.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")


def scaled(seconds: float) -> float:
    """A timeout in seconds, scaled for slow machines."""
    return seconds * TIMEOUT_SCALE


async def eventually(predicate: Callable[[], bool], timeout_s: float = 2.0) -> bool:
    """Whether ``predicate()`` turns true within ``timeout_s`` (scaled): for state a worker thread
    updates just after it handed the awaited result over (e.g. its busy count)."""
    deadline = time.monotonic() + scaled(timeout_s)
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


@pytest.fixture(scope="session")
def cfg():
    from base.config import load_config

    return load_config()
