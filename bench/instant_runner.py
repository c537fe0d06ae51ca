"""An orchestration stand-in for the GPU TTS engine's ``StepRunner``: the real ``BatchScheduler``
(and through ``CudaTtsEngine(runner=...)`` the real server) driven by launches that take no time, a
fixed time per lane, or the time each launch's CUDA graph took on a GPU (``GpuTimes``), on no
device. Used by ``bench.tts_scheduler_host`` and ``bench.served_host`` to measure the host side
alone, and by ``bench.tts_gpu_model`` to run the scheduler against a model of a GPU."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bench.harness import ROOT
from bench.tts_backends import consume
from tts_engine.torch_vits.buffers import HostBufferPool
from tts_engine.torch_vits.chunked import ChunkGeometry, pack_flow
from tts_engine.torch_vits.resample import ChunkResampler
from tts_engine.torch_vits.runner import RunnerOptions, bucket_for, fast_lane_names
from base.config import load_config

HOP = 256
#: Phoneme-id symbols of the sentences' ids (the bundled voice has 256).
SYMBOLS = 256


#: Kinds of graph time keys (``GpuTimes``).
KINDS = ("encode", "first", "decode", "flowed", "flow")


class GpuTimes:
    """Milliseconds of one launch of each CUDA graph as measured on a GPU (``bench.tts_load
    --graph-times``: a result row's ``graph_ms``, keys ``encode <rows> x <phoneme bucket>``,
    ``first <rows> x <frames>`` (a fast lane's first chunks), ``decode <rows> x <frames>`` (the
    main lane's chunks); with ``RunnerOptions.flow_once``, ``flowed <rows> x <frames>`` (its main-lane chunks,
    the decoder alone) and ``flow 1 x <frames>`` (its packed flow launches)), for any padded batch: piecewise linear in rows between the rows
    measured, the last piece extended beyond them. A phoneme bucket or chunk size not measured
    between two measured sizes: the line between their times (a chunk of 96 frames half-way between
    64's and 128's); below every size measured, the smallest one's times; one larger than every size measured, the line
    through the two largest sizes' times extended (in proportion with one size measured); a fast
    lane's chunks larger than every ``first`` key take ``decode``'s. ``scale``: a factor per kind
    (``encode``, ``decode``; ``decode`` also scales ``first``), for what-if runs (0.5: twice as
    fast)."""

    def __init__(self, graph_ms: Mapping[str, float], scale: Mapping[str, float] | None = None) -> None:
        self.graph_ms = dict(graph_ms)
        self.scale = {"encode": 1.0, "decode": 1.0, **(scale or {})}
        self._points: dict[str, dict[int, list[tuple[int, float]]]] = {}
        for key, ms in graph_ms.items():
            try:
                kind, rows, x, size = key.split()
                if x != "x" or kind not in KINDS:
                    raise ValueError
                self._points.setdefault(kind, {}).setdefault(int(size), []).append((int(rows), float(ms)))
            except ValueError:
                raise ValueError(f"graph time key {key!r} is not '<{'|'.join(KINDS)}> <rows> x <size>'") from None
        if "encode" not in self._points or not {"decode", "flowed"} & set(self._points):
            raise ValueError(f"graph times need 'encode' keys and 'decode' or 'flowed' keys: {sorted(graph_ms)}")
        for sizes in self._points.values():
            for points in sizes.values():
                points.sort()

    @property
    def kinds(self) -> set[str]:
        """The kinds of launch measured."""
        return set(self._points)

    def seconds(self, kind: str, rows: int, size: int) -> float:
        """Seconds of one ``kind`` launch (``encode``, ``first``, ``decode``) of ``rows`` padded rows
        of ``size`` (phoneme bucket, or chunk frames)."""
        sizes = self._points.get(kind)
        if (not sizes or size > max(sizes)) and kind == "first":  # a fast lane's size with no "first" keys: the main lane's
            sizes = self._points.get("decode")
        if not sizes:
            raise ValueError(f"no {kind!r} graph times measured (kinds: {sorted(self._points)})")
        largest = max(sizes)
        if size <= largest:
            above = min(s for s in sizes if s >= size)
            below = max((s for s in sizes if s < size), default=None)
            ms = self._row_ms(sizes[above], rows)
            if below is not None and above != size:  # between two sizes measured: the line between them
                m0 = self._row_ms(sizes[below], rows)
                ms = m0 + (size - below) * (ms - m0) / (above - below)
        elif len(sizes) == 1:  # larger than measured, one size: in proportion to it
            ms = self._row_ms(sizes[largest], rows) * size / largest
        else:  # larger than measured: the line through the two largest sizes, extended
            below = max(s for s in sizes if s < largest)
            m0, m1 = self._row_ms(sizes[below], rows), self._row_ms(sizes[largest], rows)
            ms = m1 + (size - largest) * (m1 - m0) / (largest - below)
        return ms / 1000 * self.scale["encode" if kind == "encode" else "decode"]

    @staticmethod
    def _row_ms(points: list[tuple[int, float]], rows: int) -> float:
        """Milliseconds at ``rows`` padded rows: linear between the rows measured, the last piece extended."""
        if len(points) == 1:
            return points[0][1]
        i = next((i for i in range(1, len(points) - 1) if rows <= points[i][0]), len(points) - 1)
        (r0, m0), (r1, m1) = points[i - 1], points[i]
        return m0 + (max(rows, points[0][0]) - r0) * (m1 - m0) / (r1 - r0)


class SharedGpu:
    """Launches of several lanes (CUDA streams) on one modeled GPU, in ``perf_counter()`` time.

    Each lane runs its launches in order; a launch starts once the one before it on its lane and
    the launches it waits for (``after``) are done. The launches running at once share the GPU:
    with ``k`` of them each goes at ``min(1, capacity / k)`` of its own speed (``capacity`` 1: they
    take turns, the GPU's work takes as long as one launch after another; ``capacity`` >= the
    lanes: each at full speed, as if alone). Times advance on each query, so an end that later
    launches slow down is seen as it happens."""

    def __init__(self, lanes: Sequence[str], capacity: float) -> None:
        if not capacity > 0:
            raise ValueError(f"capacity must be > 0, got {capacity}")
        self.capacity = capacity
        # per lane: [lane, launch number, seconds of work left, marks it waits for], oldest first
        self._queued: dict[str, collections.deque[list]] = {lane: collections.deque() for lane in lanes}
        self._numbered = dict.fromkeys(lanes, 0)  # launches queued per lane so far
        self._finished = dict.fromkeys(lanes, 0)  # of them, done
        self._now = time.perf_counter()
        #: Seconds so far in which at least one launch ran (the rest the GPU stood idle).
        self.busy_s = 0.0

    def launch(self, lane: str, seconds: float, after: Sequence[tuple[str, int]] = ()) -> None:
        self._advance(time.perf_counter())
        self._numbered[lane] += 1
        self._queued[lane].append([lane, self._numbered[lane], seconds, list(after)])

    def mark(self, lane: str) -> tuple[str, int]:
        return lane, self._numbered[lane]

    def busy_until_now(self) -> float:
        """``busy_s`` with the GPU's time advanced to now."""
        self._advance(time.perf_counter())
        return self.busy_s

    def done(self, mark: tuple[str, int]) -> bool:
        self._advance(time.perf_counter())
        lane, number = mark
        return self._finished[lane] >= number

    def end(self, mark: tuple[str, int]) -> float:
        """When the launches up to ``mark`` are done if nothing more is queued (``perf_counter()``)."""
        self._advance(time.perf_counter())
        lane, number = mark
        saved = ({k: collections.deque([list(x) for x in q]) for k, q in self._queued.items()}, dict(self._finished),
                 self._now, self.busy_s)  # fmt: skip
        try:
            while self._finished[lane] < number:
                if not self._step(float("inf")):
                    raise RuntimeError(f"launch {mark} can never run")  # it waits for nothing queued
            return self._now
        finally:
            self._queued, self._finished, self._now, self.busy_s = saved

    def _advance(self, to: float) -> None:
        while self._now < to and self._step(to):
            pass
        self._now = max(self._now, to)

    def _step(self, to: float) -> bool:
        """Run the GPU until ``to`` or the next launch ends, whichever is first; False if none runs."""
        heads = (q[0] for q in self._queued.values() if q)
        running = [h for h in heads if all(self._finished[lane] >= n for lane, n in h[3])]
        if not running:
            return False
        rate = min(1.0, self.capacity / len(running))
        step = min(min(h[2] for h in running) / rate, to - self._now)
        self._now += step
        self.busy_s += step
        for h in running:
            h[2] -= step * rate
            if h[2] <= 1e-12:
                self._queued[h[0]].popleft()
                self._finished[h[0]] = h[1]
        return True


