"""GPU TTS engine on CUDA: parity, chunked == whole, precision, graphs, cancellation.

Skipped without CUDA. Tolerances (docs/benchmarks.md has the measurements behind them):
fp32 on GPU matches onnxruntime within 1e-3 (same as CPU); the chunked fp32 engine
matches the whole-utterance GPU run within 3 int16 steps (1e-4 of full scale: cuDNN picks
different fp32 algorithms for the chunk windows and the whole utterance; each side rounds). bf16/fp16 run the flow and
decoder in low precision (encoder in fp32, so durations are identical): their waveform
stays within ``LOW_PRECISION_MIN_SNR_DB`` of fp32, a level at which faster-whisper
transcribes the GPU audio as well as the CPU audio (the intelligibility check).
"""

from __future__ import annotations

import functools

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.harness import load_sentences

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

LOW_PRECISION_MIN_SNR_DB = {"bf16": 15.0, "fp16": 30.0}


def bench_ids(n: int) -> list[list[int]]:
    return [s["ids"] for s in load_sentences()[:n]]


@pytest.fixture(scope="module")
def voice_path(cfg) -> Path:
    from base import models

    return models.resolve_voice(cfg).path


@pytest.fixture(scope="module")
def model(voice_path):
    from tts_engine.torch_vits.weights import load_vits

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return load_vits(voice_path, device="cuda")


def engine(voice_path, precision: str, max_batch: int = 8, chunk_frames: int = 64, tail_chunk_frames: int = 256,
           fast_lanes: int = 1, **runner_options: object):
    from tts_engine.torch_vits.cuda_engine import CudaTtsEngine
    from tts_engine.torch_vits.runner import batch_buckets
    from tts_engine.torch_vits.runner import RunnerOptions
    from tts_engine.voice import Voice
    from base.config import GpuConfig

    opts = RunnerOptions(
        chunk_frames=chunk_frames, tail_chunk_frames=tail_chunk_frames, max_frames=1024, precision=precision,
        decode_batches=batch_buckets(max_batch),
        encode_batches=(1, 2, 4, 8), phoneme_buckets=(64, 128, 256), fast_lanes=fast_lanes, **runner_options,
    )  # fmt: skip
    return CudaTtsEngine(Voice.load(voice_path), opts, device="cuda", gpu=GpuConfig(allocator=running_allocator()))


def running_allocator() -> str:
    """The process's PyTorch allocator as ``gpu.allocator`` names it (conftest picks "async" unless
    ``PYTORCH_CUDA_ALLOC_CONF`` says otherwise)."""
    torch.cuda.init()
    return "native" if torch.cuda.get_allocator_backend() == "native" else "async"


def run_with_native_allocator(test_name: str) -> None:
    """Run one test of this file in a process whose PyTorch uses the native allocator; assert it passed
    (prints its output)."""
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "backend:native"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", f"{__file__}::{test_name}"],
                          env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    print(done.stdout[-2000:])
    assert done.returncode == 0 and " passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]


def runs_here(voice_path, test_name: str, precision: str = "fp32", **options: object) -> bool:
    """True in a process whose PyTorch uses the native allocator. Elsewhere (conftest's default is the
    async one) the engine with ``options`` must refuse (``ConfigError`` naming "native") and the test
    ``test_name`` runs in a native process instead (``run_with_native_allocator``): False."""
    from base.errors import ConfigError

    if running_allocator() == "native":
        return True
    with pytest.raises(ConfigError, match="native"):
        engine(voice_path, precision, **options)
    run_with_native_allocator(test_name)
    return False


#: ``assert_speaks_as_whole``'s limit per text encoder product: samples within 3 int16 steps of the
#: whole-utterance run; fp16x3's states are ~10x further from cuBLAS's than tf32x3's (its prior means up
#: to 6.3e-5 of their peak off), its audio up to 9 steps off on an H100 (2026-12-05; configs/gpu.toml,
#: text_encoder_products), more where more of the encoder ran in its products: 32 (0.1 % of full scale).
WHOLE_STEPS = {"fp16x3": 32}


