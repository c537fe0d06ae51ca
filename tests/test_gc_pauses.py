"""``pipeline.gc_pauses``: the loaded objects leave the collector's reach; every pause is counted."""

from __future__ import annotations

import gc
import time

import pytest

from pipeline import gc_pauses
from pipeline.trace import Metrics


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # the rest of the test session collects as before


def test_freeze_moves_what_is_loaded_out_of_the_collections(unfrozen):
    loaded = [{"weights": [i]} for i in range(50_000)]  # 100 000 containers, like a loaded library
    tracked = len(gc.get_objects())
    frozen = gc_pauses.freeze_loaded(True, "test")
    assert frozen >= 100_000 and gc.get_freeze_count() == frozen
    assert len(gc.get_objects()) <= tracked - 100_000  # a full collection no longer walks them
    assert loaded[-1]["weights"] == [49_999]


def test_freeze_off_leaves_the_collector_alone(unfrozen):
    before = gc.get_freeze_count()
    assert gc_pauses.freeze_loaded(False, "test") == 0
    assert gc.get_freeze_count() == before


def test_every_collection_is_counted_by_generation_and_exported():
    pauses = gc_pauses.GcPauses()
    pauses.install()
    pauses.install()  # idempotent: one hook
    try:
        gc.collect(2)
        before = pauses.snapshot()
        cycle: list = []
        cycle.append(cycle)  # one unreachable reference cycle for the next full collection
        del cycle
        gc.collect(2)
        gc.collect(1)
        after = pauses.snapshot()
    finally:
        pauses.uninstall()
    assert sum(after["2"]["buckets"]) == sum(before["2"]["buckets"]) + 1
    assert sum(after["1"]["buckets"]) == sum(before["1"]["buckets"]) + 1
    assert after["2"]["sum"] > before["2"]["sum"]
    assert after["2"]["collected"] >= before["2"]["collected"] + 1
    assert len(after["0"]["buckets"]) == len(gc_pauses.BUCKETS_S) + 1
    gc.collect(2)
    assert pauses.snapshot() == after  # uninstalled: nothing more counted

    metrics = Metrics()
    metrics.watch_gc(lambda: {"server": after, "engine": before})
    text = metrics.exposition().decode()
    full = sum(after["2"]["buckets"])
    assert f'voxloop_gc_pause_seconds_count{{generation="2",process="server"}} {float(full)}' in text
    assert f'voxloop_gc_pause_seconds_bucket{{generation="2",le="+Inf",process="server"}} {float(full)}' in text
    assert 'voxloop_gc_pause_seconds_sum{generation="0",process="engine"}' in text
    assert f'voxloop_gc_collected_objects_total{{generation="2",process="server"}} {float(after["2"]["collected"])}' in text


def test_the_load_bench_reads_the_pauses_between_two_scrapes():
    from prometheus_client.parser import text_string_to_metric_families

    from bench.tts_load_ws import gc_pauses as bench_gc_pauses

    def scrape(reports: dict) -> dict:
        metrics = Metrics()
        metrics.watch_gc(lambda: reports)
        out: dict = {}
        for family in text_string_to_metric_families(metrics.exposition().decode()):
            for sample in family.samples:
                out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
        return out

    quiet = {str(g): {"buckets": [0] * (len(gc_pauses.BUCKETS_S) + 1), "sum": 0.0, "collected": 0} for g in range(3)}
    busy = {**quiet, "2": {"buckets": [0, 0, 0, 0, 1, 0, 2, 0, 0, 0, 0], "sum": 0.045, "collected": 7}}  # 5, 2x20 ms
    got = bench_gc_pauses(scrape({"engine": quiet}), scrape({"engine": busy}))
    assert got["engine/2"] == {"count": 3, "total_ms": 45.0, "over_5ms": 2, "collected": 7}
    assert got["engine/0"] == {"count": 0, "total_ms": 0.0, "over_5ms": 0, "collected": 0}