@dataclass(frozen=True)
class FlowCost:
    """How a decoder graph's time splits between the flow and the decoder, for ``RunnerOptions.flow_once``
    (whose main-lane graphs run the decoder alone and whose packed flow launches were not measured):
    the flow's GPU time per frame is ``ratio`` x the decoder's, so a graph of flow window ``W_f`` and
    decoder window ``W_d`` frames spends ``ratio W_f / (ratio W_f + W_d)`` of its time in the flow.
    Contexts in frames (the voice's): the flow's and the decoder's, and ``conv_radius`` (the flow's
    gap between packed utterances). ``ratio`` None: graph times measured with ``flow_once`` say it
    (``flowed`` and ``flow`` keys); the contexts still lay out the packed launches."""

    ratio: float | None
    flow_context: int
    dec_context: int
    conv_radius: int

    def flow_share(self, geometry: ChunkGeometry) -> float:
        """The flow's share of a windowed chunk's graph time."""
        if self.ratio is None:
            raise ValueError("no flow cost ratio")
        flow = self.ratio * geometry.window_frames
        return flow / (flow + geometry.decoder_frames)


class InstantRunner:
    """Stands in for ``StepRunner``: every encoder launch says each sentence's ``frames`` frames
    (a number, or a function of its phoneme ids), every decode returns silence, in rows shaped
    as the real runner's (resampled rows when ``options.output_rate`` differs from
    ``options.voice_rate``). ``launch_s`` = 0 and no ``gpu_times``: nothing is ever busy; else
    each launch keeps its lane busy ``launch_s`` seconds, or the time ``gpu_times`` gives its
    padded batch, after the lane's previous one ends (a lane's launches run one after another,
    lanes side by side, as CUDA streams), so steps gather as many rows as a GPU of those launch
    times lets them. ``gpu_capacity``: the lanes share one GPU (``SharedGpu``) that does at most
    that many launches' work at once (1: no overlap; lanes side by side is the bound above what a
    GPU's streams overlap). ``gpu_s``: modeled GPU seconds queued so far. ``flow_cost``: needed for
    ``options.flow_once`` with ``gpu_times`` (``FlowCost``): its main-lane chunks take the measured
    graph's time less the flow's share, and each packed flow launch the flow's time per frame in
    the largest chunk measured at its largest batch, times its frames."""

    def __init__(self, options: RunnerOptions, frames: int | Callable[[np.ndarray], int], launch_s: float = 0.0,
                 gpu_times: GpuTimes | None = None, gpu_capacity: float | None = None,
                 flow_cost: FlowCost | None = None) -> None:  # fmt: skip
        priced = flow_cost is not None and flow_cost.ratio is not None
        if options.flow_once and gpu_times is not None and not priced and not {"flowed", "flow"} <= gpu_times.kinds:
            raise ValueError("flow_once with graph times of windowed chunks needs a flow_cost: the graphs measured "
                             "include each chunk's flow")  # fmt: skip
        self.flow_cost = flow_cost
        self.options = options
        self.device = torch.device("cpu")
        self.fast_lanes = fast_lane_names(options.fast_lanes)
        self.lanes = (*self.fast_lanes, "main")
        self.geometry = ChunkGeometry(options.chunk_frames, 0, 0, HOP)
        rate = options.voice_rate or 1
        self.resampler = ChunkResampler(rate, options.output_rate or rate, HOP)
        self.host_pool = HostBufferPool(pinned=False)
        self.stage_bytes: dict[str, int] = {}
        self.frames = frames
        self.launch_s = launch_s
        self.gpu_times = gpu_times
        self.gpu_s = 0.0
        self._free_at = dict.fromkeys(self.lanes, 0.0)  # perf_counter() when each lane's last launch ends
        self._gpu = None if gpu_capacity is None else SharedGpu(self.lanes, gpu_capacity)
        #: The encoder's batch buckets captured per phoneme bucket (``RunnerOptions.encode_buckets``).
        self._encode_batches: dict[int, list[int]] = {}
        for b, t in options.encode_buckets():
            self._encode_batches.setdefault(t, []).append(b)
        self._audio = {c: np.zeros((options.max_slots, self.resampler.row_samples(c)), np.int16)
                       for c in options.chunk_sizes}  # fmt: skip

    @property
    def busy_s(self) -> float | None:
        """Seconds so far in which the shared GPU ran a launch (None without one: lanes side by side)."""
        return None if self._gpu is None else self._gpu.busy_until_now()

    def _launch(self, lane: str, kind: str, rows: int, size: int, after: Sequence[float | None] = (),
                scale: float = 1.0) -> None:  # fmt: skip
        """Keep ``lane`` busy for a launch of ``rows`` rows of ``size`` (phoneme ids or frames),
        started once the lane and the work before ``after`` (``mark``s of other lanes) are done;
        ``scale``: a share of the measured graph's time."""
        if self.gpu_times is not None:
            self._launch_s(lane, self.gpu_times.seconds(kind, rows, size) * scale, after)
        elif self.launch_s:
            self._launch_s(lane, self.launch_s, after)

    def _launch_s(self, lane: str, seconds: float, after: Sequence[float | None] = ()) -> None:
        self.gpu_s += seconds
        marks = [e for e in after if e is not None]
        if self._gpu is not None:
            self._gpu.launch(lane, seconds, marks)
            return
        self._free_at[lane] = max(time.perf_counter(), self._free_at[lane], *marks) + seconds

    def _frames(self, ids: np.ndarray) -> int:
        return self.frames if isinstance(self.frames, int) else self.frames(ids)

    def max_encode_batch(self, phonemes: int) -> int:
        return max(self._encode_batches[bucket_for(phonemes, self.options.phoneme_buckets)])

    def encode(self, items, lane: str = "fast") -> np.ndarray:
        """The host side of ``StepRunner.encode``: each item's ids copied into a padded row."""
        ids = np.zeros((len(items), max(len(it.ids) for it in items)), np.int64)
        for row, it in zip(ids, items):
            row[: len(it.ids)] = it.ids
        bucket = bucket_for(ids.shape[1], self.options.phoneme_buckets)
        self._launch(lane, "encode", bucket_for(len(items), self._encode_batches[bucket]), bucket)
        return np.array([self._frames(it.ids) for it in items])

    def decode(self, slots, starts, chunk=None, lane: str = "main", after=(), ahead: bool = False) -> np.ndarray:
        """Silence, once the lane and the work before ``after`` are done."""
        chunk = chunk or self.options.chunk_frames
        kind, scale = "decode" if lane == "main" else "first", 1.0
        if self.options.flow_once and lane == "main" and not ahead:  # the decoder alone
            if self.gpu_times is not None and "flowed" in self.gpu_times.kinds:
                kind = "flowed"
            elif self.flow_cost is not None and self.flow_cost.ratio is not None:
                scale -= self.flow_cost.flow_share(self._windowed(chunk))
        self._launch(lane, kind, bucket_for(len(slots), self.options.decode_batches), chunk, after, scale)
        return self._audio[chunk][: len(slots)]

    def _windowed(self, chunk: int) -> ChunkGeometry:
        """A main-lane chunk's geometry with its flow window (the voice's contexts of ``flow_cost``)."""
        assert self.flow_cost is not None
        return ChunkGeometry(chunk, self.flow_cost.flow_context, self.flow_cost.dec_context, HOP,
                             self.resampler.edge_frames)  # fmt: skip

    def flow(self, segments) -> tuple[int, int, int]:  # noqa: ANN001 - as StepRunner.flow
        """``StepRunner.flow``'s packing; each launch its ``flow`` graph time, or its frames x the flow's
        time per frame (``flow_cost``); with neither, ``launch_s``."""
        o, cost = self.options, self.flow_cost
        flow_context, conv_radius = (cost.flow_context, cost.conv_radius) if cost else (0, 0)
        packs = pack_flow(segments, o.max_frames, o.flow_buckets, flow_context, conv_radius,
                          (cost.dec_context if cost else 0) + self.resampler.edge_frames)  # fmt: skip
        for pack in packs:
            if self.gpu_times is not None and "flow" in self.gpu_times.kinds:
                self._launch_s("main", self.gpu_times.seconds("flow", 1, pack.frames))
            elif self.gpu_times is not None and cost is not None and cost.ratio is not None:
                size, rows = o.chunk_sizes[-1], max(o.decode_batches)
                geometry = self._windowed(size)
                per_frame = (self.gpu_times.seconds("decode", rows, size) * cost.flow_share(geometry)
                             / (rows * geometry.window_frames))  # fmt: skip
                self._launch_s("main", per_frame * pack.frames)
            elif self.launch_s:
                self._launch_s("main", self.launch_s)
        return len(packs), sum(p.frames for p in packs), sum(p.used for p in packs)

    def fetch_async(self, *arrays, lane: str = "main") -> list:
        return list(arrays)

    def busy(self, lane: str) -> bool:
        if self._gpu is not None:
            return not self._gpu.done(self._gpu.mark(lane))
        return time.perf_counter() < self._free_at[lane]

    def wait(self, lane: str) -> None:
        self.wait_event(self.mark(lane))

    def mark(self, lane: str) -> float | tuple[str, int]:
        """The lane's work so far: it ends at this ``perf_counter()`` time (lanes side by side), or
        with the lane's launch so numbered (a shared GPU)."""
        return self._free_at[lane] if self._gpu is None else self._gpu.mark(lane)

    def done(self, event) -> bool:  # noqa: ANN001 - a mark
        if self._gpu is not None:
            return self._gpu.done(event)
        return time.perf_counter() >= event

    def wait_event(self, event) -> None:  # noqa: ANN001 - a mark
        end = event if self._gpu is None else self._gpu.end(event)
        if (left := end - time.perf_counter()) > 0:
            time.sleep(left)

    def take_staged(self, lane: str) -> list:
        return []

    def give_staged(self, blocks: list) -> None:
        pass

    def release_staged(self, lane: str | None = None) -> None:
        pass


