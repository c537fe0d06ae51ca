"""Python's cyclic garbage collector in a serving process: its pauses measured, optionally frozen and held.

A collection holds the GIL: while it runs, no thread of the process moves — not the event loop,
not the GPU scheduler that launches the next step. A full (generation 2) collection walks every
container object alive, and a process with the models loaded holds a great many of them (the GPU
engine process: PyTorch, the voice, the graphs). ``freeze_loaded``
(``server.gc_freeze``, off by default: see its doc in ``base/config.py`` for what the H200
showed) collects once after the models are loaded and moves every survivor to the permanent
generation (``gc.freeze()``), so later collections only walk what serving created.
``IdleCollector`` (``server.gc_full = "idle"``, off by default) keeps the interpreter from starting
full collections and runs them itself while the process has nothing in flight.

``PAUSES`` records every collection's duration per generation (a ``gc.callbacks`` hook: plain
counters, no lock, since the hook can run inside any allocation, even one made while a
Prometheus metric holds its lock). ``/metrics`` exports them as ``voxloop_gc_pause_seconds``
(``pipeline.trace``), for the serving process and, with ``server.front_ends`` > 1, for the
engine process too (its report over the engine link).
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time

log = logging.getLogger(__name__)

#: Upper bounds of the pause histogram's buckets, seconds.
BUCKETS_S = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25)


class GcPauses:
    """Durations of this process's garbage collections, per generation (0, 1, 2)."""

    def __init__(self) -> None:
        self._counts = [[0] * (len(BUCKETS_S) + 1) for _ in range(3)]  # per generation; last: +Inf
        self._sums = [0.0, 0.0, 0.0]
        self._collected = [0, 0, 0]  # unreachable objects freed (cyclic garbage), per generation
        self._started = 0.0
        self._installed = False
        self._lock = threading.Lock()  # install/uninstall only, never in the hook

    def install(self) -> None:
        """Start measuring (idempotent)."""
        with self._lock:
            if not self._installed:
                gc.callbacks.append(self._hook)
                self._installed = True

    def uninstall(self) -> None:
        with self._lock:
            if self._installed:
                gc.callbacks.remove(self._hook)
                self._installed = False

    def _hook(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        seconds = time.perf_counter() - self._started
        generation = min(int(info.get("generation", 2)), 2)
        counts = self._counts[generation]
        for i, bound in enumerate(BUCKETS_S):
            if seconds <= bound:
                counts[i] += 1
                break
        else:
            counts[-1] += 1
        self._sums[generation] += seconds
        self._collected[generation] += int(info.get("collected", 0))

    def snapshot(self) -> dict[str, dict]:
        """``{"0": {"buckets": [count per bucket of BUCKETS_S, then +Inf], "sum": seconds, "collected":
        objects freed}, "1": …, "2": …}`` (counts per bucket, not cumulative; plain data, so it travels
        over the engine link)."""
        return {str(g): {"buckets": list(self._counts[g]), "sum": self._sums[g], "collected": self._collected[g]}
                for g in range(3)}


#: This process's pauses; ``install()``-ed by ``manage`` and by the hub.
PAUSES = GcPauses()


def freeze_loaded(enabled: bool, where: str) -> int:
    """After the models are loaded: with ``enabled`` (``server.gc_freeze``) collect once and
    ``gc.freeze()`` what survived; returns the number of objects frozen (0 when not enabled)."""
    if not enabled:
        return 0
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("%s: %d objects moved out of the garbage collector's reach (gc.freeze, %.0f ms)",
             where, frozen, 1000 * (time.perf_counter() - t0))
    return frozen


#: ``gc.set_threshold``'s third value that keeps the interpreter from starting full collections.
_NEVER = 1 << 30


class IdleCollector:
    """Full (generation 2) collections only while ``busy()`` is false (``server.gc_full = "idle"``).

    Python starts a full collection whenever enough objects have survived into the old
    generation, in the middle of whatever runs: in the GPU engine process it stops the scheduler
    with every request in flight. Here the interpreter keeps its young collections (cheap) but
    never starts a full one; a thread checks every ``check_s`` and runs one when the process is
    idle and one is due by the interpreter's own count (``threshold2`` collections of the middle
    generation since the last full one, 10 by default: as often as Python would run one, not on
    every idle moment), at most every ``min_interval_s`` — and at the latest after
    ``max_interval_s`` even under unbroken load, so reference cycles that reach the old generation
    are still freed.
    """

    def __init__(self, busy, check_s: float = 0.1, min_interval_s: float = 5.0,  # noqa: ANN001
                 max_interval_s: float = 300.0) -> None:
        self.busy = busy
        self.check_s = check_s
        self.min_interval_s = min_interval_s
        self.max_interval_s = max_interval_s
        self.idle_runs = self.forced_runs = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._threshold: tuple[int, int, int] | None = None

    def start(self) -> None:
        self._threshold = gc.get_threshold()
        gc.set_threshold(self._threshold[0], self._threshold[1], _NEVER)
        self._thread = threading.Thread(target=self._run, name="gc-when-idle", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._threshold is not None:
            gc.set_threshold(*self._threshold)

    def due(self) -> bool:
        """A full collection is due: the middle generation was collected ``threshold2`` times since the last."""
        threshold = self._threshold[2] if self._threshold is not None else gc.get_threshold()[2]
        return gc.get_count()[2] >= max(1, threshold)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.check_s):
            since = time.monotonic() - last
            forced = since >= self.max_interval_s
            if not forced:
                if since < self.min_interval_s or not self.due():
                    continue  # too soon, or Python would not run one yet
                try:
                    if self.busy():
                        continue
                except Exception:  # noqa: BLE001 - a stage closing under us: not idle
                    continue
            gc.collect(2)
            last = time.monotonic()
            if forced:
                self.forced_runs += 1
            else:
                self.idle_runs += 1


def manage(cfg, where: str, busy) -> IdleCollector | None:  # noqa: ANN001 - (Config, str, () -> bool)
    """After loading, in each serving process: ``server.switch_interval_ms``, ``server.gc_freeze``, then ``server.gc_full``
    (``"idle"``: an ``IdleCollector`` on ``busy``, returned so the caller can close it); measures
    the process's pauses (``PAUSES``) either way, the freeze's own collection included."""
    PAUSES.install()
    if cfg.server.switch_interval_ms is not None:
        sys.setswitchinterval(cfg.server.switch_interval_ms / 1000)
        log.info("%s: thread switch interval %.2f ms", where, cfg.server.switch_interval_ms)
    freeze_loaded(cfg.server.gc_freeze, where)
    if cfg.server.gc_full != "idle":
        return None
    collector = IdleCollector(busy)
    collector.start()
    log.info("%s: full garbage collections wait until the process is idle (at most %.0f s apart)",
             where, collector.max_interval_s)
    return collector