def assert_speaks_as_whole(model, voice_path, max_steps: int = 3, **options: object) -> None:
    """The fp32 engine with ``options`` speaks each of 6 bench sentences (no noise) as the whole-utterance
    run does: the same length, samples within ``max_steps`` int16 steps."""
    from tts_engine.engine import SynthesisOptions

    eng = engine(voice_path, "fp32", **options)
    quiet = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
    try:
        for ids_one in bench_ids(6):
            audio = np.concatenate([c.pcm for c in eng.submit(ids_one, quiet)]).astype(np.int32)
            ref = np.clip(whole(model, ids_one) * 32767, -32767, 32767).astype(np.int32)
            assert audio.shape == ref.shape
            assert np.abs(audio - ref).max() <= max_steps
    finally:
        eng.close()


#: configs/gpu.toml's decoder kernels (polyphase upsampling, fused blocks, upsampling and flow).
FUSED_DECODER = dict(polyphase=True, fused_blocks=True, fused_upsampling=True, fused_flow=True)


def speak_fp16_fused(voice_path, inputs: list[list[int]], **options: object) -> list[np.ndarray]:
    """Each of ``inputs`` without noise through an fp16 engine with ``FUSED_DECODER`` and ``options``,
    samples as floats in [-1, 1]."""
    from tts_engine.engine import SynthesisOptions

    quiet = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
    eng = engine(voice_path, "fp16", **FUSED_DECODER, **options)
    try:
        return [np.concatenate([c.pcm for c in eng.submit(ids, quiet)]) / 32767.0 for ids in inputs]
    finally:
        eng.close()


def gemm_encoder_pair(model, fuse, device: str = "cuda"):
    """The voice's model with ``gemm`` encoder convolutions, a copy whose text encoder ``fuse`` changes
    (it must swap 6 layers), and 40 bench sentences padded to the 256-id bucket on ``device``:
    ``(plain, fused, padded, lengths)``."""
    import copy

    from tts_engine.torch_vits.kernels.gemm_conv import use_gemm_convs
    from tts_engine.torch_vits.model import pad_ids

    padded, lengths = pad_ids(bench_ids(40), 256, device=device)
    plain = copy.deepcopy(model)
    use_gemm_convs(plain.enc_p)
    fused = copy.deepcopy(plain)
    assert fuse(fused.enc_p) == 6
    return plain, fused, padded, lengths


def assert_encoders_agree(plain, fused, padded, lengths, bound: float) -> int:
    """The two encoders' outputs on ``padded``: the same mask, states, means and log-deviations within
    ``bound`` of the states' peak (the message says how far off); returns the phonemes whose frame
    count (no noise) differs."""
    n = len(lengths)
    dev = padded.device
    quiet = dict(noise_w=torch.zeros(n, device=dev), length_scale=torch.ones(n, device=dev),
                 noise=torch.zeros(n, 2, padded.shape[1], device=dev))  # fmt: skip
    with torch.inference_mode():
        want, got = plain.encode(padded, lengths), fused.encode(padded, lengths)
        moved = (plain.durations(want[0], want[3], **quiet)[0] != fused.durations(got[0], got[3], **quiet)[0]).sum()
    assert torch.equal(want[3], got[3])
    peak = float(want[0].abs().max())
    diffs = [float((a - b).abs().max()) for a, b in zip(want[:3], got[:3])]
    assert max(diffs) < bound * peak, f"states off by {diffs} of a peak of {peak}"
    return int(moved)


def whole(model, ids: list[int]) -> np.ndarray:
    audio, _ = model.infer(torch.tensor([ids], device="cuda"), torch.tensor([len(ids)], device="cuda"), 0.0, 1.0, 0.0)
    return audio[0].float().cpu().numpy()


def snr_db(signal: np.ndarray, noisy: np.ndarray) -> float:
    err = np.sum((noisy.astype(np.float64) - signal) ** 2)
    return float(10 * np.log10(np.sum(signal.astype(np.float64) ** 2) / max(err, 1e-20)))