def stand_in_engine(cfg, frames, launch_s: float, **runner):  # noqa: ANN001, ANN003, ANN201 - Config -> CudaTtsEngine
    """``cfg``'s ``CudaTtsEngine`` driving an ``InstantRunner`` of ``frames`` frames per sentence and
    ``launch_s`` per launch (``runner``: its other arguments): ``bench.served_host``'s served engine
    and in-process reference alike."""
    from tts_engine.torch_vits.cuda_engine import CudaTtsEngine

    return CudaTtsEngine.from_config(cfg, runner=lambda options: InstantRunner(options, frames, launch_s, **runner))


class StandInEngine:
    """An engine-mode backend (``bench.harness.closed_loop``): ``configs/gpu.toml``'s
    ``CudaTtsEngine`` (with ``overrides``) and a stand-in runner in this process, driven as
    ``bench.tts_load``'s engine mode drives the GPU engine (a thread per client, phoneme ids ready:
    no WebSocket, no text front end, no link)."""

    name = "engine-stand-in"
    info: dict = {}

    def __init__(self, overrides: list[str], frames, launch_s: float, **runner) -> None:  # noqa: ANN001, ANN003
        cfg = load_config(ROOT / "configs" / "gpu.toml", overrides, environ={})
        self.engine = stand_in_engine(cfg, frames, launch_s, **runner)
        self.sample_rate = self.engine.sample_rate

    def speak(self, ids: list[int]) -> tuple[float, int, float]:
        return consume(self.engine.submit(ids), self.sample_rate)

    def peak_vram_mb(self) -> None:
        return None

    def close(self) -> None:
        self.engine.close()
