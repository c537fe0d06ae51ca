"""Per-turn latency traces and the Prometheus metrics they feed.

A ``TurnTrace`` collects monotonic timestamps (``time.monotonic()`` seconds) as a
turn passes each stage. At turn end it becomes one JSON line (ms relative to the
turn's VAD end decision, plus absolute wall-clock start) and observations in the
stage histograms.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from pipeline import gc_pauses
from pipeline.heap import malloc_heap

#: Stage marks in the order a turn passes them.
STAGES = (
    "speech_start",  # VAD declared speech (start of the voiced frames)
    "speech_end",  # last voiced audio (true end of speech, stream clock)
    "vad_end",  # VAD end decision (silence_duration_ms after speech_end)
    "asr_start",
    "asr_final",
    "llm_start",
    "llm_first_token",
    "first_clause",
    "tts_first_audio",
    "first_audio_sent",
    "playback_start",  # client-reported (x.playback)
    "done",
)

_PART_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


class Metrics:
    """The server's Prometheus metrics (one registry per server, so tests don't collide)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # Several front-end processes (server.front_ends > 1): prometheus_client keeps every value in
        # a file of PROMETHEUS_MULTIPROC_DIR and a scrape of any front end sums them all; collectors
        # that read live objects (queue depths, GPU memory) report the scraped process.
        self._multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self._exposed = CollectorRegistry() if self._multiprocess else r
        if self._multiprocess:
            from prometheus_client.multiprocess import MultiProcessCollector

            MultiProcessCollector(self._exposed)
        self.sessions = Gauge("voxloop_sessions_active", "Open WebSocket sessions", registry=r,
                              multiprocess_mode="livesum")
        self.sessions_total = Counter("voxloop_sessions", "Sessions accepted", registry=r)
        self.rejected = Counter("voxloop_sessions_rejected", "Upgrades refused", ["reason"], registry=r)
        self.turns = Counter("voxloop_turns", "Turns by outcome", ["status"], registry=r)
        self.errors = Counter("voxloop_errors", "Error events sent, by code", ["code"], registry=r)
        self.stage = Histogram(
            "voxloop_stage_seconds",
            "Latency from the VAD end decision (or commit) to each stage",
            ["stage"],
            buckets=_BUCKETS_S,
            registry=r,
        )
        self.voice_to_voice = Histogram(
            "voxloop_voice_to_voice_seconds",
            "End of speech to first reply audio sent",
            buckets=_BUCKETS_S,
            registry=r,
        )
        self.tts_requests = Counter("voxloop_tts_requests", "x.tts.speak requests", registry=r)
        self.tts_first_audio_parts, self.tts_last_audio_parts = (
            Histogram(f"voxloop_tts_{which}_audio_part_seconds",
                      f"x.tts.speak on a batching engine: where the time to its {which} audio goes in the server, "
                      f"by part ({doc})", ["part"], buckets=_PART_BUCKETS_S, registry=r)
            for which, doc in (("first", "pipeline.speech.FIRST_AUDIO_PARTS; they add up to x.tts.done's first_audio_ms"),
                               ("last", "pipeline.speech.LAST_AUDIO_PARTS: the first audio's way in, then the "
                                        "engine to the last chunk and on; they add up to the request's start to its "
                                        "last delta queued")))
        self.audio_sent_s = Counter("voxloop_audio_sent_seconds", "Reply audio sent, seconds", registry=r)
        self.audio_waits_s = Counter("voxloop_audio_wait_seconds",
                                     "Time audio deltas waited for a slow client's outbox to have room, seconds "
                                     "(summed over waiting streams)", registry=r)  # fmt: skip

    def watch_tts_memory(self, report: Callable[[], dict[str, Any] | None]) -> None:
        """Export the GPU TTS engine's memory figures (``CudaTtsEngine.memory_report``), read at each scrape."""
        self.register(_TtsMemoryCollector(report))

    def register(self, collector: Collector) -> None:
        """A collector read at each scrape (live objects of this process)."""
        self._exposed.register(collector)

    def exposition(self) -> bytes:
        """The ``/metrics`` text: every metric (of every front-end process) and the live collectors."""
        return generate_latest(self._exposed)

    def watch_llm(self, report: Callable[[], dict[str, int] | None]) -> None:
        """Export the batched LLM's figures (``BatchedChat.report``, this process's), read at each scrape."""
        self.register(_LlmCollector(report))

    def watch_asr(self, report: Callable[[], dict[str, int] | None]) -> None:
        """Export the ASR's batching (``BatchingAsr``: calls, utterances), read at each scrape."""
        self.register(_AsrCollector(report))

    def watch_gc(self, reports: Callable[[], dict[str, dict]]) -> None:
        """Export garbage-collection pauses (``pipeline.gc_pauses``) per process, read at each scrape."""
        self.register(_GcCollector(reports))

    def watch_process(self) -> None:
        """Export what a leak would grow, read at each scrape: tasks on the event loop (the hub
        answers /metrics there), Python allocator blocks, the C heap (glibc). For bench.soak."""
        self.register(_ProcessCollector())