def test_gpu_fp32_matches_onnxruntime(model, voice_path):
    import onnxruntime as ort

    session = ort.InferenceSession(str(voice_path), providers=["CPUExecutionProvider"])
    for ids in bench_ids(3):
        feeds = {"input": np.array([ids], dtype=np.int64), "input_lengths": np.array([len(ids)], dtype=np.int64),
                 "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32)}  # fmt: skip
        ref = session.run(None, feeds)[0].reshape(-1)
        mine = whole(model, ids)
        assert mine.shape == ref.shape
        assert np.abs(mine - ref).max() < 1e-3


@pytest.mark.parametrize("chunks_per_step, main_in_flight, encoder_convs, output_rate",
                         [(1, 1, "cudnn", 0), (0, 1, "cudnn", 0), (1, 2, "cudnn", 0), (0, 2, "cudnn", 0),
                          (0, 2, "gemm", 0), (0, 2, "gemm", 24000)])  # fmt: skip
def test_gpu_engine_chunks_equal_whole_utterance(model, voice_path, chunks_per_step, main_in_flight, encoder_convs,
                                                 output_rate):  # fmt: skip
    """Chunks equal the whole utterance, one later chunk per step or all of them at once (rows of one
    request in launches of several sizes, copied back asynchronously, handed out in order), with one
    main launch at a time or two queued (each with its own event and staged buffers), and with the
    encoder's convolutions as cuBLAS products (``RunnerOptions.encoder_convs = "gemm"``; the reference keeps
    cuDNN's: the same durations, samples within the same 3 int16 steps); with ``output_rate``
    resampled in the decoder's graphs, equal to the whole utterance resampled at once."""
    from tts_engine.engine import SynthesisOptions

    eng = engine(voice_path, "fp32", chunks_per_step=chunks_per_step, main_in_flight=main_in_flight,
                 encoder_convs=encoder_convs, output_rate=output_rate)  # fmt: skip
    quiet = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
    try:
        assert all(s.graph is not None for s in [*eng.runner._encode_steps.values(), *eng.runner._decode_steps.values()])
        inputs = bench_ids(12)  # more than the 8 slots: some wait, all share steps
        requests = [eng.submit(ids, quiet) for ids in inputs]
        for ids, request in zip(inputs, requests):
            chunks = list(request)
            audio = np.concatenate([c.pcm for c in chunks]).astype(np.int32)
            resampled = eng.runner.resampler.whole(torch.from_numpy(whole(model, ids)).cuda()).cpu().numpy()
            ref = np.clip(resampled * 32767, -32767, 32767).astype(np.int32)
            assert {c.sample_rate for c in chunks} == {output_rate or 22050}
            assert audio.shape == ref.shape and len(chunks) > 1 and chunks[-1].final
            assert np.abs(audio - ref).max() <= 3
    finally:
        eng.close()


def test_gpu_compiled_encoder_and_decoder_keep_durations_and_audio(model, voice_path):
    """``tts.compile`` + ``tts.compile_encoder``: Inductor reorders fp32 arithmetic, so samples may move
    by a few int16 steps more than the eager engine's, but durations (ceil'd in the encoder) must not:
    the same number of samples per utterance, and the waveform at >= 50 dB SNR against the whole-utterance
    run (the eager engine's bound of 3 int16 steps is ~70 dB at speech level; fp16's floor is 30)."""
    if not runs_here(voice_path, "test_gpu_compiled_encoder_and_decoder_keep_durations_and_audio", compile=True):
        return
    from tts_engine.engine import SynthesisOptions

    eng = engine(voice_path, "fp32", compile=True, compile_encoder=True)
    quiet = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
    try:
        inputs = bench_ids(12)
        requests = [eng.submit(ids, quiet) for ids in inputs]
        for ids, request in zip(inputs, requests):
            audio = np.concatenate([c.pcm for c in request]).astype(np.float64) / 32767
            ref = np.clip(whole(model, ids), -1.0, 1.0)
            assert audio.shape == ref.shape
            assert snr_db(ref, audio) >= 50.0
    finally:
        eng.close()


@pytest.mark.parametrize("fast_lanes", [1, 2])
def test_gpu_fast_lane_overlaps_running_requests_and_changes_no_sample(model, voice_path, fast_lanes):
    """Requests arriving every 2 ms start on a fast lane (encoder + first chunk on a
    high-priority stream; with 2, on whichever is free) while the later chunks of earlier ones
    run on the main lane: each one's audio is still the whole-utterance audio (same bound as above)."""
    import time

    from tts_engine.engine import SynthesisOptions

    eng = engine(voice_path, "fp32", fast_lanes=fast_lanes)
    quiet = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
    try:
        runner = eng.runner
        assert len({id(runner._streams[lane]) for lane in runner.lanes}) == fast_lanes + 1
        assert {lane for _, _, lane in runner._decode_steps} == {*runner.fast_lanes, "main"}
        assert {lane for _, _, lane in runner._encode_steps} == set(runner.fast_lanes)
        inputs = bench_ids(12)
        requests = []
        for ids in inputs:
            requests.append(eng.submit(ids, quiet))
            time.sleep(0.002)
        for ids, request in zip(inputs, requests):
            audio = np.concatenate([c.pcm for c in request]).astype(np.int32)
            ref = np.clip(whole(model, ids) * 32767, -32767, 32767).astype(np.int32)
            assert audio.shape == ref.shape
            assert np.abs(audio - ref).max() <= 3
        if fast_lanes > 1:  # arrivals 2 ms apart met a busy first lane now and then
            assert eng.scheduler.lane_launches["fast1"] > 0
    finally:
        eng.close()


def test_gpu_decoding_ahead_waits_for_the_encoder_and_changes_no_sample(model, voice_path):
    """``speculate_frames``: a lone request's later chunks are queued on the main stream behind an
    event after its encoder (not after the host reads its length), beside its first chunk on the
    fast lane: the audio is still the whole utterance's, and fewer steps run than without it."""
    from tts_engine.engine import SynthesisOptions

    quiet = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
    steps = {}
    for ahead in (0, 512):
        eng = engine(voice_path, "fp32", chunk_frames=32, speculate_frames=ahead)
        try:
            for ids in bench_ids(6):  # one at a time: each alone on the GPU
                audio = np.concatenate([c.pcm for c in eng.submit(ids, quiet)]).astype(np.int32)
                ref = np.clip(whole(model, ids) * 32767, -32767, 32767).astype(np.int32)
                assert audio.shape == ref.shape
                assert np.abs(audio - ref).max() <= 3
            steps[ahead] = eng.scheduler.lane_launches["main"]
        finally:
            eng.close()
    assert steps[512] < steps[0], steps


def test_gpu_flow_once_changes_no_sample_and_keeps_fp16s_snr(model, voice_path):
    """``flow_once`` (the later chunks' flow run once per utterance in packed graphs): in fp32 with
    graphs, decoding ahead and 24 kHz output, every sentence equal to the whole utterance resampled
    (the same 3 int16 steps); in fp16 with configs/gpu.toml's fused kernels, each sentence >= the fp16
    floor against fp32 and the mean within 1 dB of the same engine without it (the flow rounded in
    other tiles; see ``test_gpu_polyphase_and_fused_blocks_keep_the_audio`` for how far that moves
    one sentence)."""
    from tts_engine.engine import SynthesisOptions

    if not runs_here(voice_path, "test_gpu_flow_once_changes_no_sample_and_keeps_fp16s_snr", "fp16", fused_blocks=True):
        return
    quiet = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
    inputs = bench_ids(8)
    refs = [whole(model, ids) for ids in inputs]

    def int16_at_24k(ref: np.ndarray) -> np.ndarray:
        resampled = eng.runner.resampler.whole(torch.from_numpy(ref).cuda()).cpu().numpy()
        return np.clip(resampled * 32767, -32767, 32767).astype(np.int32)

    eng = engine(voice_path, "fp32", chunks_per_step=0, main_in_flight=2, output_rate=24000, flow_once=True,
                 speculate_frames=256, chunk_frames=32)  # fmt: skip
    try:
        assert eng.runner._flow_steps and all(s.graph is not None for s in eng.runner._flow_steps.values())
        requests = [eng.submit(ids, quiet) for ids in inputs]  # together: packed flow launches
        for ref, request in zip(refs, requests):
            audio, expected = np.concatenate([c.pcm for c in request]).astype(np.int32), int16_at_24k(ref)
            assert audio.shape == expected.shape and np.abs(audio - expected).max() <= 3
        launches = eng.scheduler.launch_stats["flow_launches"]
        assert 0 < launches < len(inputs)  # requests of one main launch share a flow launch
        ahead = eng.scheduler.lane_launches["main"]
        longest = int(np.argmax([len(r) for r in refs]))
        assert len(refs[longest]) > (32 + 256) * 256, "it should outlast its first chunk and the frames decoded ahead"
        alone = np.concatenate([c.pcm for c in eng.submit(inputs[longest], quiet)]).astype(np.int32)  # decoded ahead
        expected = int16_at_24k(refs[longest])
        assert alone.shape == expected.shape and np.abs(alone - expected).max() <= 3
        assert eng.scheduler.launch_stats["flow_launches"] > launches  # the rest past what went ahead
        assert eng.scheduler.lane_launches["main"] - ahead >= 1
    finally:
        eng.close()
    snrs = {}
    for once in (False, True):
        eng = engine(voice_path, "fp16", flow_once=once, chunks_per_step=0, **FUSED_DECODER)
        try:
            outs = [np.concatenate([c.pcm for c in eng.submit(ids, quiet)]) for ids in inputs]
        finally:
            eng.close()
        snrs[once] = [snr_db(ref, audio / 32767.0) for ref, audio in zip(refs, outs)]
        assert all(a.shape == r.shape for a, r in zip(outs, refs))
    print("fp16 fused, SNR vs fp32 without / with flow_once: " + ", ".join(
        f"{a:.1f}/{b:.1f}" for a, b in zip(snrs[False], snrs[True])))  # fmt: skip
    assert min(snrs[True]) >= LOW_PRECISION_MIN_SNR_DB["fp16"]
    assert np.mean(snrs[True]) >= np.mean(snrs[False]) - 1.0


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_gpu_low_precision_quality(model, voice_path, precision):
    from tts_engine.engine import SynthesisOptions

    eng = engine(voice_path, precision)
    quiet = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
    try:
        for ids in bench_ids(4):
            audio = np.concatenate([c.pcm for c in eng.submit(ids, quiet)]) / 32767.0
            ref = whole(model, ids)
            assert audio.shape == ref.shape  # encoder in fp32: same durations
            snr = snr_db(ref, audio)
            print(f"{precision}: SNR vs fp32 {snr:.1f} dB, max abs {np.abs(audio - ref).max():.4f}")
            assert snr >= LOW_PRECISION_MIN_SNR_DB[precision]
    finally:
        eng.close()


def test_gpu_polyphase_and_fused_blocks_keep_the_audio(model, voice_path):
    """Polyphase upsampling in fp32: chunks equal the whole utterance as without it (within 3
    int16 steps); with fused Triton residual blocks too, fp16, with the fused input, upsampling
    and output convolutions on top (``fused_upsampling``), and with the fused flow on top of that
    (``fused_flow``): as close to fp32 as fp16 is without them, and the same length. Each sentence
    is >= the fp16 floor; the decoder's kernels keep each sentence within 1 dB of the plain fp16
    engine's SNR. The flow's fp16 error, amplified by the decoder, dominates the audio's: rounding
    it another way (the fused flow keeps fp32 between layers) moves a sentence's SNR by up to ~5 dB
    either way (H200: 48.6 and 40.6 dB against 43.6 and 43.5,
    commit 04af75d), so the fused flow is held to the
    mean over 8 sentences within 1 dB of the plain engine's. Resampled to 24 kHz in the decoder's
    steps (``output_rate``, configs/gpu.toml), each sentence against fp32 resampled at once by the same
    filter: >= the floor, the mean within 1 dB of the all-fused mean at the voice's rate."""
    from tts_engine.engine import SynthesisOptions
    from tts_engine.torch_vits.resample import ChunkResampler

    if not runs_here(voice_path, "test_gpu_polyphase_and_fused_blocks_keep_the_audio", "fp16", fused_blocks=True):
        return
    quiet = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
    inputs = bench_ids(8)
    refs = [whole(model, ids) for ids in inputs]

    def speak(eng) -> list[np.ndarray]:
        try:
            return [np.concatenate([c.pcm for c in eng.submit(ids, quiet)]) for ids in inputs]
        finally:
            eng.close()

    for audio, ref in zip(speak(engine(voice_path, "fp32", polyphase=True)), refs):
        assert audio.shape == ref.shape
        assert np.abs(audio.astype(np.int32) - np.clip(ref * 32767, -32767, 32767).astype(np.int32)).max() <= 3
    plain = speak(engine(voice_path, "fp16"))
    fast = speak(engine(voice_path, "fp16", polyphase=True, fused_blocks=True))
    faster = speak(engine(voice_path, "fp16", polyphase=True, fused_blocks=True, fused_upsampling=True))
    fastest = speak(engine(voice_path, "fp16", polyphase=True, fused_blocks=True, fused_upsampling=True,
                           fused_flow=True))  # fmt: skip
    table = []
    for a, b, c, d, ref in zip(plain, fast, faster, fastest, refs):
        snrs = [snr_db(ref, x / 32767.0) for x in (a, b, c, d)]
        table.append(snrs)
        print("fp16 SNR vs fp32: plain {:.1f} dB, polyphase + fused blocks {:.1f} dB, + fused upsampling {:.1f} dB, "
              "+ fused flow {:.1f} dB".format(*snrs))
        for audio, snr in zip((b, c, d), snrs[1:]):
            assert audio.shape == ref.shape
            assert snr >= LOW_PRECISION_MIN_SNR_DB["fp16"]
        assert snrs[1] >= snrs[0] - 1.0 and snrs[2] >= snrs[0] - 1.0
    mean_plain, mean_flow = np.mean([row[0] for row in table]), np.mean([row[3] for row in table])
    print(f"mean over {len(table)} sentences: plain {mean_plain:.2f} dB, all fused {mean_flow:.2f} dB")
    assert mean_flow >= mean_plain - 1.0
    # configs/gpu.toml's settings: all fused, resampled to 24 kHz in the decoder's steps; against fp32
    # resampled at once by the same filter, as close as at the voice's rate.
    at_24k = speak(engine(voice_path, "fp16", polyphase=True, fused_blocks=True, fused_upsampling=True,
                          fused_flow=True, output_rate=24000))  # fmt: skip
    resampler = ChunkResampler(22050, 24000, 256, "cuda")
    snrs_24k = []
    for audio, ref in zip(at_24k, refs):
        ref_24k = resampler.whole(torch.from_numpy(ref).cuda()).cpu().numpy()
        assert audio.shape == ref_24k.shape
        snrs_24k.append(snr_db(ref_24k, audio / 32767.0))
    print("all fused, 24 kHz: " + ", ".join(f"{x:.1f}" for x in snrs_24k) + f" dB, mean {np.mean(snrs_24k):.2f} dB")
    assert min(snrs_24k) >= LOW_PRECISION_MIN_SNR_DB["fp16"] and np.mean(snrs_24k) >= mean_flow - 1.0


def test_gpu_fused_duration_predictor_keeps_durations_and_audio(model, voice_path):
    """``RunnerOptions.fused_duration_predictor`` (``tts.triton_kernels``): the voice's duration predictor with fused Triton kernels gives
    the same frames per phoneme as PyTorch's for 40 sentences in one padded batch with noise (``noise_w``
    0.8), and the engine (fp32, cuBLAS encoder convolutions) speaks each sentence as the whole-utterance
    run does (same length, within 3 int16 steps)."""
    import copy

    from tts_engine.torch_vits.kernels import fused_duration
    from tts_engine.torch_vits.model import pad_ids

    if not runs_here(voice_path, "test_gpu_fused_duration_predictor_keeps_durations_and_audio", fused_duration_predictor=True):
        return
    ids = bench_ids(40)
    padded, lengths = pad_ids(ids, device="cuda")
    noise = torch.randn(len(ids), 2, padded.shape[1], device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    scales = torch.full((len(ids),), 0.8, device="cuda"), torch.ones(len(ids), device="cuda")
    fused = copy.deepcopy(model)
    assert fused_duration.use_fused_duration_predictor(fused.dp) == 4
    with torch.inference_mode():
        x, _, _, mask = model.encode(padded, lengths)
        want, got = (m.durations(x, mask, *scales, noise=noise) for m in (model, fused))
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])

    assert_speaks_as_whole(model, voice_path, encoder_convs="gemm", fused_duration_predictor=True)


