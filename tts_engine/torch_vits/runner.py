"""Static-shape GPU steps of the VITS engine, each bucket captured once as a CUDA graph.

Two kinds of step, both writing into per-request *slots* of device buffers:

- ``encode``: a batch of new requests (padded to a (batch, phoneme) bucket) goes through
  text encoder, duration predictor and prior expansion; each request's per-frame prior
  sample ``z_p`` lands in ``latents[slot]`` ([F_cap, C], frame-major) and its length in
  ``frames[slot]``. Runs in float32 (durations are rounded up: keep them exact).
- ``decode``: one chunk per request (padded to a batch bucket): window gather, flow and
  decoder in the chosen precision, int16 conversion (``chunked.py``).

Lanes on CUDA (``fast_lane``): a *fast* lane (a high-priority stream, graphs in a memory pool
of their own) runs the encoder and first chunks of new requests; the ``main`` lane (a
normal-priority stream, its own pool) runs every later chunk. A new request's first audio then
overlaps the long chunks of running requests instead of waiting for them; the GPU favours the
fast lane's kernels. With ``fast_lanes`` > 1 there are that many fast lanes ("fast", "fast1",
...), each with its own graphs, so a request arriving while one fast launch runs starts on
another at once. The lanes touch disjoint slots (a slot is reused only between steps).

On CPU (tests, CI) the same functions run eagerly with the same padding, in call order. Slot
``max_slots`` is a scratch slot written by padding entries and never read.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import dataclasses
import functools
import gc
import logging
import math
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tts_engine.torch_vits.buffers import HostBufferPool
from tts_engine.torch_vits.chunked import (
    ChunkGeometry,
    decode_windows,
    flow_positions,
    gather_windows,
    pack_flow,
    padding_table,
)
from tts_engine.torch_vits.kernels.gemm_conv import use_gemm_convs
from tts_engine.torch_vits.gpu_memory import GpuMemory
from tts_engine.torch_vits.model import Vits
from tts_engine.torch_vits.resample import ChunkResampler
from tts_engine.torch_vits.kernels.fused_attention import ATTENTION_PRODUCTS, TILE as ATTENTION_TILE, parse_tile
from base.config import BATCH_BUCKET_LEVELS, Config, TtsConfig
from base.errors import ConfigError

log = logging.getLogger(__name__)

def fast_lane_names(n: int) -> tuple[str, ...]:
    """Names of ``n`` fast lanes: "fast", "fast1", ..."""
    return tuple("fast" if i == 0 else f"fast{i}" for i in range(n))


#: Values of ``RunnerOptions.fast_lane``.
FAST_LANE_MODES = ("overlap", "exclusive", "off")
#: Most main-lane launches queued at once (``RunnerOptions.main_in_flight``).
MAX_MAIN_IN_FLIGHT = 4
#: ``RunnerOptions.encoder_convs`` values: the fp32 encoder's convolutions through cuDNN or as cuBLAS products.
ENCODER_CONVS = ("cudnn", "gemm")

#: Float dtype of flow + decoder per precision (``base.config.PRECISIONS``); "int8": int8 decoder
#: convolutions (``int8.py``), the rest fp16 (float32 on CPU).
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.float16}

#: The engine's forms that have one measured best value: not configuration keys, but what
#: ``RunnerOptions.from_config`` builds the engine with (the fields' own defaults are the forms the CPU
#: tests and the benches' baselines build, mostly the plain ones). docs/benchmarks.md has every measurement.
SHIPPED = {
    # New requests' encoder and first chunk on high-priority streams beside the later chunks of running
    # ones: H200, 50 clients served 589 vs 512 sentences/s, sentence p99 126 vs 145 ms
    # (991d8fd:bench/results/tts_load-h200-2026-12-02-fast-lane.md); "exclusive" and "off" were slower.
    "fast_lane": "overlap",
    # The flow once over the rest of each utterance instead of over every later chunk's window: the same
    # audio, H100 at 50 clients 1758 vs 1639-1643 sentences/s (2239fba:bench/results/tts_load-h100-2026-12-05-flowonce.md).
    "flow_once": True,
    # A request's later chunks all in the next step once its length is known: H200, 50 clients, engine
    # 790 vs 762 sentences/s, served 739 vs 661 (6e26840:bench/results/tts_load-h200-2026-12-03-steps.md).
    "chunks_per_step": 0,
    # Two main-lane launches queued at once: H200, 50 clients, engine 852 vs 768 sentences/s, served 801
    # vs 719; three no better (0e31f7b:bench/results/tts_load-h200-2026-12-03-inflight.md).
    "main_in_flight": 2,
    # The encoder's convolutions as cuBLAS products: H200, 836 vs 836 sentences/s, start-up 9.6 vs 17.9 s,
    # 14 vs 89 GB held while capturing (379e54f:bench/results/tts_load-h200-2026-12-03-gemm.md). cuDNN's
    # algorithms then stay untimed (``cudnn_benchmark`` off: the decoder as fast, 852 vs 844 sentences/s,
    # 0e31f7b:bench/results/tts_load-h200-2026-12-03-inflight.md).
    "encoder_convs": "gemm",
    # The decoder's upsampling as polyphase convolutions (cuDNN's transposed convolutions took 65 % of a
    # 48-row decode step): H200, 50 clients 727 vs 556 sentences/s with the fused blocks
    # (bc7e228:bench/results/tts_load-h200-2026-12-03-poly.md).
    "polyphase": True,
}
#: With ``tts.triton_kernels``: the hand-written kernels (``RunnerOptions`` fields) and the precisions they
#: take (None: every one), each measured faster than PyTorch's form at 50 clients: the residual blocks
#: (with the polyphase upsampling) 727 vs 556 sentences/s on the H200 (1c389b4:bench/results/tts_load-h200-2026-12-03-poly.md);
#: the decoder's other convolutions and the flow's WaveNet layers served 998 vs 842
#: (f323a0e:bench/results/tts_load-h200-2026-12-04-fused.md); the duration predictor 931 vs 839
#: (eeced57:bench/results/tts_load-h200-2026-12-03-gemm.md); the text encoder's feed-forward 1316 / 1184 vs
#: 1094 / 1091 and the prior 1125 vs 1082 (36dc67d:bench/results/tts_load-h200-2026-12-04-encoder.md); the
#: attention served 1840 vs 1705 on an H100 (24d80cc:bench/results/tts_load-h100-2026-12-05-fusedattn.md).
TRITON_KERNELS = {
    "fused_blocks": ("fp16", "bf16"),
    "fused_upsampling": ("fp16", "bf16"),
    "fused_flow": ("fp16", "bf16"),
    "fused_duration_predictor": None,
    "fused_text_encoder": None,
    "fused_prior": None,
    "fused_attention": None,
}


def batch_buckets(max_batch: int, level: str = "fine") -> tuple[int, ...]:
    """Batch sizes up to ``max_batch`` (with ``max_batch``): ``coarse``, the powers of two (a batch
    padded by up to 49 %: 65 rows to 128); ``fine``, also every multiple of 8 up to 64 and
    of 16 beyond (15 sizes at 128; 9 rows still padded to 16, beyond 16 at most 29 %); ``finer``,
    every size up to 8, then steps of an eighth of the next power of two (10, 12, 14, 16, 20, 24,
    28, 32, 40, ...: at most 19 %, 24 sizes at 128)."""
    if level not in BATCH_BUCKET_LEVELS:
        raise ValueError(f"batch bucket level must be one of {BATCH_BUCKET_LEVELS}, got {level!r}")
    sizes, p = {max_batch}, 1
    while p <= max_batch:
        sizes.add(p)
        p *= 2
    if level == "fine":
        sizes.update(b for b in range(8, max_batch + 1, 8) if b <= 64 or b % 16 == 0)
    elif level == "finer":
        sizes.update(b for b in range(1, max_batch + 1) if b <= 8 or b % max(1, (1 << (b - 1).bit_length()) // 8) == 0)
    return tuple(sorted(sizes))


@dataclass(frozen=True)
class RunnerOptions(TtsConfig):
    """The engine's settings: the configuration's ``[tts]`` (inherited from ``base.config.TtsConfig``, the
    one source of every operator setting, validated there), the static shapes derived from it at
    start-up and, declared here, the engine's forms (``SHIPPED``, ``TRITON_KERNELS``)."""

    #: ``TtsConfig.backend``: these are the cuda backend's options whoever builds them.
    backend: str = "cuda"
    #: Decoder batch sizes captured; the largest is the number of request slots.
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    #: Encoder batch sizes captured.
    encode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    #: Largest batch x phonemes of one encoder launch (bounds the buckets captured).
    max_encode_tokens: int = 16384
    #: Device memory budgets of the stages, MiB (0: none; ``base.config.GpuConfig``'s ``tts_*_budget_mb``):
    #: weights + slot buffers, encoder graphs, decoder graphs. Enforced at start-up on CUDA.
    state_budget_mb: int = 0
    encode_budget_mb: int = 0
    decode_budget_mb: int = 0
    #: The voice's rate, Hz (0: unknown; needed with ``output_rate``): the decoder steps resample from it
    #: on the device (``resample.ChunkResampler``), the chunks still joining into the whole utterance's
    #: audio resampled at once.
    voice_rate: int = 0
    #: Let cuDNN time its algorithms for every captured shape at start-up (off in ``SHIPPED``'s engine;
    #: on the H200 ~20 % faster decode steps at batch 8 before the fused kernels, start-up 21 s instead
    #: of 3 s for 24 graphs, minutes with the async allocator).
    cudnn_benchmark: bool = False
    #: With ``cudnn_benchmark``: most cuDNN algorithms timed per convolution shape
    #: (``torch.backends.cudnn.benchmark_limit``; 0 = every one cuDNN offers). PyTorch's default: 10.
    cudnn_benchmark_limit: int = 10
    #: With ``cudnn_benchmark``: the stages whose convolutions are timed when their graphs are captured
    #: ("encode", "decode"); the others take cuDNN's heuristic choice. Eager: every stage is timed.
    cudnn_benchmark_stages: tuple[str, ...] = ("encode", "decode")
    #: CUDA: encoder + first chunks on high-priority streams beside the later chunks (see above):
    #: "overlap": the lanes run side by side; "exclusive": the main lane holds its next launch while a
    #: fast-lane launch runs (it still overlaps the main launch already running); "off": one stream,
    #: every step in order (``fast_lanes`` 1).
    fast_lane: str = "overlap"
    #: Later chunks of one request queued in one main-lane step (0: all it has left). Chunks read
    #: only the request's latents, so they need not wait for each other: fewer steps per request,
    #: the same audio; a request cancelled mid-way has had more of its audio decoded.
    chunks_per_step: int = 1
    #: Main-lane launches queued at once (1..``MAX_MAIN_IN_FLIGHT``): with more than one, later
    #: chunks that become ready while a main launch runs are queued behind it at once instead of
    #: after its hand-out, so the main stream does not wait for the host between launches.
    main_in_flight: int = 1
    #: The main lane's chunks read the flow's output, computed once per utterance on the main lane
    #: (``chunked.pack_flow``: the utterances of a launch end to end in rows of ``flow_buckets``
    #: frames) instead of each chunk running the flow over its own window with 32 frames of context on
    #: each side. First chunks (fast lanes) and chunks decoded ahead keep their windows. Needs a fast lane.
    flow_once: bool = False
    #: Decoder upsampling as plain convolutions to stride x channels, interleaved
    #: (``decoder.PolyphaseUp``): the same sums; cuDNN's transposed convolutions are slow here.
    polyphase: bool = False
    #: CUDA, fp16/bf16: the decoder's residual blocks as fused Triton kernels (``fused_resblock``).
    fused_blocks: bool = False
    #: CUDA, fp16/bf16: the decoder's input, upsampling and output convolutions as fused Triton
    #: kernels (``fused_upsample``).
    fused_upsampling: bool = False
    #: CUDA, fp16/bf16: the flow's WaveNet layers as fused Triton kernels (``fused_flow``).
    fused_flow: bool = False
    #: The (fp32) encoder's convolutions (``ENCODER_CONVS``): "cudnn" (``nn.Conv1d``) or "gemm"
    #: (``gemm_conv``: cuBLAS products and multiply-adds, no cuDNN: nothing for cuDNN to time or hold
    #: workspace for).
    encoder_convs: str = "cudnn"
    #: CUDA: the stochastic duration predictor's layers and spline flows as fused Triton kernels
    #: (``fused_duration``): ~400 fewer kernels per encoder launch, the same fp32 arithmetic.
    fused_duration_predictor: bool = False
    #: CUDA: the text encoder's feed-forward layers with their mask, padding, tap stacking, bias and
    #: ReLU as one Triton kernel per convolution (``fused_ffn``) in ``text_encoder_products``.
    fused_text_encoder: bool = False
    #: CUDA: the prior's expansion to frames written straight into the slot latents by one Triton
    #: kernel (``fused_prior``): the same latents, bit for bit.
    fused_prior: bool = False
    #: CUDA: the text encoder's relative-position attention between its convolutions as one Triton
    #: kernel per layer (``fused_attention``) in ``text_encoder_products``' precision (a tensor-core one),
    #: skipping what lies past each sentence's end; the states within fp32 rounding.
    fused_attention: bool = False
    #: With ``fused_attention``: its kernel's program (``fused_attention.parse_tile``; default ``TILE``,
    #: the fastest on an H100).
    fused_attention_tile: str = ATTENTION_TILE

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fast_lane not in FAST_LANE_MODES:
            raise ValueError(f"fast_lane must be one of {FAST_LANE_MODES}, got {self.fast_lane!r}")
        if self.fast_lanes > 1 and self.fast_lane != "overlap":
            raise ValueError(f"fast_lanes > 1 needs fast_lane 'overlap'; got {self.fast_lanes} with {self.fast_lane!r}")
        if self.flow_once and self.fast_lane == "off":
            raise ValueError("flow_once needs a fast lane (the first chunks keep their flow windows there)")
        if self.chunks_per_step < 0:
            raise ValueError(f"chunks_per_step must be >= 0 (0: all), got {self.chunks_per_step}")
        if not 1 <= self.main_in_flight <= MAX_MAIN_IN_FLIGHT:
            raise ValueError(f"main_in_flight must be 1..{MAX_MAIN_IN_FLIGHT}, got {self.main_in_flight}")
        if self.encoder_convs not in ENCODER_CONVS:
            raise ValueError(f"encoder_convs must be one of {ENCODER_CONVS}, got {self.encoder_convs!r}")
        if self.fused_attention and self.text_encoder_products not in ATTENTION_PRODUCTS:
            raise ValueError(f"fused_attention needs tensor-core text_encoder_products ({', '.join(ATTENTION_PRODUCTS)}), got "
                             f"{self.text_encoder_products!r}: fp32 products on the CUDA cores make its kernel slow")  # fmt: skip
        parse_tile(self.fused_attention_tile)
        if self.cudnn_benchmark_limit < 0 or not set(self.cudnn_benchmark_stages) <= {"encode", "decode"}:
            raise ValueError("cudnn_benchmark_limit must be >= 0 and cudnn_benchmark_stages 'encode' and/or 'decode', "
                             f"got {self.cudnn_benchmark_limit} and {self.cudnn_benchmark_stages}")  # fmt: skip

    @classmethod
    def from_config(cls, cfg: Config, voice_rate: int = 0) -> RunnerOptions:
        """The engine of ``cfg``: its ``[tts]`` as is, the batch sizes its bucket levels capture, the
        ``[gpu]`` budgets, the ``SHIPPED`` forms and, with ``tts.triton_kernels``, every kernel of
        ``TRITON_KERNELS`` that takes ``tts.precision`` (the attention: with tensor-core products)."""
        tts, gpu = cfg.tts, cfg.gpu
        kernels = {name: tts.triton_kernels and (precisions is None or tts.precision in precisions)
                   for name, precisions in TRITON_KERNELS.items()}  # fmt: skip
        kernels["fused_attention"] = kernels["fused_attention"] and tts.text_encoder_products in ATTENTION_PRODUCTS
        fields = {f.name: getattr(tts, f.name) for f in dataclasses.fields(TtsConfig)}
        return cls(**fields, **SHIPPED, **kernels, voice_rate=voice_rate,
                   decode_batches=batch_buckets(tts.max_batch, tts.batch_buckets),
                   encode_batches=batch_buckets(tts.max_batch, tts.encode_batch_buckets),
                   state_budget_mb=gpu.tts_state_budget_mb, encode_budget_mb=gpu.tts_encode_budget_mb,
                   decode_budget_mb=gpu.tts_decode_budget_mb)  # fmt: skip

    @functools.cached_property  # asked for per main launch by the scheduler; the options are frozen
    def flow_buckets(self) -> tuple[int, ...]:
        """Frames of the packed flow launches captured (``flow_once``): multiples of 512 up to the
        larger of 4096 and what holds the longest utterance with its context and gap."""
        largest = max(4096, -(-(self.max_frames + 64) // 512) * 512)
        return tuple(range(512, largest + 1, 512))

    @property
    def compiles(self) -> bool:
        """Anything goes through ``torch.compile`` (on CUDA; ignored elsewhere)."""
        return self.compile or self.compile_encoder

    @property
    def fused_kernels(self) -> bool:
        """Any of the hand-written Triton kernels (fused blocks, upsampling, flow, duration predictor, text
        encoder, prior, attention) is on."""
        return (self.fused_blocks or self.fused_upsampling or self.fused_flow or self.fused_duration_predictor
                or self.fused_text_encoder or self.fused_prior or self.fused_attention)

    @property
    def max_slots(self) -> int:
        return max(self.decode_batches)

    @functools.cached_property  # asked for per chunk by the scheduler; the options are frozen
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

    def chunk_plan(self, total: int) -> list[tuple[int, int]]:
        """(start frame, chunk frames) of each chunk of a ``total``-frame utterance, in order
        (``next_chunk`` from frame 0; the last chunk may reach past the end)."""
        plan, done = [], 0
        while done < total:
            plan.append((done, self.next_chunk(done, total)))
            done += plan[-1][1]
        return plan

    def encode_buckets(self) -> list[tuple[int, int]]:
        return [(b, t) for b in self.encode_batches for t in self.phoneme_buckets if b * t <= self.max_encode_tokens]


def _check_budget(stage: str, used: int, budget_mb: int) -> None:
    """ConfigError when a stage's ``used`` bytes exceed its budget (``gpu.tts_<stage>_budget_mb``; 0: none)."""
    if budget_mb and used > budget_mb * 2**20:
        raise ConfigError(f"tts {stage} stage needs {used / 2**20:.0f} MiB of GPU memory; gpu.tts_{stage}_budget_mb = {budget_mb}")


def bucket_for(size: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= ``size``; ValueError when none is."""
    ordered = sorted(buckets)
    i = bisect.bisect_left(ordered, size)
    if i == len(ordered):
        raise ValueError(f"{size} exceeds the largest bucket {ordered[-1]}")
    return ordered[i]


class _Step:
    """A function of fixed-shape tensors; replayed as a CUDA graph when captured."""

    def __init__(self, fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], pool: object = None,
                 capture_stream: torch.cuda.Stream | None = None) -> None:
        """``pool``: the graph memory pool of its lane (graphs of one pool must run in order);
        ``capture_stream``: its lane's capture stream. PyTorch keeps a cuBLAS workspace per
        (handle, stream) and a graph bakes in the one of the stream it was captured on: graphs
        that may run at the same time (different lanes) must be captured on different streams."""
        self.fn, self.inputs, self.pool, self.capture_stream = fn, inputs, pool, capture_stream
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: torch.Tensor | None = None

    def capture(self, warmup: int = 2) -> None:
        stream = self.capture_stream or torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                self.fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=self.pool, stream=stream):
            self.output = self.fn(*self.inputs)
        # One launch: with the async allocator a graph's memory is mapped at its first launch, so
        # the stage's memory is measured (and a budget enforced) at start-up, not under load.
        self.graph.replay()

    def __call__(self, *values: torch.Tensor) -> torch.Tensor:
        for dst, src in zip(self.inputs, values):
            dst.copy_(src, non_blocking=True)  # host tensors are pinned on CUDA
        if self.graph is None:
            return self.fn(*self.inputs)
        self.graph.replay()
        assert self.output is not None
        # The graphs of a lane share one memory pool: a graph captured earlier may reuse, as
        # scratch, the memory of this graph's output. Copy it out before another graph runs.
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

    def __init__(
        self,
        model: Vits,
        options: RunnerOptions,
        device: str | torch.device = "cpu",
        host_pool: HostBufferPool | None = None,
        memory: GpuMemory | None = None,
    ) -> None:
        """``host_pool``: where step inputs and device->host outputs are staged (pinned on CUDA);
        None makes a pool of 256 MiB. ``memory``: the process's pool monitor, which measures each
        stage's device memory (``stage_bytes``) and enforces the budgets (CUDA only)."""
        self.options = options
        self.device = torch.device(device)
        self.memory = memory if self.device.type == "cuda" else None
        #: Device memory each stage added at start-up, bytes ("state", "encode", "decode", "flow").
        self.stage_bytes: dict[str, int] = {}
        if self.memory:
            # An earlier engine's CUDA graphs held in reference cycles would otherwise be freed inside a
            # stage's window and make its cost negative; what is collected later is this runner's own.
            gc.collect()
        base = self.memory.footprint() if self.memory else 0
        self.host_pool = host_pool or HostBufferPool(pinned=self.device.type == "cuda")
        cuda = self.device.type == "cuda"
        #: The fast lanes, then "main".
        self.fast_lanes = fast_lane_names(options.fast_lanes)
        self.lanes = (*self.fast_lanes, "main")
        self._staged: dict[str, list[torch.Tensor]] = {lane: [] for lane in self.lanes}  # blocks in use by queued steps
        if cuda and options.fast_lane != "off":  # lower number, higher priority (clamped to what the GPU has)
            self._streams = {lane: torch.cuda.Stream(self.device, priority=-16) for lane in self.fast_lanes}
            self._streams["main"] = torch.cuda.Stream(self.device)
        elif cuda:
            self._streams = dict.fromkeys(self.lanes, torch.cuda.Stream(self.device))
        else:
            self._streams = dict.fromkeys(self.lanes)
        self.dtype = DTYPES[options.precision]
        self.model = model.to(self.device).float().eval()
        if options.precision == "int8":
            from tts_engine.torch_vits.int8 import int8_synth_model

            self.synth_model, self.dtype = int8_synth_model(self.model)
        else:
            self.synth_model = self.model if self.dtype == torch.float32 else copy.deepcopy(self.model).to(self.dtype)
        fused = [name for name in ("fused_blocks", "fused_upsampling", "fused_flow") if getattr(options, name)]
        if fused:  # the fp16/bf16 synthesis model's Triton kernels (fused_resblock, fused_upsample, fused_flow)
            from tts_engine.torch_vits.kernels import fused_flow, fused_resblock

            if not cuda or options.precision not in ("fp16", "bf16") or not fused_resblock.available():
                raise ValueError(f"{fused[0]} needs CUDA, triton and precision fp16 or bf16; got "
                                 f"{self.device} and {options.precision!r}")  # fmt: skip
        if options.fused_blocks:
            self.synth_model.dec.use_fused_blocks()
        if options.fused_upsampling:
            if not self.synth_model.dec.use_fused_upsampling():
                log.warning("fused upsampling: this decoder has a layer the kernels do not take; left as is")
        if options.fused_flow:
            if not fused_flow.use_fused_flow(self.synth_model.flow):
                log.warning("fused flow: this voice's flow has speaker conditioning or other channel counts; left as is")
        if options.polyphase:
            if self.synth_model is self.model:  # fp32: the encoder's model is shared; keep it as loaded
                self.synth_model = copy.deepcopy(self.model)
            self.synth_model.dec.use_polyphase()
            if self.synth_model.dec.polyphase is None:
                log.warning("polyphase upsampling: this decoder's upsampling layers have no polyphase form; left as is")
        if (options.encoder_convs == "gemm" or options.fused_duration_predictor or options.fused_text_encoder
                or options.fused_attention):
            self.model = copy.deepcopy(self.model)  # the caller's model (and synth_model) stay as loaded
        if options.encoder_convs == "gemm":
            for part in (self.model.enc_p, self.model.dp):
                use_gemm_convs(part)
        encoder_kernels = [n for n in ("fused_duration_predictor", "fused_text_encoder", "fused_prior", "fused_attention")
                           if getattr(options, n)]
        if encoder_kernels:  # the fp32 encoder's Triton kernels: all checked before any is swapped in
            from tts_engine.torch_vits.kernels import fused_attention, fused_duration, fused_ffn, fused_prior

            modules = {"fused_duration_predictor": fused_duration, "fused_text_encoder": fused_ffn, "fused_prior": fused_prior,
                       "fused_attention": fused_attention}
            if not cuda or not all(modules[n].available() for n in encoder_kernels) or options.compile_encoder:
                raise ValueError(f"{' and '.join(encoder_kernels)} need{'s' if len(encoder_kernels) == 1 else ''} CUDA and "
                                 f"triton, and not compile_encoder; got {self.device}, compile_encoder={options.compile_encoder}")  # fmt: skip
            if options.fused_duration_predictor:
                fused_duration.use_fused_duration_predictor(self.model.dp)
            if options.fused_text_encoder:
                fused_ffn.use_fused_ffn(self.model.enc_p, options.text_encoder_products)
            if options.fused_attention:
                fused_attention.use_fused_attention(self.model.enc_p, options.text_encoder_products,
                                                    options.fused_attention_tile)
        if options.output_rate and not options.voice_rate:
            raise ValueError(f"output_rate {options.output_rate} needs the voice's rate (voice_rate)")
        rate = options.voice_rate or 1
        #: Device resampling of each chunk (identity unless ``output_rate`` differs from the voice's).
        self.resampler = ChunkResampler(rate, options.output_rate or rate, self.model.hop_length, self.device,
                                        fused=options.fused_upsampling)  # fmt: skip
        edge = self.resampler.edge_frames
        #: The main lane's chunks (flowed with ``flow_once``: ``ChunkGeometry.flowed``).
        self.geometries = {c: ChunkGeometry.for_model(self.model, c, edge, flowed=options.flow_once)
                           for c in options.chunk_sizes}  # fmt: skip
        self.geometry = self.geometries[options.chunk_frames]
        #: The fast lanes' first chunks (start 0): no context before them (``ChunkGeometry.first``).
        self.first_geometry = ChunkGeometry.for_model(self.model, options.chunk_frames, edge, first=True)
        #: Chunks decoded ahead (``speculate_frames``) with ``flow_once``: before the length is known,
        #: so before the flow has run; they keep their flow windows.
        self.ahead_geometry = ChunkGeometry.for_model(self.model, options.chunk_sizes[-1], edge)
        c, s = self.model.config, options.max_slots + 1
        self.scratch_slot = options.max_slots
        self.latents = torch.zeros(s, options.max_frames, c.inter_channels, device=self.device)
        #: ``flow_once``: the flow's output per slot and frame, flat [slots * max_frames + scratch, C]
        #: in the synthesis dtype; the scratch rows (one per position of the largest flow bucket) take
        #: the packed positions whose output is not kept.
        self.flowed = None
        if options.flow_once:
            rows = s * options.max_frames + options.flow_buckets[-1]
            self.flowed = torch.zeros(rows, c.inter_channels, dtype=self.dtype, device=self.device)
        self.frames = torch.zeros(s, dtype=torch.long, device=self.device)
        self.speakers = torch.zeros(s, dtype=torch.long, device=self.device)
        if self.memory:
            self.stage_bytes["state"] = self.memory.footprint() - base
            _check_budget("state", self.stage_bytes["state"], options.state_budget_mb)
        self._encode_steps: dict[tuple[int, int, str], _Step] = {}  # (batch, phonemes, fast lane)
        self._decode_steps: dict[tuple[int, int, str], _Step] = {}  # (chunk frames, batch, lane or "ahead")
        self._flow_steps: dict[int, _Step] = {}  # packed frames (flow_once)
        self.capture_s = 0.0
        #: Seconds each stage's graphs took to capture ("encode", "decode", "flow" with flow_once; cuDNN timing included).
        self.stage_capture_s: dict[str, float] = {}
        self.capture_peak_mb = 0.0
        self._build()

    @property
    def encode_steps(self) -> Mapping[tuple[int, int, str], _Step]:
        """The encoder's captured steps by (batch, phonemes, fast lane), read-only: each step's static
        ``inputs`` and its CUDA ``graph`` (None when eager), for benches that replay one alone."""
        return types.MappingProxyType(self._encode_steps)

    @property
    def decode_steps(self) -> Mapping[tuple[int, int, str], _Step]:
        """The decoder's captured steps by (chunk frames, batch, lane or "ahead"), read-only."""
        return types.MappingProxyType(self._decode_steps)

    @property
    def flow_steps(self) -> Mapping[int, _Step]:
        """The packed flow's captured steps by frames (``flow_once``), read-only."""
        return types.MappingProxyType(self._flow_steps)

    # ---------------------------------------------------------------- building

    def _build(self) -> None:
        use_graphs = self.options.cuda_graphs and self.device.type == "cuda"
        dev = self.device
        if dev.type == "cuda":
            torch.backends.cudnn.benchmark = self.options.cudnn_benchmark
            torch.backends.cudnn.benchmark_limit = self.options.cudnn_benchmark_limit
            # Durations are ceil'd: TF32 in the encoder could change an utterance's length.
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        # Per lane a graph pool and a capture stream (see _Step: cuBLAS workspaces of their own).
        main_pool, main_capture = (torch.cuda.graph_pool_handle(), torch.cuda.Stream(dev)) if use_graphs else (None, None)
        pools = dict.fromkeys(self.lanes, (main_pool, main_capture))
        if use_graphs and self.options.fast_lane != "off":
            for lane in self.fast_lanes:
                pools[lane] = (torch.cuda.graph_pool_handle(), torch.cuda.Stream(dev))
        t0 = time.perf_counter()
        # The encoder is compiled only with compile_encoder: compiled per shape it took ~30 s each on
        # the H200; with its batch and length marked dynamic (below) one graph serves every bucket
        # (+81 s of start-up for a 1.6x faster fast lane, 8cad0c9:bench/results/tts_load-h200-2026-12-03-compile.md).
        compiling = self.options.compile and dev.type == "cuda"
        compiling_encoder = self.options.compile_encoder and dev.type == "cuda"
        if compiling or compiling_encoder:
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
        encode_fn = torch.compile(self._encode_fn) if compiling_encoder else self._encode_fn
        # Largest first: later captures reuse the pool's blocks.
        for lane in self.fast_lanes:
            for b, t in sorted(self.options.encode_buckets(), key=lambda bt: -bt[0] * bt[1]):
                inputs = [
                    torch.zeros(b, t, dtype=torch.long, device=dev),
                    torch.ones(b, dtype=torch.long, device=dev),
                    torch.tensor([[0.0, 1.0, 0.0]] * b, device=dev),
                    torch.full((b,), self.scratch_slot, dtype=torch.long, device=dev),
                    torch.zeros(b, dtype=torch.long, device=dev),
                ]
                self._encode_steps[(b, t, lane)] = _Step(encode_fn, inputs, *pools[lane])
                if compiling_encoder and b > 1:
                    torch._dynamo.mark_dynamic(inputs[0], 1)  # one compiled graph for every phoneme bucket
                    for tensor in inputs:  # and every batch > 1
                        torch._dynamo.mark_dynamic(tensor, 0)
        # keyed by chunk frames; "first": the fast lanes' first chunks
        decode_fns = {c: functools.partial(self._decode_fn, g) for c, g in self.geometries.items()}
        decode_fns["first"] = functools.partial(self._decode_fn, self.first_geometry)
        decode_fns["ahead"] = functools.partial(self._decode_fn, self.ahead_geometry)
        if compiling:
            decode_fns = {c: torch.compile(fn) for c, fn in decode_fns.items()}
        lanes = [(chunk, "main", main_pool, main_capture) for chunk in sorted(self.options.chunk_sizes, reverse=True)]
        if self.options.fast_lane != "off":  # first chunks: graphs of their own in each fast lane's pool
            lanes += [(self.options.chunk_frames, lane, *pools[lane]) for lane in self.fast_lanes]
        if self.options.flow_once and self.options.speculate_frames:  # chunks ahead: windows of their own
            lanes.append((self.options.chunk_sizes[-1], "ahead", main_pool, main_capture))
        for chunk, lane, pool, capture_stream in lanes:
            fn = decode_fns[chunk if lane == "main" else "ahead" if lane == "ahead" else "first"]
            for b in sorted(self.options.decode_batches, reverse=True):
                inputs = [
                    torch.full((b,), self.scratch_slot, dtype=torch.long, device=dev),
                    torch.zeros(b, dtype=torch.long, device=dev),
                    torch.zeros(b, dtype=torch.long, device=dev),
                ]
                self._decode_steps[(chunk, b, lane)] = _Step(fn, inputs, pool, capture_stream)
                if compiling and b > 1:
                    for tensor in inputs:  # one compiled graph for every batch > 1
                        torch._dynamo.mark_dynamic(tensor, 0)
        if self.options.flow_once:  # the packed flow launches, on the main lane before its chunks
            for frames in sorted(self.options.flow_buckets, reverse=True):
                empty = torch.from_numpy(padding_table(frames)).to(dev)  # no utterance: every position masked
                self._flow_steps[frames] = _Step(functools.partial(self._flow_fn, frames), [empty], main_pool,
                                                 main_capture)  # fmt: skip
        if use_graphs:
            kept = {}
            with torch.inference_mode():
                for stage, steps, budget_mb in (("encode", self._encode_steps, self.options.encode_budget_mb),
                                                ("decode", self._decode_steps, self.options.decode_budget_mb)):
                    timed = self.options.cudnn_benchmark and stage in self.options.cudnn_benchmark_stages
                    torch.backends.cudnn.benchmark = timed
                    t1 = time.perf_counter()
                    kept[stage] = self._capture_stage(stage, steps, budget_mb)
                    self.stage_capture_s[stage] = time.perf_counter() - t1
                t1 = time.perf_counter()
                start = self.memory.footprint() if self.memory else 0
                for frames in sorted(self._flow_steps, reverse=True):
                    self._flow_steps[frames].capture()
                if self._flow_steps:
                    self.stage_capture_s["flow"] = time.perf_counter() - t1
                    if self.memory:
                        self.stage_bytes["flow"] = self.memory.footprint() - start
            encode_kept, decode_kept = kept["encode"], kept["decode"]
            torch.cuda.synchronize(dev)
            self.capture_peak_mb = torch.cuda.max_memory_reserved(dev) / 2**20
            torch.cuda.empty_cache()  # drop cuDNN benchmark workspaces; the graphs keep their pool
            if encode_kept != self.options.encode_batches or decode_kept != self.options.decode_batches:
                self.options = dataclasses.replace(self.options, encode_batches=encode_kept, decode_batches=decode_kept)
        self.capture_s = time.perf_counter() - t0
        if use_graphs:
            log.info("captured %d CUDA graphs in %.1f s", len(self._encode_steps) + len(self._decode_steps)
                     + len(self._flow_steps), self.capture_s)  # fmt: skip

    def _capture_stage(self, stage: str, steps: dict, budget_mb: int) -> tuple[int, ...]:
        """Capture a stage's graphs; returns the batch sizes kept.

        Without a budget: largest first (later captures reuse the pool's blocks). With one:
        smallest batch first, measuring after each batch; the batch that goes over the budget is
        dropped with every larger one (logged); ConfigError if even the smallest does not fit.
        """
        batch_of = (lambda k: k[0]) if stage == "encode" else (lambda k: k[1])  # keys: (b, t, lane) / (chunk, b, lane)
        batches = sorted({batch_of(k) for k in steps})
        if budget_mb and self.memory and self.memory.backend == "cudaMallocAsync":
            # Graph memory then lives in CUDA's graph memory pool, whose counters did not attribute it
            # per stage on the H200 (the decode stage measured 0 MiB): no budget we could enforce.
            raise ConfigError(f"gpu.tts_{stage}_budget_mb needs gpu.allocator = 'native' (graph memory is not "
                              "attributed per stage with the async pool)")  # fmt: skip
        start = self.memory.footprint() if self.memory else 0
        if not budget_mb or not self.memory:
            for key in sorted(steps, key=lambda k: -k[0] * k[1]):
                steps[key].capture()
            if self.memory:
                self.stage_bytes[stage] = self.memory.footprint() - start
            return tuple(batches)
        kept: list[int] = []
        for b in batches:
            for key in [k for k in steps if batch_of(k) == b]:
                steps[key].capture()
            used = self.memory.footprint() - start
            if used > budget_mb * 2**20:
                if not kept:  # not even the smallest batch fits
                    _check_budget(stage, used, budget_mb)
                for key in [k for k in steps if batch_of(k) >= b]:
                    del steps[key]
                log.warning("tts %s stage: batch %d needs %.0f MiB > budget %d MiB; batches above %d dropped",
                            stage, b, used / 2**20, budget_mb, kept[-1])  # fmt: skip
                break
            kept.append(b)
            self.stage_bytes[stage] = used
        return tuple(kept)

    def _prior(
        self, ids: torch.Tensor, lengths: torch.Tensor, scales: torch.Tensor, sids: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """ids -> the prior per phoneme ``m_p``, ``logs_p`` [B, C, T], frames per phoneme ``w_ceil`` [B, T]
        and per utterance [B] (no side effects: compilable)."""
        model = self.model
        x, m_p, logs_p, mask = model.encode(ids, lengths)
        w_ceil, frames = model.durations(x, mask, scales[:, 2], scales[:, 1], g=model.speaker_embedding(sids))
        return m_p, logs_p, w_ceil, frames

    def _encode_core(
        self, ids: torch.Tensor, lengths: torch.Tensor, scales: torch.Tensor, sids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids -> per-frame prior sample [B, C, max_frames] and frames [B] (no side effects: compilable)."""
        m_p, logs_p, w_ceil, frames = self._prior(ids, lengths, scales, sids)
        return self.model.expand_prior(m_p, logs_p, w_ceil, self.options.max_frames, scales[:, 0]), frames

    def _encode_fn(
        self, ids: torch.Tensor, lengths: torch.Tensor, scales: torch.Tensor, slots: torch.Tensor, sids: torch.Tensor
    ) -> torch.Tensor:
        if self.options.fused_prior:  # the same latents, written by one kernel (fused_prior)
            from tts_engine.torch_vits.kernels.fused_prior import expand_prior_into

            m_p, logs_p, w_ceil, frames = self._prior(ids, lengths, scales, sids)
            expand_prior_into(self.latents, slots, m_p, logs_p, w_ceil, scales[:, 0])
        else:
            z_p, frames = self._encode_core(ids, lengths, scales, sids)
            self.latents.index_copy_(0, slots, z_p.transpose(1, 2))
        self.frames.index_copy_(0, slots, frames.clamp_max(self.options.max_frames))
        self.speakers.index_copy_(0, slots, sids)
        return frames

    @property
    def _flow_scratch(self) -> int:
        """First scratch row of the flat ``flowed`` buffer."""
        return self.latents.shape[0] * self.latents.shape[1]

    def _flow_fn(self, frames: int, table: torch.Tensor) -> torch.Tensor:
        """One packed flow launch of ``frames`` positions (``chunked.pack_flow``'s ``table``): the latents
        rows it reads (masked) through the flow as one row, each output position written to its row of
        ``flowed`` (``chunked.flow_positions``)."""
        src, valid, dst = flow_positions(table, frames, self.options.max_frames, self._flow_scratch, self.scratch_slot)
        model, channels = self.synth_model, self.latents.shape[-1]
        z = self.latents.view(-1, channels).index_select(0, src) * valid[:, None]
        z = z.to(self.dtype).t().unsqueeze(0).contiguous()  # [1, C, P]
        mask = valid.view(1, 1, -1).to(self.dtype)
        g = model.speaker_embedding(self.speakers.index_select(0, src // self.options.max_frames))
        if g is not None:  # one speaker per position: [1, gin, P] (the WaveNets' 1x1 conditioning takes it)
            g = g.to(self.dtype)[..., 0].t().unsqueeze(0)
        out = model.flow.reverse(z, mask, g=g)
        assert self.flowed is not None
        self.flowed.index_copy_(0, dst, out[0].t())
        return valid[:1]

    def _decode_fn(
        self, geometry: ChunkGeometry, slots: torch.Tensor, starts: torch.Tensor, active: torch.Tensor
    ) -> torch.Tensor:
        model = self.synth_model
        frames = self.frames.index_select(0, slots) * active
        source = self.latents
        if geometry.flowed:
            assert self.flowed is not None
            source = self.flowed[: self._flow_scratch].view(*self.latents.shape)
        z, mask = gather_windows(source, slots, starts, frames, geometry)
        g = model.speaker_embedding(self.speakers.index_select(0, slots))
        g = None if g is None else g.to(self.dtype)
        audio = decode_windows(model, z.to(self.dtype), mask.to(self.dtype), geometry, g)
        return self.resampler.int16(audio, starts, frames, geometry.chunk_frames)

    # ---------------------------------------------------------------- running

    def _on(self, lane: str) -> contextlib.AbstractContextManager:
        """Run what follows on ``lane``'s stream (CUDA); on CPU, in call order."""
        stream = self._streams[lane]
        return contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)

    def encode(self, items: Sequence[EncodeItem], lane: str = "fast") -> torch.Tensor:
        """Queue the encoder step for ``items`` on fast lane ``lane``; returns frames per item
        [len(items)] (device, not synced). ``fetch`` it (that lane, or None) before a main-lane
        ``decode`` reads its slots."""
        if lane not in self.fast_lanes:
            raise ValueError(f"the encoder runs on a fast lane {self.fast_lanes}, not {lane!r}")
        n = len(items)
        longest = max(len(it.ids) for it in items)
        t = bucket_for(longest, self.options.phoneme_buckets)
        b = bucket_for(n, [bb for bb, tt, _ in self._encode_steps if tt == t])
        staged = [self._stage((b, t), torch.long, lane), self._stage((b,), torch.long, lane),
                  self._stage((b, 3), torch.float32, lane), self._stage((b,), torch.long, lane),
                  self._stage((b,), torch.long, lane)]  # fmt: skip
        ids, lengths, scales, slots, sids = (x.numpy() for x in staged)
        ids[:] = 0
        lengths[:] = 1
        scales[:] = (0.0, 1.0, 0.0)
        slots[:] = self.scratch_slot
        sids[:] = 0
        for i, it in enumerate(items):
            ids[i, : len(it.ids)] = it.ids
            lengths[i] = len(it.ids)
            scales[i] = (it.noise_scale, it.length_scale, it.noise_w)
            slots[i], sids[i] = it.slot, it.speaker_id
        with torch.inference_mode(), self._on(lane):
            out = self._encode_steps[(b, t, lane)](*staged)
        return out[:n]

    def decode(self, slots: Sequence[int], starts: Sequence[int], chunk: int | None = None,
               lane: str = "main", after: Sequence[torch.cuda.Event | None] = (), ahead: bool = False) -> torch.Tensor:
        """Queue one ``chunk``-frame chunk (default ``chunk_frames``) for each (slot, start frame)
        on ``lane`` (a fast lane: first chunks only, ``chunk`` = ``chunk_frames``, every start 0).
        ``ahead``: chunks decoded before the request's length is known (main lane, the largest chunk
        size); with ``flow_once`` they run the flow on their own windows. Otherwise, with
        ``flow_once``, the main lane's chunks read what ``flow`` wrote: queue it before them.

        Returns int16 [len(slots), resampler.row_samples(chunk)] on the device (not synced; chunk * hop
        samples at the voice's rate, ``resampler.span`` says which are a row's). The lanes do not wait
        for each other: decode a slot on the main lane once its encoder is done (fetched), or
        pass ``after`` the events ``mark`` returned behind its encoder (the GPU waits for them).
        """
        chunk = chunk or self.options.chunk_frames
        if lane not in self.lanes:
            raise ValueError(f"no lane {lane!r} (lanes: {self.lanes})")
        if lane != "main" and (chunk != self.options.chunk_frames or any(starts)):
            raise ValueError(f"a fast lane decodes first chunks ({self.options.chunk_frames} frames from frame 0), "
                             f"not {chunk} frames from {sorted(set(starts))}")  # fmt: skip
        if ahead and (lane != "main" or chunk != self.options.chunk_sizes[-1]):
            raise ValueError(f"chunks ahead are main-lane chunks of {self.options.chunk_sizes[-1]} frames, "
                             f"not {chunk} on {lane!r}")  # fmt: skip
        key_lane = "ahead" if ahead and self.options.flow_once else lane if self.options.fast_lane != "off" else "main"
        n = len(slots)
        b = bucket_for(n, self.options.decode_batches)
        staged = [self._stage((b,), torch.long, lane) for _ in range(3)]
        slot_arr, start_arr, active = (x.numpy() for x in staged)
        slot_arr[:], start_arr[:], active[:] = self.scratch_slot, 0, 0
        slot_arr[:n], start_arr[:n], active[:n] = slots, starts, 1
        with torch.inference_mode(), self._on(lane):
            for event in after:
                if event is not None:
                    self._streams[lane].wait_event(event)
            out = self._decode_steps[(chunk, b, key_lane)](*staged)
        return out[:n]

    def flow(self, segments: Sequence[tuple[int, int, int]]) -> tuple[int, int, int]:
        """``flow_once``: queue the flow, on the main lane, for each ``(slot, first start, frames)``: a
        request whose main-lane chunks start at frame ``first start``; its ``flowed`` frames are then
        exact from where the first one's decoder window starts to the utterance's end. Returns
        (launches, frames launched, frames of utterances among them)."""
        if self.flowed is None:
            raise ValueError("flow needs flow_once")
        flow_model = self.synth_model.flow
        packs = pack_flow(segments, self.options.max_frames, self.options.flow_buckets, flow_model.receptive_radius,
                          flow_model.conv_radius, self.geometry.dec_context + self.geometry.edge_frames)  # fmt: skip
        for pack in packs:
            staged = self._stage(pack.table.shape, torch.long, "main")
            staged.numpy()[:] = pack.table
            with torch.inference_mode(), self._on("main"):
                self._flow_steps[pack.frames](staged)
        return len(packs), sum(p.frames for p in packs), sum(p.used for p in packs)

    def mark(self, lane: str) -> torch.cuda.Event | None:
        """An event at the end of the work queued on ``lane`` so far (for ``decode(after=...)``);
        None on CPU, where work runs when called."""
        stream = self._streams[lane]
        if stream is None:
            return None
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def _stage(self, shape: tuple[int, ...], dtype: torch.dtype, lane: str) -> torch.Tensor:
        """A host tensor from the pool (pinned on CUDA, so copies are async), held until ``release_staged``."""
        nbytes = math.prod(shape) * dtype.itemsize
        block = self.host_pool.take(nbytes)
        self._staged[lane].append(block)
        return block[:nbytes].view(dtype).view(shape)

    def take_staged(self, lane: str) -> list[torch.Tensor]:
        """The host buffers staged on ``lane`` since the last take or release, now the caller's: give
        them back (``give_staged``) once the launch they belong to is done (``done``/``wait_event``),
        while later launches of the lane still run."""
        blocks, self._staged[lane] = self._staged[lane], []
        return blocks

    def give_staged(self, blocks: list[torch.Tensor]) -> None:
        """Return buffers from ``take_staged`` to the pool."""
        for block in blocks:
            self.host_pool.give(block)

    def done(self, event: torch.cuda.Event | None) -> bool:
        """True once the work before ``event`` (from ``mark``) is done; None (CPU): True."""
        return event is None or event.query()

    def wait_event(self, event: torch.cuda.Event | None) -> None:
        """Block until the work before ``event`` is done (None, CPU: at once)."""
        if event is not None:
            event.synchronize()

    def release_staged(self, lane: str | None = None) -> None:
        """Return ``lane``'s staged host buffers (None: every lane's) to the pool; call once its
        queued steps are done (after ``fetch``/``wait``, whose synchronization covers them)."""
        for name in self.lanes if lane is None else (lane,):
            for block in self._staged[name]:
                self.host_pool.give(block)
            self._staged[name].clear()

    def max_encode_batch(self, phonemes: int) -> int:
        """Most requests one encoder launch takes when the longest has ``phonemes`` ids."""
        t = bucket_for(phonemes, self.options.phoneme_buckets)
        return max(b for b, tt, _ in self._encode_steps if tt == t)

    def fetch(self, *tensors: torch.Tensor, lane: str | None = None) -> list[np.ndarray]:
        """Copy device results made on ``lane`` to host and wait for them (``fetch_async`` +
        ``wait``); None (callers outside the scheduler): wait for every lane first, so the result
        of ``encode`` (fast lane) and a later ``decode`` (main lane) of its slots are in order."""
        if lane is None:
            for name in self.lanes:
                self.wait(name)
            lane = "main"
        host = self.fetch_async(*tensors, lane=lane)
        self.wait(lane)
        return host

    def fetch_async(self, *tensors: torch.Tensor, lane: str = "main") -> list[np.ndarray]:
        """Queue the copies of device results made on ``lane`` to host; the arrays are valid once
        ``wait(lane)`` returns (or ``busy(lane)`` is False), and live in staged pool buffers:
        read them before ``release_staged``."""
        if self.device.type != "cuda":
            return [t.numpy() for t in tensors]
        with self._on(lane):
            host = [self._stage(tuple(t.shape), t.dtype, lane) for t in tensors]  # valid until release_staged
            for h, t in zip(host, tensors):
                h.copy_(t, non_blocking=True)
        return [h.numpy() for h in host]

    def busy(self, lane: str) -> bool:
        """True while work queued on ``lane`` still runs (never on CPU: it ran when called)."""
        stream = self._streams[lane]
        return stream is not None and not stream.query()

    def wait(self, lane: str) -> None:
        """Block until the work queued on ``lane`` is done."""
        stream = self._streams[lane]
        if stream is not None:
            stream.synchronize()

    def memory_mb(self) -> float:
        """Device memory reserved by PyTorch (buffers, graph pools), MiB; 0 on CPU."""
        if self.device.type != "cuda":
            return 0.0
        return torch.cuda.max_memory_reserved(self.device) / 2**20
