"""bench.scaleout.gpus: the goals of the two-GPU run judged from its rows (pure logic, no server).

The rows are shaped as ``voice_level``, ``voice_kill``, ``run_load`` and ``ReplicaWatch.report``
make them (tests/test_scaleout.py produces real ones on CPU replicas).
"""

from __future__ import annotations

import copy

import pytest

from bench.scaleout.gpus import checks
from bench.scaleout.replicas import split


def _replica(name: str, sessions: float, gpu: str | None) -> dict:
    return {"replica": name, "answered": True, "sessions": sessions,
            "gpu_processes_mib": None if gpu is None else {gpu: 20000.0}}  # fmt: skip


def _level(step: str, talkers: int, p99: float, missed: int = 0, gpus: tuple = ("GPU-a", "GPU-b")) -> dict:
    shares = [talkers, 0] if step == "one" else [talkers / 2, talkers / 2]
    replicas = [_replica(f"r{i}", s, g) for i, (s, g) in enumerate(zip(shares, gpus, strict=True))]
    return {"step": step, "concurrency": talkers, "missed_turns": missed, "processing_p99_ms": p99,
            "replicas": replicas, "sessions_split": split(replicas)}  # fmt: skip


def _run() -> dict:
    kill = {"killed_replica": "r0", "sessions_per_replica_at_kill": {"r0": 100, "r1": 100}, "moved_sessions": 100,
            "moved_first_on_victim": 100, "untouched_on": ["r1"], "moved_reconnected": 100,
            "moved_turns_after_close_missed": 0, "moved_served_after": 98, "errors": [],
            "untouched_missed_turns": 0, "untouched_turns": 300}  # fmt: skip
    return {"levels": [_level("one", 200, 80.0), _level("two", 200, 40.0), _level("two", 400, 85.0)],
            "kill": kill, "tts": [{"step": "one", "qps": 1000.0}, {"step": "two", "qps": 1900.0}]}


def test_a_run_that_meets_every_goal():
    assert checks(_run()) == {
        "no_missed_turns": True, "sessions_split_within_10pct": True,
        "p99_two_gpus_at_2n_within_10pct_of_one_at_n": True, "tts_two_vs_one_at_least_1_8x": True,
        "kill_closes_only_the_victims_sessions": True, "kill_moved_sessions_reconnect_and_are_answered": True,
        "kill_other_replica_misses_no_turn": True, "one_gpu_per_replica": True,
    }  # fmt: skip


def _missed(run: dict) -> set[str]:
    return {goal for goal, ok in checks(run).items() if ok is False}


@pytest.mark.parametrize("spoil, goal", [
    (lambda r: r["levels"][2].update(missed_turns=1), "no_missed_turns"),
    (lambda r: r["levels"][2].update(processing_p99_ms=88.1), "p99_two_gpus_at_2n_within_10pct_of_one_at_n"),
    (lambda r: r["levels"][1].update(sessions_split=0.11), "sessions_split_within_10pct"),
    (lambda r: r["tts"][1].update(qps=1799.0), "tts_two_vs_one_at_least_1_8x"),
    (lambda r: r["kill"].update(moved_sessions=101, moved_reconnected=101), "kill_closes_only_the_victims_sessions"),
    (lambda r: r["kill"].update(untouched_on=["r0", "r1"]), "kill_closes_only_the_victims_sessions"),
    (lambda r: r["kill"].update(moved_reconnected=99), "kill_moved_sessions_reconnect_and_are_answered"),
    (lambda r: r["kill"].update(moved_turns_after_close_missed=1), "kill_moved_sessions_reconnect_and_are_answered"),
    (lambda r: r["kill"].update(untouched_missed_turns=1), "kill_other_replica_misses_no_turn"),
    (lambda r: r["levels"][1]["replicas"][1].update(gpu_processes_mib={"GPU-a": 1.0}), "one_gpu_per_replica"),
    (lambda r: r["levels"][1]["replicas"][1].update(gpu_processes_mib={"GPU-b": 1.0, "GPU-a": 1.0}),
     "one_gpu_per_replica"),
])  # fmt: skip
def test_each_goal_is_missed_on_its_own(spoil, goal):
    run = copy.deepcopy(_run())
    spoil(run)
    assert _missed(run) == {goal}


def test_goals_of_steps_not_run_are_none():
    goals = checks({"levels": [_level("one", 200, 80.0, gpus=(None, None))], "kill": None, "tts": []})
    assert goals["no_missed_turns"] is True
    assert {k for k, v in goals.items() if v is None} == {
        "sessions_split_within_10pct", "p99_two_gpus_at_2n_within_10pct_of_one_at_n", "tts_two_vs_one_at_least_1_8x"}
    assert "kill_closes_only_the_victims_sessions" not in goals and "one_gpu_per_replica" not in goals


def test_split_is_the_largest_distance_from_an_even_share():
    assert split([{"sessions": 110}, {"sessions": 90}]) == 0.1
    assert split([{"sessions": 200}, {"sessions": 0}]) == 1.0
    assert split([{"sessions": 5}, {"sessions": None}]) is None


def test_replica_figures_from_two_reads_of_metrics():
    from bench.scaleout.replicas import replica_figures

    mib = 2**20
    before = {"voxloop_sessions_total": {(): 3.0}, "voxloop_turns_total": {(("status", "completed"),): 10.0}}
    after = {"voxloop_sessions_total": {(): 103.0},
             "voxloop_turns_total": {(("status", "completed"),): 310.0, (("status", "cancelled"),): 2.0},
             "voxloop_gpu_device_used_bytes": {(): 30000 * mib}, "voxloop_gpu_device_total_bytes": {(): 81559 * mib},
             "voxloop_gpu_pool_bytes": {(("kind", "reserved"), ("stat", "current")): 9000 * mib,
                                        (("kind", "reserved"), ("stat", "high")): 11600 * mib},
             "voxloop_llm_memory_bytes": {(("part", "weights"),): 92 * mib, (("part", "kv_cache"),): 11520 * mib}}
    got = replica_figures(before, after)
    assert got == {"answered": True, "sessions": 100.0, "turns": {"completed": 300.0, "cancelled": 2.0},
                   "gpu_device_used_mib": 30000.0, "gpu_device_total_mib": 81559.0, "gpu_tts_pool_reserved_mib": 9000.0,
                   "asr_gpu_mib": None, "llm_memory_mib": {"weights": 92.0, "kv_cache": 11520.0}}  # fmt: skip
    # A replica that did not answer after the run (killed): no figure is made up.
    gone = replica_figures(before, None)
    assert gone["answered"] is False and gone["sessions"] is None and gone["turns"] is None