class _ReportCollector(Collector):
    """Metric families made from a stage's report, read at each scrape (none while it is None)."""

    def __init__(self, report: Callable[[], dict[str, int] | None]) -> None:
        self.report = report

    def collect(self) -> Iterator[Metric]:
        r = self.report()
        if r:
            yield from self.families(r)

    def families(self, r: dict[str, int]) -> Iterator[Metric]:
        raise NotImplementedError


class _LlmCollector(_ReportCollector):
    """The LLM's fixed memory, sequences, batch of the last step and token counters."""

    def families(self, r: dict[str, int]) -> Iterator[Metric]:
        memory = GaugeMetricFamily("voxloop_llm_memory_bytes", "LLM memory fixed at start-up, bytes",
                                   labels=["kind"])
        memory.add_metric(["weights"], r["weights_bytes"])
        memory.add_metric(["kv_cache"], r["kv_bytes"])
        yield memory
        seqs = GaugeMetricFamily("voxloop_llm_sequences", "KV sequences: configured, held by a session",
                                 labels=["state"])
        seqs.add_metric(["configured"], r["sequences"])
        seqs.add_metric(["held"], r["sequences_held"])
        yield seqs
        replies = GaugeMetricFamily("voxloop_llm_replies", "Replies in the engine", labels=["state"])
        replies.add_metric(["running"], r["replies_running"])
        replies.add_metric(["waiting"], r["replies_waiting"])
        yield replies
        batch = GaugeMetricFamily("voxloop_llm_last_batch", "The last llama_decode step", labels=["unit"])
        batch.add_metric(["tokens"], r["last_batch_tokens"])
        batch.add_metric(["sequences"], r["last_batch_sequences"])
        yield batch
        yield CounterMetricFamily("voxloop_llm_steps", "llama_decode steps", value=r["steps"])
        tokens = CounterMetricFamily("voxloop_llm_evaluated_tokens", "Tokens evaluated", labels=["kind"])
        tokens.add_metric(["prompt"], r["prompt_tokens_evaluated"])
        tokens.add_metric(["all"], r["evaluated_tokens"])
        yield tokens
        if "probes_shared" in r:
            probes = CounterMetricFamily("voxloop_llm_end_of_turn_probes", "Words' end-of-turn scores: read from "
                                         "the speculative reply's prompt, or on a sequence of their own", labels=["read"])
            probes.add_metric(["shared"], r["probes_shared"])
            probes.add_metric(["alone"], r["probes_alone"])
            yield probes
            yield CounterMetricFamily("voxloop_llm_end_of_turn_probe_tokens", "Tokens the words' end-of-turn "
                                      "scores read on their own sequence", value=r["probe_tokens_evaluated"])


class _AsrCollector(_ReportCollector):
    """Batched ASR calls and the utterances they carried (their ratio is the mean batch size)."""

    def families(self, r: dict[str, int]) -> Iterator[Metric]:
        yield CounterMetricFamily("voxloop_asr_calls", "Model calls of the ASR (one batch each)", value=r["calls"])
        yield CounterMetricFamily("voxloop_asr_utterances", "Utterances transcribed", value=r["utterances"])
        if r.get("gpu_bytes") is not None:
            yield GaugeMetricFamily("voxloop_asr_gpu_bytes", "GPU memory the ASR took at start-up (model and a "
                                    "warm-up batch of asr.max_batch), bytes", value=r["gpu_bytes"])