def test_gpu_fused_text_encoder_keeps_the_encoder_bit_for_bit(model, voice_path):
    """``RunnerOptions.fused_text_encoder`` (``tts.triton_kernels``): the voice's text encoder with its feed-forward taps stacked by the
    fused kernel gives the same states, prior and mask, bit for bit, as with ``GemmConv1d`` for 40
    sentences padded to the 256-id bucket (so the same durations), and the engine (fp32, every encoder
    kernel of ``configs/gpu.toml``) speaks each sentence as the whole-utterance run does (same length,
    within 3 int16 steps)."""
    from tts_engine.torch_vits.kernels import fused_ffn

    if not runs_here(voice_path, "test_gpu_fused_text_encoder_keeps_the_encoder_bit_for_bit", fused_text_encoder=True):
        return
    plain, fused, padded, lengths = gemm_encoder_pair(model, fused_ffn.use_fused_ffn)
    with torch.inference_mode():
        want, got = plain.encode(padded, lengths), fused.encode(padded, lengths)
    assert all(torch.equal(a, b) for a, b in zip(want, got))

    assert_speaks_as_whole(model, voice_path, encoder_convs="gemm", fused_duration_predictor=True, fused_text_encoder=True)


@pytest.mark.parametrize("products", ["ieee", "tf32x3", "fp16x3"])
def test_gpu_text_encoder_products_stay_close_and_speak_as_whole(model, voice_path, products, monkeypatch):
    """``tts.text_encoder_products``: the voice's text encoder with its feed-forward as Triton convolutions
    (padding skipped; ``tl.dot`` in fp32, three TF32 or three fp16 products) gives the states of cuBLAS's products
    within 1e-5 of their peak (fp16x3: 1e-4; H100, 2026-12-05: its prior means 6.3e-5 of the peak off,
    its encoder states 6.0e-6) for 40 sentences padded to the 256-id bucket, and the engine (fp32, every
    encoder kernel of ``configs/gpu.toml``) speaks each of 6 sentences as the whole-utterance run does
    (same length, within 3 int16 steps, fp16x3 ``WHOLE_STEPS``); every batch through the Triton
    convolution (``MIN_ROWS`` 1)."""
    from tts_engine.torch_vits.kernels import fused_ffn

    name = f"test_gpu_text_encoder_products_stay_close_and_speak_as_whole[{products}]"
    if not runs_here(voice_path, name, fused_text_encoder=True, text_encoder_products=products):
        return
    monkeypatch.setattr(fused_ffn, "MIN_ROWS", 1)
    pair = gemm_encoder_pair(model, lambda enc: fused_ffn.use_fused_ffn(enc, products))
    assert_encoders_agree(*pair, 1e-4 if products == "fp16x3" else 1e-5)

    assert_speaks_as_whole(model, voice_path, WHOLE_STEPS.get(products, 3), encoder_convs="gemm",
                           fused_duration_predictor=True, fused_text_encoder=True, text_encoder_products=products,
                           fused_prior=True)  # fmt: skip


