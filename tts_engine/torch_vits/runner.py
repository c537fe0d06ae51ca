"""Static-shape GPU steps of the VITS engine, each bucket captured once as a CUDA graph.

Two kinds of step, both writing into per-request *slots* of device buffers:

- ``encode``: a batch of new requests (padded to a (batch, phoneme) bucket) goes through
  text encoder, duration predictor and prior expansion; each request's per-frame prior
  sample ``z_p`` lands in ``latents[slot]`` ([F_cap, C], frame-major) and its length in
  ``frames[slot]``. Runs in float32 (durations are rounded up: keep them exact).
- ``decode``: one chunk per request (padded to a batch bucket): window gather, flow and
  decoder in the chosen precision, int16 conversion (``chunked.py``).

On CPU (tests, CI) the same functions run eagerly with the same padding. Slot
``max_slots`` is a scratch slot written by padding entries and never read.
"""

from __future__ import annotations

import bisect
import copy
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tts_engine.torch_vits.chunked import ChunkGeometry, decode_windows, gather_windows, to_int16
from tts_engine.torch_vits.model import Vits

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class RunnerOptions:
    """Static shapes of the engine."""

    #: Frames of a request's first decoder chunk (one frame = hop samples).
    chunk_frames: int = 64
    #: Largest later chunk (0: same as ``chunk_frames``); later chunks take sizes
    #: ``chunk_frames * 2**k`` up to this, the last one the smallest that covers the rest.
    #: Bigger chunks spend less of their work on context frames.
    tail_chunk_frames: int = 0
    #: Longest utterance, frames; longer ones are cut (logged).
    max_frames: int = 3072
    #: Decoder batch sizes captured; the largest is the number of request slots.
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    #: Encoder batch sizes captured.
    encode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    #: Phoneme-id lengths captured; longer inputs are refused.
    phoneme_buckets: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)
    #: Largest batch x phonemes of one encoder launch (bounds the buckets captured).
    max_encode_tokens: int = 16384
    #: "fp32", "bf16" or "fp16" for flow + decoder.
    precision: str = "fp32"
    #: Capture CUDA graphs (CUDA only).
    cuda_graphs: bool = True
    #: Compile the chunk decoder (flow + HiFi-GAN) with ``torch.compile`` before capture (CUDA
    #: only): fuses the elementwise work between convolutions; adds start-up time.
    compile: bool = False

    @property
    def max_slots(self) -> int:
        return max(self.decode_batches)

    @property
    def chunk_sizes(self) -> tuple[int, ...]:
        """Decoder chunk sizes captured, ascending: ``chunk_frames`` doubled up to ``tail_chunk_frames``."""
        sizes, size = [], self.chunk_frames
        while size <= max(self.tail_chunk_frames, self.chunk_frames):
            sizes.append(size)
            size *= 2
        return tuple(sizes)

    def next_chunk(self, done: int, total: int) -> int:
        """Frames of the next chunk of a request with ``done`` of ``total`` frames decoded."""
        if done == 0:
            return self.chunk_frames
        rest = total - done
        return next((c for c in self.chunk_sizes if c >= rest), self.chunk_sizes[-1])

    def encode_buckets(self) -> list[tuple[int, int]]:
        return [(b, t) for b in self.encode_batches for t in self.phoneme_buckets if b * t <= self.max_encode_tokens]