class _ProcessCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        try:
            tasks = len(asyncio.all_tasks())
        except RuntimeError:  # scraped off the event loop (a test calling generate_latest)
            tasks = None
        if tasks is not None:
            yield GaugeMetricFamily("voxloop_asyncio_tasks", "Tasks alive on the server's event loop", value=tasks)
        yield GaugeMetricFamily("voxloop_python_allocated_blocks", "Objects allocated by the Python allocator",
                                value=sys.getallocatedblocks())  # fmt: skip
        heap = malloc_heap()
        if heap is not None:
            family = GaugeMetricFamily("voxloop_malloc_heap_bytes", "C heap (glibc malloc): in use, free but kept "
                                       "by the process, mmapped chunks", labels=["kind"])  # fmt: skip
            for kind, value in heap.items():
                family.add_metric([kind], value)
            yield family


class _GcCollector(Collector):
    """``voxloop_gc_pause_seconds{process, generation}`` from ``GcPauses.snapshot()`` per process."""

    def __init__(self, reports: Callable[[], dict[str, dict]]) -> None:
        self.reports = reports

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "voxloop_gc_pause_seconds",
            "Python garbage collections (each holds every thread of its process), seconds, by process and generation",
            labels=["process", "generation"],
        )
        collected = CounterMetricFamily(
            "voxloop_gc_collected_objects",
            "Unreachable objects (reference cycles) the garbage collections freed, by process and generation",
            labels=["process", "generation"],
        )
        for process, snapshot in self.reports().items():
            for generation, figures in snapshot.items():
                cumulative, buckets = 0, []
                for bound, count in zip((*gc_pauses.BUCKETS_S, float("inf")), figures["buckets"], strict=True):
                    cumulative += count
                    buckets.append((floatToGoString(bound), cumulative))
                family.add_metric([process, generation], buckets, figures["sum"])
                collected.add_metric([process, generation], figures["collected"])
        yield family
        yield collected


class _TtsMemoryCollector(Collector):
    """Gauges from a memory report: device pool, per-stage memory and budgets, host buffer pools."""

    def __init__(self, report: Callable[[], dict[str, Any] | None]) -> None:
        self.report = report

    def collect(self) -> Iterator[Metric]:
        r = self.report()
        if not r:
            return
        mib = 2**20
        if r.get("pool"):
            pool = GaugeMetricFamily("voxloop_gpu_pool_bytes", "The process's CUDA memory pool, bytes (stat: current or high-water)",
                                     labels=["kind", "stat"])  # fmt: skip
            p = r["pool"]
            for kind in ("reserved", "used", "graph_reserved"):
                pool.add_metric([kind, "current"], p[kind] * mib)
                pool.add_metric([kind, "high"], p[f"{kind}_high"] * mib)
            yield pool
            yield GaugeMetricFamily(
                "voxloop_gpu_device_used_bytes",
                "Device memory in use by all processes, bytes",
                value=p["device_used"] * mib,
            )
            # With one GPU per replica (CUDA_VISIBLE_DEVICES), used / total is that replica's GPU.
            yield GaugeMetricFamily("voxloop_gpu_device_total_bytes", "Device memory, bytes",
                                    value=p["device_total"] * mib)
        stage = GaugeMetricFamily(
            "voxloop_gpu_stage_bytes",
            "Device memory each TTS stage took at start-up, bytes",
            labels=["stage"],
        )
        for name, mb in r.get("stages_mb", {}).items():
            stage.add_metric([name], mb * mib)
        yield stage
        budget = GaugeMetricFamily(
            "voxloop_gpu_stage_budget_bytes",
            "Configured budget per TTS stage, bytes (0: none)",
            labels=["stage"],
        )
        for name, mb in r.get("budgets_mb", {}).items():
            budget.add_metric([name], mb * mib)
        yield budget
        host = GaugeMetricFamily(
            "voxloop_tts_host_pool_bytes",
            "TTS request buffer pools, bytes",
            labels=["pool", "kind"],
        )
        allocs = CounterMetricFamily(
            "voxloop_tts_host_pool_allocations",
            "Buffers allocated by the pools (misses)",
            labels=["pool"],
        )
        reuses = CounterMetricFamily(
            "voxloop_tts_host_pool_reuses",
            "Buffers reused from the pools (hits)",
            labels=["pool"],
        )
        for name, c in r.get("host_pools", {}).items():
            for kind in ("outstanding", "cached", "high_water"):
                host.add_metric([name, kind], c[f"{kind}_bytes"])
            allocs.add_metric([name], c["allocations"])
            reuses.add_metric([name], c["reuses"])
        yield from (host, allocs, reuses)
        yield GaugeMetricFamily(
            "voxloop_tts_max_batch",
            "Current GPU batch limit (lowered after out-of-memory)",
            value=r["max_batch"],
        )
        yield CounterMetricFamily(
            "voxloop_tts_gpu_ooms",
            "GPU out-of-memory errors survived by the TTS scheduler",
            value=r["ooms"],
        )