@pytest.mark.parametrize("tile", ["64x64w4-unrolled", "32x32w4-loop"])
def test_gpu_fused_attention_stays_close_and_speaks_as_whole(model, voice_path, tile):
    """``RunnerOptions.fused_attention`` (``tts.triton_kernels``): the voice's text encoder with its relative-position attention as one
    Triton kernel per layer gives PyTorch's states within 1e-5 of their peak for 40 sentences padded
    to the 256-id bucket, moves no phoneme's frame count without noise, and the engine (fp32, every
    encoder kernel of ``configs/gpu.toml``) speaks each of 6 sentences as the whole-utterance run does:
    in the kernel's default program (``fused_attention.TILE``, the engine's) and in the first one."""
    from tts_engine.torch_vits.kernels import fused_attention

    if not runs_here(voice_path, f"test_gpu_fused_attention_stays_close_and_speaks_as_whole[{tile}]",
                     fused_attention=True, fused_text_encoder=True, text_encoder_products="tf32x3",
                     fused_attention_tile=tile):  # fmt: skip
        return
    fuse = functools.partial(fused_attention.use_fused_attention, tile=tile)
    assert assert_encoders_agree(*gemm_encoder_pair(model, fuse), 1e-5) == 0

    assert_speaks_as_whole(model, voice_path, encoder_convs="gemm", fused_duration_predictor=True,
                           fused_text_encoder=True, text_encoder_products="tf32x3", fused_prior=True,
                           fused_attention=True, fused_attention_tile=tile)  # fmt: skip