def bucket_for(size: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= ``size``; ValueError when none is."""
    ordered = sorted(buckets)
    i = bisect.bisect_left(ordered, size)
    if i == len(ordered):
        raise ValueError(f"{size} exceeds the largest bucket {ordered[-1]}")
    return ordered[i]


class _Step:
    """A function of fixed-shape tensors; replayed as a CUDA graph when captured."""

    def __init__(self, fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor]) -> None:
        self.fn, self.inputs = fn, inputs
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: torch.Tensor | None = None

    def capture(self, pool: object, warmup: int = 2) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                self.fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.output = self.fn(*self.inputs)

    def __call__(self, *values: torch.Tensor) -> torch.Tensor:
        for dst, src in zip(self.inputs, values):
            dst.copy_(src, non_blocking=True)  # host tensors are pinned on CUDA
        if self.graph is None:
            return self.fn(*self.inputs)
        self.graph.replay()
        assert self.output is not None
        # All graphs share one memory pool: a graph captured earlier may reuse, as scratch,
        # the memory of this graph's output. Copy it out before another graph runs.
        return self.output.clone()


@dataclass(frozen=True)
class EncodeItem:
    """One new request for ``encode``."""

    ids: Sequence[int]
    slot: int
    noise_scale: float
    length_scale: float
    noise_w: float
    speaker_id: int = 0


class StepRunner:
    """Owns the model copies, the slot buffers and one ``_Step`` per bucket."""

    def __init__(self, model: Vits, options: RunnerOptions, device: str | torch.device = "cpu") -> None:
        self.options = options
        self.device = torch.device(device)
        if options.precision not in DTYPES:
            raise ValueError(f"precision must be one of {sorted(DTYPES)}, got {options.precision!r}")
        self.dtype = DTYPES[options.precision]
        self.model = model.to(self.device).float().eval()
        self.synth_model = self.model if self.dtype == torch.float32 else copy.deepcopy(self.model).to(self.dtype)
        self.geometries = {c: ChunkGeometry.for_model(self.model, c) for c in options.chunk_sizes}
        self.geometry = self.geometries[options.chunk_frames]
        c, s = self.model.config, options.max_slots + 1
        self.scratch_slot = options.max_slots
        self.latents = torch.zeros(s, options.max_frames, c.inter_channels, device=self.device)
        self.frames = torch.zeros(s, dtype=torch.long, device=self.device)
        self.speakers = torch.zeros(s, dtype=torch.long, device=self.device)
        self._encode_steps: dict[tuple[int, int], _Step] = {}
        self._decode_steps: dict[tuple[int, int], _Step] = {}  # (chunk frames, batch)
        self.capture_s = 0.0
        self.capture_peak_mb = 0.0
        self._build()

    # ---------------------------------------------------------------- building

    def _build(self) -> None:
        use_graphs = self.options.cuda_graphs and self.device.type == "cuda"
        dev = self.device
        if dev.type == "cuda":
            torch.backends.cudnn.benchmark = True
            # Durations are ceil'd: TF32 in the encoder could change an utterance's length.
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        pool = torch.cuda.graph_pool_handle() if use_graphs else None
        t0 = time.perf_counter()
        # Only the chunk decoder is compiled: the encoder took ~30 s per shape to compile on the
        # H200 for a 1.6x faster step (bench/results/tts_load-h200-*.md), too slow a start-up.
        compiling = self.options.compile and dev.type == "cuda"
        # Largest first: later captures reuse the pool's blocks.
        for b, t in sorted(self.options.encode_buckets(), key=lambda bt: -bt[0] * bt[1]):
            inputs = [
                torch.zeros(b, t, dtype=torch.long, device=dev),
                torch.ones(b, dtype=torch.long, device=dev),
                torch.tensor([[0.0, 1.0, 0.0]] * b, device=dev),
                torch.full((b,), self.scratch_slot, dtype=torch.long, device=dev),
                torch.zeros(b, dtype=torch.long, device=dev),
            ]
            self._encode_steps[(b, t)] = _Step(self._encode_fn, inputs)
        decode_fns = {c: functools.partial(self._decode_fn, g) for c, g in self.geometries.items()}
        if compiling:
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
            decode_fns = {c: torch.compile(fn) for c, fn in decode_fns.items()}
        for chunk in sorted(self.options.chunk_sizes, reverse=True):
            for b in sorted(self.options.decode_batches, reverse=True):
                inputs = [
                    torch.full((b,), self.scratch_slot, dtype=torch.long, device=dev),
                    torch.zeros(b, dtype=torch.long, device=dev),
                    torch.zeros(b, dtype=torch.long, device=dev),
                ]
                self._decode_steps[(chunk, b)] = _Step(decode_fns[chunk], inputs)
                if compiling and b > 1:
                    for tensor in inputs:  # one compiled graph for every batch > 1
                        torch._dynamo.mark_dynamic(tensor, 0)
        if use_graphs:
            with torch.inference_mode():
                for step in [*self._encode_steps.values(), *self._decode_steps.values()]:
                    step.capture(pool)
            torch.cuda.synchronize(dev)
            self.capture_peak_mb = torch.cuda.max_memory_reserved(dev) / 2**20
            torch.cuda.empty_cache()  # drop cuDNN benchmark workspaces; the graphs keep their pool
        self.capture_s = time.perf_counter() - t0
        if use_graphs:
            log.info("captured %d CUDA graphs in %.1f s", len(self._encode_steps) + len(self._decode_steps), self.capture_s)

    def _encode_core(
        self, ids: torch.Tensor, lengths: torch.Tensor, scales: torch.Tensor, sids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids -> per-frame prior sample [B, C, max_frames] and frames [B] (no side effects: compilable)."""
        model = self.model
        g = model.speaker_embedding(sids)
        x, m_p, logs_p, mask = model.encode(ids, lengths)
        w_ceil, frames = model.durations(x, mask, scales[:, 2], scales[:, 1], g=g)
        return model.expand_prior(m_p, logs_p, w_ceil, self.options.max_frames, scales[:, 0]), frames

    def _encode_fn(
        self, ids: torch.Tensor, lengths: torch.Tensor, scales: torch.Tensor, slots: torch.Tensor, sids: torch.Tensor
    ) -> torch.Tensor:
        z_p, frames = self._encode_core(ids, lengths, scales, sids)
        self.latents.index_copy_(0, slots, z_p.transpose(1, 2))
        self.frames.index_copy_(0, slots, frames.clamp_max(self.options.max_frames))
        self.speakers.index_copy_(0, slots, sids)
        return frames

    def _decode_fn(
        self, geometry: ChunkGeometry, slots: torch.Tensor, starts: torch.Tensor, active: torch.Tensor
    ) -> torch.Tensor:
        model = self.synth_model
        frames = self.frames.index_select(0, slots) * active
        z, mask = gather_windows(self.latents, slots, starts, frames, geometry)
        g = model.speaker_embedding(self.speakers.index_select(0, slots))
        g = None if g is None else g.to(self.dtype)
        audio = decode_windows(model, z.to(self.dtype), mask.to(self.dtype), geometry, g)
        return to_int16(audio)

    # ---------------------------------------------------------------- running

    def encode(self, items: Sequence[EncodeItem]) -> torch.Tensor:
        """Queue the encoder step for ``items``; returns frames per item [len(items)] (device, not synced)."""
        n = len(items)
        longest = max(len(it.ids) for it in items)
        t = bucket_for(longest, self.options.phoneme_buckets)
        b = bucket_for(n, [bb for bb, tt in self._encode_steps if tt == t])
        ids = np.zeros((b, t), dtype=np.int64)
        lengths = np.ones(b, dtype=np.int64)
        scales = np.tile(np.array([0.0, 1.0, 0.0], dtype=np.float32), (b, 1))
        slots = np.full(b, self.scratch_slot, dtype=np.int64)
        sids = np.zeros(b, dtype=np.int64)
        for i, it in enumerate(items):
            ids[i, : len(it.ids)] = it.ids
            lengths[i] = len(it.ids)
            scales[i] = (it.noise_scale, it.length_scale, it.noise_w)
            slots[i], sids[i] = it.slot, it.speaker_id
        with torch.inference_mode():
            out = self._encode_steps[(b, t)](*(self._host(a) for a in (ids, lengths, scales, slots, sids)))
        return out[:n]

    def decode(self, slots: Sequence[int], starts: Sequence[int], chunk: int | None = None) -> torch.Tensor:
        """Queue one ``chunk``-frame chunk (default ``chunk_frames``) for each (slot, start frame).

        Returns int16 [len(slots), chunk * hop] on the device (not synced).
        """
        chunk = chunk or self.options.chunk_frames
        n = len(slots)
        b = bucket_for(n, self.options.decode_batches)
        slot_arr = np.full(b, self.scratch_slot, dtype=np.int64)
        start_arr = np.zeros(b, dtype=np.int64)
        active = np.zeros(b, dtype=np.int64)
        slot_arr[:n], start_arr[:n], active[:n] = slots, starts, 1
        with torch.inference_mode():
            out = self._decode_steps[(chunk, b)](*(self._host(a) for a in (slot_arr, start_arr, active)))
        return out[:n]

    def _host(self, array: np.ndarray) -> torch.Tensor:
        """A host tensor to copy into a step's inputs (pinned on CUDA, so the copy is async)."""
        tensor = torch.from_numpy(array)
        return tensor.pin_memory() if self.device.type == "cuda" else tensor

    def max_encode_batch(self, phonemes: int) -> int:
        """Most requests one encoder launch takes when the longest has ``phonemes`` ids."""
        t = bucket_for(phonemes, self.options.phoneme_buckets)
        return max(b for b, tt in self._encode_steps if tt == t)

    def fetch(self, *tensors: torch.Tensor) -> list[np.ndarray]:
        """Copy device results to host (waits for the queued steps)."""
        if self.device.type != "cuda":
            return [t.numpy() for t in tensors]
        host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
        for h, t in zip(host, tensors):
            h.copy_(t, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return [h.numpy() for h in host]

    def memory_mb(self) -> float:
        """Device memory reserved by PyTorch (buffers, graph pools), MiB; 0 on CPU."""
        if self.device.type != "cuda":
            return 0.0
        return torch.cuda.max_memory_reserved(self.device) / 2**20