@dataclass
class TurnTrace:
    """Timestamps of one turn. ``mark`` keeps the first time each stage is reached."""

    turn_id: int
    session_id: str
    mode: str  # "server_vad" | "push_to_talk" | "text"
    t: dict[str, float] = field(default_factory=dict)
    info: dict[str, object] = field(default_factory=dict)
    wall_start: float = field(default_factory=time.time)

    def mark(self, stage: str, at: float | None = None) -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}")
        self.t.setdefault(stage, time.monotonic() if at is None else at)

    def origin(self) -> float | None:
        """The reference instant: VAD end decision, else ASR start, else LLM start."""
        for stage in ("vad_end", "asr_start", "llm_start"):
            if stage in self.t:
                return self.t[stage]
        return None

    def relative_ms(self) -> dict[str, float]:
        """Each stage in ms after the origin (negative: it happened before, e.g. speculation)."""
        o = self.origin()
        if o is None:
            return {}
        return {s: round((self.t[s] - o) * 1000, 1) for s in STAGES if s in self.t}

    def summary(self) -> dict[str, object]:
        rel = self.relative_ms()
        out: dict[str, object] = {
            "turn_id": self.turn_id,
            "session_id": self.session_id,
            "mode": self.mode,
            "wall_start": round(self.wall_start, 3),
            "stages_ms": rel,
        }
        if "first_audio_sent" in rel:
            out["processing_ms"] = rel["first_audio_sent"]
        if "speech_end" in self.t and "first_audio_sent" in self.t:
            out["voice_to_voice_ms"] = round((self.t["first_audio_sent"] - self.t["speech_end"]) * 1000, 1)
        out.update(self.info)
        return out


class TraceSink:
    """Appends turn summaries to a JSON-lines file and feeds the histograms."""

    def __init__(self, metrics: Metrics, path: str | None) -> None:
        self.metrics = metrics
        self.path = Path(path) if path else None
        #: Called at each turn's end for GPU memory figures to add to its summary (``gpu``), or None.
        self.gpu_report: Callable[[], dict[str, Any] | None] | None = None
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, trace: TurnTrace, status: str) -> dict[str, object]:
        summary = trace.summary()
        summary["status"] = status
        report = self.gpu_report() if self.gpu_report else None
        if report and report.get("pool"):
            pool = report["pool"]
            summary["gpu"] = {"pool_used_mb": pool["used"], "pool_used_high_mb": pool["used_high"],
                              "graph_reserved_mb": pool["graph_reserved"], "max_batch": report["max_batch"]}  # fmt: skip
        self.metrics.turns.labels(status=status).inc()
        for stage, ms in trace.relative_ms().items():
            if ms >= 0:
                self.metrics.stage.labels(stage=stage).observe(ms / 1000)
        if "voice_to_voice_ms" in summary:
            self.metrics.voice_to_voice.observe(float(summary["voice_to_voice_ms"]) / 1000)  # type: ignore[arg-type]
        if self.path is not None:
            line = json.dumps(summary, separators=(",", ":"))
            with self._lock, open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        return summary