def test_gpu_fused_prior_writes_the_same_latents(model, voice_path):
    """``RunnerOptions.fused_prior`` (``tts.triton_kernels``): the kernel's latents equal ``Vits.expand_prior`` copied into the slots, bit for bit,
    for the voice's prior of 40 sentences (the same noise), and the engine (fp32, every encoder kernel of
    ``configs/gpu.toml``) speaks each sentence as the whole-utterance run does (same length, within 3 int16 steps)."""
    from tts_engine.torch_vits.kernels import fused_prior
    from tts_engine.torch_vits.model import Vits, pad_ids

    if not runs_here(voice_path, "test_gpu_fused_prior_writes_the_same_latents", fused_prior=True):
        return
    padded, lengths = pad_ids(bench_ids(40), 256, device="cuda")
    frames = 1024
    with torch.inference_mode():
        x, m_p, logs_p, mask = model.encode(padded, lengths)
        scales = torch.full((40,), 0.8, device="cuda"), torch.ones(40, device="cuda")
        w_ceil, _ = model.durations(x, mask, *scales)
        noise = torch.randn(40, m_p.shape[1], frames, device="cuda", generator=torch.Generator("cuda").manual_seed(5))
        noise_scale = torch.full((40,), 0.667, device="cuda")
        slots = torch.randperm(48, device="cuda")[:40]
        want = torch.zeros(48, frames, m_p.shape[1], device="cuda")
        want.index_copy_(0, slots, Vits.expand_prior(m_p, logs_p, w_ceil, frames, noise_scale, noise=noise).transpose(1, 2))
        got = torch.zeros_like(want)
        fused_prior.expand_prior_into(got, slots, m_p, logs_p, w_ceil, noise_scale, noise=noise)
    assert torch.equal(want, got)

    assert_speaks_as_whole(model, voice_path, encoder_convs="gemm", fused_duration_predictor=True,
                           fused_text_encoder=True, fused_prior=True)


