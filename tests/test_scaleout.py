"""Scale-out on loopback: 2 real ``voxloop serve`` replicas behind HAProxy (bench/scaleout).

Sessions loop ``x.tts.speak`` through the balancer; the busiest replica is killed
(SIGKILL: a crash), then the other is drained (SIGTERM) in a second round. The killed
replica's clients see the close (1006 / 1001), reconnect through the balancer to the
survivor and are served again; no other session is closed or gets an error.
"""

from __future__ import annotations

import shutil

import pytest

from conftest import scaled

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("haproxy") is None,
                       reason="haproxy not installed (scripts/system-deps.sh installs it)"),
]
SESSIONS = 6


@pytest.fixture(scope="module")
def rows():
    import asyncio

    from bench.scaleout.run import run

    return {r["mode"]: r for r in asyncio.run(run(SESSIONS, ["kill", "term"], after_s=4.0, pause_s=0.3))}


@pytest.mark.parametrize("mode, signal_exit, close_code", [("kill", -9, 1006), ("term", 0, 1001)])
def test_replica_loss_moves_only_its_sessions(rows, mode, signal_exit, close_code):
    r = rows[mode]
    before, after, victim = r["sessions_per_replica_before"], r["sessions_per_replica_after"], r["killed_replica"]
    assert sum(before) == SESSIONS and min(before) >= 1, f"sessions not spread over both replicas: {before}"
    assert r["killed_exit_code"] == signal_exit
    # Exactly the victim's sessions were closed, with the expected code, and came back.
    assert r["moved_sessions"] == before[victim], r
    assert r["close_codes"] == [close_code], r
    assert r["moved_served_after"] == r["moved_sessions"], r
    assert after[1 - victim] == SESSIONS and after[victim] is None, r
    assert r["reconnect_ms_max"] < scaled(5000), r
    # Nobody else noticed: no close, no error, each still served after the kill.
    assert r["untouched_closes"] == 0 and r["errors"] == 0, r
    assert r["untouched_requests_after_kill"] >= r["untouched_sessions"], r
