"""``CudaTtsEngine``: the GPU ``TtsEngine`` (PyTorch VITS, CUDA graphs, continuous batching).

Three lines from a notebook::

    engine = CudaTtsEngine.from_config(load_config("configs/gpu.toml"))
    for chunk in engine.synthesize("Hello there. How are you?"):
        play(chunk.pcm, chunk.sample_rate)

One instance serves every session: calls from many threads are batched together on
the GPU by its ``BatchScheduler``. Each sentence streams as several chunks of
``tts.chunk_frames`` frames (the last has ``final=True``); the joined chunks equal the
whole-utterance audio. Also runs on CPU (eager, no graphs) for tests.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from tts_engine.engine import AudioChunk, SynthesisOptions, engine_defaults, phoneme_id_array, resolve_options
from tts_engine.resample import StreamResampler
from tts_engine.torch_vits.buffers import HostBufferPool
from tts_engine.torch_vits.gpu_memory import GpuMemory, configure_allocator
from tts_engine.torch_vits.runner import RunnerOptions, StepRunner
from tts_engine.torch_vits.scheduler import BatchScheduler, Scales, Sink, SpeechRequest
from tts_engine.torch_vits.weights import load_vits
from tts_engine.voice import Voice
from base.config import Config, GpuConfig
from base.errors import ConfigError, ModelError

log = logging.getLogger(__name__)

#: Distinct request options whose resolved scales ``CudaTtsEngine`` keeps.
RESOLVED_OPTIONS = 256


class CudaTtsEngine:
    """Text or phoneme ids in, streamed int16 ``AudioChunk``s out; thread-safe."""

    def __init__(
        self,
        voice: Voice,
        options: RunnerOptions,
        *,
        device: str = "cuda",
        queue_size: int = 256,
        defaults: SynthesisOptions | None = None,
        max_text_chars: int | None = None,
        weights_path: str | Path | None = None,
        oom_retry_after_ms: int = 2000,
        gpu: GpuConfig | None = None,
        runner: Callable[[RunnerOptions], StepRunner] | None = None,
    ) -> None:
        """``weights_path``: a PyTorch checkpoint to use instead of ``voice.model_path`` (.onnx);
        ``oom_retry_after_ms``: retry hint, ms, for requests dropped on GPU out-of-memory;
        ``gpu``: allocator, memory limit and host buffer pools (default ``GpuConfig()``);
        ``runner``: builds the step runner from the final options (the voice's rate filled in)
        instead of loading the voice's weights into a ``StepRunner``: the host-path benches drive
        the real scheduler and server with a stand-in whose launches take no time."""
        on_cuda = device.startswith("cuda")
        if on_cuda and not torch.cuda.is_available():
            raise ModelError("tts.backend = 'cuda' but PyTorch sees no CUDA device; set tts.backend = 'onnx'")
        gpu = gpu or GpuConfig()
        if on_cuda and (options.compiles or options.fused_kernels) and options.cuda_graphs and gpu.allocator != "native":
            # H200, torch 2.11: Triton kernels launched while a graph is captured under cudaMallocAsync
            # fail: the compiled encoder with "CUDA driver error: invalid argument", the fused blocks with
            # "Pointer argument cannot be accessed from Triton" (the pool's memory is not mapped yet);
            # with the native allocator both pass tests/test_gpu_tts.py.
            raise ConfigError("tts.compile / tts.compile_encoder / tts.triton_kernels with CUDA graphs need "
                              f"gpu.allocator = 'native' (got {gpu.allocator!r})")  # fmt: skip
        if on_cuda:
            configure_allocator(gpu.allocator)
        #: The process's device memory pool (None on CPU).
        self.memory = GpuMemory(gpu, device) if on_cuda else None
        self.voice = voice
        options = dataclasses.replace(options, voice_rate=voice.sample_rate)
        #: Rate of the chunks the scheduler hands out: ``options.output_rate`` (resampled on the device)
        #: or the voice's.
        self.sample_rate = options.output_rate or voice.sample_rate
        self.defaults = engine_defaults(defaults or SynthesisOptions(), options.output_rate)
        #: ``_resolve``'s results per request options (a few distinct ones in practice; cleared when full).
        self._resolved: dict[SynthesisOptions | None, tuple[Scales, int]] = {}
        self._max_text_chars = max_text_chars
        self._frontend = None
        pool_bytes = gpu.host_pool_mb * 2**20
        if runner is not None:
            self.runner = runner(options)
        else:
            model = load_vits(weights_path or voice.model_path)
            host_pool = HostBufferPool(pinned=on_cuda, max_cached_bytes=pool_bytes)
            self.runner = StepRunner(model, options, device, host_pool=host_pool, memory=self.memory)
        if not self.runner.resampler.identity:
            log.info("TTS audio leaves the decoder steps at %d Hz (the voice's %d Hz resampled on the device; "
                     "%d more decoder frame(s) each side of a chunk)", self.sample_rate, voice.sample_rate,
                     self.runner.resampler.edge_frames)  # fmt: skip
        self.scheduler = BatchScheduler(
            self.runner, self.sample_rate, queue_size, oom_retry_after_ms=oom_retry_after_ms,
            audio_pool=HostBufferPool(pinned=False, max_cached_bytes=pool_bytes),
        )  # fmt: skip

    @classmethod
    def from_config(cls, cfg: Config, runner: Callable[[RunnerOptions], StepRunner] | None = None) -> CudaTtsEngine:
        """Voice, precision, chunking and batching from ``cfg.tts`` (models via ``base.models``);
        ``runner`` as in the constructor."""
        from base import models

        tts = cfg.tts
        onnx_path = models.resolve_voice(cfg).path
        voice = Voice.load(onnx_path, models.voice_config_path(cfg, onnx_path))
        options = RunnerOptions.from_config(cfg)
        if (options.compiles or options.fused_kernels) and str(tts.device).startswith("cuda") and torch.cuda.is_available():
            from tts_engine.torch_vits.compile_cache import ENV, TRITON_ENV, use_device_compile_cache

            caches = [("triton", TRITON_ENV)] + ([("inductor", ENV)] if options.compiles else [])
            for name, env in caches:
                where = use_device_compile_cache(models.cache_dir(cfg) / name, tts.device, env)
                if where is not None:
                    log.info("compiled %s kernels are kept in %s", name, where)
        defaults = SynthesisOptions.from_config(tts)
        return cls(
            voice,
            options,
            device=tts.device,
            queue_size=tts.queue_size,
            defaults=defaults,
            max_text_chars=cfg.limits.max_text_chars,
            oom_retry_after_ms=tts.oom_retry_after_ms,
            gpu=cfg.gpu,
            runner=runner,
        )

    @property
    def frontend(self):  # noqa: ANN201 - TextFrontend, imported lazily (espeak-ng)
        if self._frontend is None:
            from tts_engine.frontend import TextFrontend

            self._frontend = TextFrontend(self.voice.config, max_text_chars=self._max_text_chars)
        return self._frontend

    def submit(self, phoneme_ids: Sequence[int], options: SynthesisOptions | None = None) -> SpeechRequest:
        """Queue one clause and return its handle at once (chunks at ``sample_rate``); Overloaded when full."""
        scales, _ = self._resolve(options)
        return self.scheduler.submit(self._check_ids(phoneme_ids), scales)

    def synthesize_ids(self, phoneme_ids: Sequence[int], options: SynthesisOptions | None = None) -> Iterator[AudioChunk]:
        """Speak one clause (Piper layout: BOS ... EOS); chunks as they are decoded."""
        scales, rate = self._resolve(options)
        request = self.scheduler.submit(self._check_ids(phoneme_ids), scales)
        return self._stream([request], rate)

    def synthesize(self, text: str, options: SynthesisOptions | None = None) -> Iterator[AudioChunk]:
        """Speak ``text``: every sentence is queued at once (they share GPU steps) and streamed in order."""
        requests, rate = self.submit_sentences(self.sentence_ids(text), options)
        return self._stream(requests, rate)

    def sentence_ids(self, text: str) -> list[list[int]]:
        """Phoneme ids of each sentence of ``text`` (the CPU text front end; no GPU work)."""
        return list(self.frontend.sentence_ids(text))

    def submit_sentences(
        self, sentences: Sequence[Sequence[int]], options: SynthesisOptions | None = None, sink: Sink | None = None
    ) -> tuple[list[SpeechRequest], int]:
        """Queue every sentence at once (``clause_index`` = position); returns the requests (chunks
        at ``sample_rate``) and the output rate the options ask for. With ``sink``, chunks go there in bulk."""
        scales, rate = self._resolve(options)
        requests: list[SpeechRequest] = []
        try:
            for index, ids in enumerate(sentences):
                requests.append(self.scheduler.submit(self._check_ids(ids), scales, clause_index=index, sink=sink))
        except BaseException:
            for r in requests:
                r.cancel()
            raise
        return requests, rate

    def close(self) -> None:
        self.scheduler.close()

    def memory_report(self) -> dict[str, object]:
        """Device pool counters (MiB; None on CPU), each stage's start-up memory and budget (MiB),
        the host buffer pools' counters, the current batch limit and OOMs survived."""
        opts = self.runner.options
        budgets = {"state": opts.state_budget_mb, "encode": opts.encode_budget_mb, "decode": opts.decode_budget_mb}
        return {
            "pool": self.memory.stats().as_mb() if self.memory else None,
            "stages_mb": {k: round(v / 2**20, 1) for k, v in self.runner.stage_bytes.items()},
            "budgets_mb": budgets,
            "host_pools": {
                "staging": vars(self.runner.host_pool.counters).copy(),
                "audio": vars(self.scheduler.audio_pool.counters).copy(),
            },  # fmt: skip
            "max_batch": self.scheduler.max_batch,
            "ooms": self.scheduler.ooms,
        }

    def _stream(self, requests: list[SpeechRequest], rate: int) -> Iterator[AudioChunk]:
        resampler = StreamResampler(self.sample_rate, rate, dtype="int16")
        try:
            for n, request in enumerate(requests):
                last_request = n == len(requests) - 1
                for chunk in request:
                    yield resampler.process_chunk(chunk, last=last_request and chunk.final)
        finally:  # consumer stopped early (barge-in) or finished: free the GPU slots
            for request in requests:
                request.cancel()

    def _resolve(self, options: SynthesisOptions | None) -> tuple[Scales, int]:
        """Request options over engine defaults over the voice's own; validated like the CPU engine.
        Remembered per options (frozen, hashable): on the served path every sentence of a session
        comes with the same ones, resolved on the engine process's link threads."""
        try:
            return self._resolved[options]
        except (KeyError, TypeError):  # TypeError: a value that cannot be hashed (resolve_options judges it)
            pass
        r = resolve_options(options, self.defaults, self.voice)  # InvalidInput: nothing is remembered
        resolved = Scales(r.noise_scale, r.length_scale, r.noise_w, r.speaker_id or 0), r.sample_rate
        if len(self._resolved) >= RESOLVED_OPTIONS:
            self._resolved.clear()
        self._resolved[options] = resolved  # hashable: resolve_options accepted only numbers
        return resolved

    def _check_ids(self, phoneme_ids: Sequence[int]) -> np.ndarray:
        return phoneme_id_array(phoneme_ids, self.voice.config.num_symbols)