def test_gpu_cancel_frees_slot(voice_path):
    eng = engine(voice_path, "fp16", max_batch=2, chunk_frames=16, tail_chunk_frames=16)
    try:
        ids = bench_ids(3)
        a, b = eng.submit(ids[0]), eng.submit(ids[1])
        next(iter(a))
        a.cancel()
        c = eng.submit(ids[2])  # gets a's slot
        assert list(a) == []
        assert list(b)[-1].final and list(c)[-1].final
    finally:
        eng.close()


def test_gpu_one_async_pool_is_observed(voice_path):
    """The engine's memory goes through the stream-ordered pool and cuda-python reads its counters
    (verified on the H200: used 1180 MiB, graph pool 1632 MiB at max_batch 8 after earlier engines)."""
    e = engine(voice_path, "fp16", max_batch=8)
    try:
        report = e.memory_report()
        pool = report["pool"]
        print("memory report", json.dumps(report))
        assert pool["allocator"] == "cudaMallocAsync"
        assert pool["used"] > report["stages_mb"]["state"] * 0.9 > 0  # weights + slot buffers live in the pool
        assert pool["reserved_high"] >= pool["reserved"] >= pool["used"] > 0
        assert pool["graph_reserved"] > 0  # the captured graphs' memory
        for _ in e.synthesize_ids(bench_ids(1)[0]):
            pass
        assert e.memory_report()["pool"]["used_high"] >= pool["used"]
    finally:
        e.close()