def _full_collections(pauses: gc_pauses.GcPauses) -> int:
    return sum(pauses.snapshot()["2"]["buckets"])


def test_full_collections_wait_until_the_process_is_idle():
    pauses = gc_pauses.GcPauses()
    pauses.install()
    busy = [True]
    threshold = gc.get_threshold()
    collector = gc_pauses.IdleCollector(lambda: busy[0], check_s=0.01, min_interval_s=0.0, max_interval_s=60.0)
    collector.start()
    try:
        before = _full_collections(pauses)
        # Enough survivors that the interpreter itself would start full collections.
        kept = [[i] for i in range(300_000)]
        time.sleep(0.2)
        assert _full_collections(pauses) == before, "a full collection ran while busy"
        assert gc.get_count()[2] > 0  # young collections went on
        busy[0] = False
        deadline = time.monotonic() + 5
        while collector.idle_runs == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert collector.idle_runs >= 1 and _full_collections(pauses) > before
        assert collector.forced_runs == 0
        del kept
    finally:
        collector.close()
        pauses.uninstall()
    assert gc.get_threshold() == threshold  # the interpreter's own again


def test_an_idle_process_collects_only_when_python_would():
    """Not on every idle moment: after ``threshold2`` collections of the middle generation, as the
    interpreter itself counts (an idle collection costs the next request its length)."""
    collector = gc_pauses.IdleCollector(lambda: False, check_s=0.01, min_interval_s=0.0, max_interval_s=60.0)
    collector.start()
    try:
        gc.collect(2)
        for _ in range(collector._threshold[2] - 1):
            gc.collect(1)
        time.sleep(0.2)
        assert collector.idle_runs == 0 and not collector.due()
        gc.collect(1)
        deadline = time.monotonic() + 5
        while collector.idle_runs == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert collector.idle_runs == 1
    finally:
        collector.close()


def test_unbroken_load_still_gets_a_full_collection_at_the_latest_interval():
    collector = gc_pauses.IdleCollector(lambda: True, check_s=0.01, min_interval_s=0.0, max_interval_s=0.2)
    collector.start()
    try:
        deadline = time.monotonic() + 5
        while collector.forced_runs == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert collector.forced_runs >= 1 and collector.idle_runs == 0
    finally:
        collector.close()


def test_a_busy_check_that_fails_counts_as_busy():
    def broken() -> bool:
        raise RuntimeError("stage closed")

    collector = gc_pauses.IdleCollector(broken, check_s=0.01, min_interval_s=0.0, max_interval_s=60.0)
    collector.start()
    try:
        [[i] for i in range(20_000)]  # something reaches the old generation
        time.sleep(0.2)
        assert collector.idle_runs == 0
    finally:
        collector.close()


def test_gc_settings_are_checked():
    from base.config import Config
    from base.errors import ConfigError

    cfg = Config()
    assert cfg.server.gc_full == "auto" and cfg.server.gc_freeze is False
    assert cfg.replace("server", gc_full="idle").server.gc_full == "idle"
    with pytest.raises(ConfigError, match="gc_full"):
        cfg.replace("server", gc_full="sometimes")


def test_the_thread_switch_interval_is_set_in_each_serving_process():
    import sys

    from base.config import Config
    from base.errors import ConfigError

    cfg = Config()
    assert cfg.server.switch_interval_ms is None
    for bad in (0.0, 0.01, 101):
        with pytest.raises(ConfigError, match="switch_interval_ms"):
            cfg.replace("server", switch_interval_ms=bad)
    before = sys.getswitchinterval()
    try:
        gc_pauses.manage(cfg, "test", lambda: False)  # unset: Python's own interval stays
        assert sys.getswitchinterval() == before
        gc_pauses.manage(cfg.replace("server", switch_interval_ms=0.5), "test", lambda: False)
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    finally:
        sys.setswitchinterval(before)
