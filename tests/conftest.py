"""Shared test helpers: timeouts scaled by VOXLOOP_TEST_TIMEOUT_SCALE."""

from __future__ import annotations

import os

import pytest

TIMEOUT_SCALE = float(os.environ.get("VOXLOOP_TEST_TIMEOUT_SCALE", "1"))


def scaled(seconds: float) -> float:
    """A timeout in seconds, scaled for slow machines."""
    return seconds * TIMEOUT_SCALE


@pytest.fixture(scope="session")
def cfg():
    from voxloop.config import load_config

    return load_config()