def test_gpu_graph_budgets_need_the_native_allocator(voice_path):
    from tts_engine.torch_vits.cuda_engine import CudaTtsEngine
    from tts_engine.torch_vits.runner import RunnerOptions
    from tts_engine.voice import Voice
    from base.errors import ConfigError

    opts = RunnerOptions(chunk_frames=64, max_frames=512, decode_batches=(1, 2), encode_batches=(1,),
                         phoneme_buckets=(64, 128, 256), decode_budget_mb=100)  # fmt: skip
    with pytest.raises(ConfigError, match="allocator = 'native'"):
        CudaTtsEngine(Voice.load(voice_path), opts, device="cuda")


def test_gpu_fused_resampler_is_the_same_resampler():
    """The resampler's Triton kernel (used with ``fused_upsampling``) against its PyTorch path on the
    GPU: every handed-out sample of 256-frame chunks at most one int16 step apart."""
    from tts_engine.torch_vits import resample

    plain = resample.ChunkResampler(22050, 24000, 256, "cuda")
    fused = resample.ChunkResampler(22050, 24000, 256, "cuda", fused=True)
    torch.manual_seed(0)
    audio = (torch.rand(3, (256 + 2 * plain.edge_frames) * 256, device="cuda") - 0.5).half()  # small: the kernel's
    starts = torch.arange(3, device="cuda") * 7
    frames = starts + torch.arange(3, device="cuda") * 120 + 1  # some utterances end inside their chunk
    assert 3 * plain.row_samples(256) <= resample.FUSED_MAX_SAMPLES  # the fused kernel runs, not the product
    want, got = plain.int16(audio, starts, frames, 256).cpu(), fused.int16(audio, starts, frames, 256).cpu()
    for row, (s, f) in enumerate(zip(starts.tolist(), frames.tolist())):
        span = plain.span(s, min(s + 256, f))
        assert span.stop > span.start and (span.of(got[row]).int() - span.of(want[row]).int()).abs().max() <= 1
