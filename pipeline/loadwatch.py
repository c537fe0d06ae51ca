"""Signs of a saturated server, exported before users feel them.

* ``voxloop_event_loop_lag_seconds`` (histogram): how late a timer that should fire every
  ``interval_s`` actually fires. A loop at 100 % CPU shows lag of several ms and more; every
  message to every client waits that long.
* ``voxloop_outbox_depth_messages`` (gauge histogram, read at scrape): how many messages wait in
  each connection's outbox. A deep outbox is a slow client or a loop that cannot keep up.
* ``voxloop_stage_queue_depth`` (gauge, read at scrape): jobs queued or running per model stage
  (``asr``, ``llm``, ``tts``: worker queues; ``tts_gpu``: requests inside the GPU scheduler).
* ``voxloop_messages_sent`` / ``voxloop_bytes_sent`` (counters by ``kind`` = audio | event):
  ``rate()`` of them is messages and bytes per second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_LAG_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
_DEPTH_BUCKETS = (0, 1, 4, 16, 64, 128, 256, 512)


class SendCounters:
    """Messages and bytes written to sockets, by kind (audio deltas vs other events)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        messages = Counter("voxloop_messages_sent", "WebSocket messages sent", ["kind"], registry=registry)
        sent = Counter("voxloop_bytes_sent", "WebSocket payload bytes sent (before compression)", ["kind"],
                       registry=registry)
        # Children resolved once: the writer counts every message.
        self.audio_messages, self.event_messages = messages.labels("audio"), messages.labels("event")
        self.audio_bytes, self.event_bytes = sent.labels("audio"), sent.labels("event")

    def count(self, frame: str | bytes, audio: bool) -> None:
        # len() of a str counts characters; every JSON frame we send is ASCII but for rare text events.
        if audio:
            self.audio_messages.inc()
            self.audio_bytes.inc(len(frame))
        else:
            self.event_messages.inc()
            self.event_bytes.inc(len(frame))


class LoopLagMonitor:
    """A task that measures how late the event loop runs a periodic timer."""

    def __init__(self, registry: CollectorRegistry, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.lag = Histogram("voxloop_event_loop_lag_seconds",
                             f"Delay of a {interval_s:g} s event-loop timer beyond its due time",
                             buckets=_LAG_BUCKETS_S, registry=registry)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="loop-lag-monitor")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            due = time.perf_counter() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.lag.observe(max(0.0, time.perf_counter() - due))


class QueueDepthCollector(Collector):
    """Outbox depths of all connections and per-stage queue depths, read at each scrape."""

    def __init__(self, outbox_sizes: Callable[[], list[int]], stage_depths: Callable[[], dict[str, int]]) -> None:
        self.outbox_sizes = outbox_sizes
        self.stage_depths = stage_depths

    def collect(self) -> Iterator[Metric]:
        sizes = self.outbox_sizes()
        buckets = [(str(b), sum(1 for s in sizes if s <= b)) for b in _DEPTH_BUCKETS]
        yield GaugeHistogramMetricFamily("voxloop_outbox_depth_messages",
                                         "Messages waiting in each connection's outbox (one observation per connection)",
                                         buckets=[*buckets, ("+Inf", len(sizes))], gsum_value=sum(sizes))
        stage = GaugeMetricFamily("voxloop_stage_queue_depth", "Jobs queued or running per model stage",
                                  labels=["stage"])
        for name, depth in self.stage_depths().items():
            stage.add_metric([name], depth)
        yield stage
