"""Shared test helpers: timeouts scaled by VOXLOOP_TEST_TIMEOUT_SCALE."""

from __future__ import annotations

import os

import pytest

TIMEOUT_SCALE = float(os.environ.get("VOXLOOP_TEST_TIMEOUT_SCALE", "1"))

# The GPU engine's default allocator (gpu.allocator = "async"), chosen before any test touches
# CUDA: a test that starts CUDA first would otherwise fix PyTorch's native allocator for the process.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")


def scaled(seconds: float) -> float:
    """A timeout in seconds, scaled for slow machines."""
    return seconds * TIMEOUT_SCALE


@pytest.fixture(scope="session")
def cfg():
    from voxloop.config import load_config

    return load_config()
