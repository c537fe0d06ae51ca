"""PyTorch VITS on CPU: parity with onnxruntime, chunked == whole, checkpoints, scheduler, export."""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

from conftest import scaled  # noqa: E402
from bench.harness import load_sentences  # noqa: E402
from bench.tts_backends import scheduler_breakdown, scheduler_counters  # noqa: E402
from tts_engine.engine import SynthesisOptions  # noqa: E402
from tts_engine.torch_vits import chunked  # noqa: E402
from tts_engine.torch_vits.kernels.gemm_conv import GemmConv1d, use_gemm_convs  # noqa: E402
from tts_engine.torch_vits.model import Vits, VitsConfig, pad_ids  # noqa: E402
from tts_engine.torch_vits.resample import ChunkResampler  # noqa: E402
from tts_engine.torch_vits.runner import RunnerOptions, StepRunner, bucket_for  # noqa: E402
from tts_engine.torch_vits.scheduler import BatchScheduler, Scales  # noqa: E402
from tts_engine.torch_vits.weights import load_vits, save_checkpoint, state_dict_from_checkpoint  # noqa: E402
from base.errors import InvalidInput, Overloaded  # noqa: E402

#: A small random-weight model with the voice's structure (fast scheduler tests).
TINY = VitsConfig(
    n_vocab=64, inter_channels=16, hidden_channels=16, filter_channels=32, n_layers=2,
    upsample_initial_channel=32, dp_filter_channels=16,
)  # fmt: skip


def bench_ids(n: int) -> list[list[int]]:
    """Phoneme ids of the first ``n`` benchmark sentences (frozen espeak-ng output)."""
    return [s["ids"] for s in load_sentences()[:n]]


@pytest.fixture(scope="module")
def voice_path(cfg) -> Path:
    from base import models

    return models.resolve_voice(cfg).path


@pytest.fixture(scope="module")
def model(voice_path) -> Vits:
    torch.set_num_threads(2)
    return load_vits(voice_path)


def tiny_model(seed: int = 0) -> Vits:
    torch.manual_seed(seed)
    m = Vits(TINY)
    with torch.no_grad():  # give the zero-initialised layers some weight, as trained ones have
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m.eval()


# ---------------------------------------------------------------- model parity


@pytest.mark.slow
@pytest.mark.parametrize("length_scale", [1.0, 1.3])
def test_parity_with_onnxruntime(model, voice_path, length_scale):
    import onnxruntime as ort

    session = ort.InferenceSession(str(voice_path), providers=["CPUExecutionProvider"])
    for ids in [bench_ids(40)[-1], [1, 0, 20, 0, 14, 0, 2]]:  # longest sentence, and a 2-phoneme clause
        feeds = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array([0.0, length_scale, 0.0], dtype=np.float32),
        }
        ref = session.run(None, feeds)[0].reshape(-1)
        audio, samples = model.infer(torch.tensor([ids]), torch.tensor([len(ids)]), 0.0, length_scale, 0.0)
        assert int(samples[0]) == ref.shape[0] == audio.shape[1]
        assert np.abs(audio[0].numpy() - ref).max() < 1e-3


@pytest.mark.slow
def test_batched_infer_equals_single(model):
    ids = bench_ids(2)
    padded, lengths = pad_ids(ids)
    batch, samples = model.infer(padded, lengths, 0.0, 1.0, 0.0)
    for row, i in enumerate(ids):
        single, n = model.infer(torch.tensor([i]), torch.tensor([len(i)]), 0.0, 1.0, 0.0)
        assert int(samples[row]) == int(n[0])
        assert (batch[row, : int(n[0])] - single[0]).abs().max() < 1e-4


@pytest.mark.parametrize("in_ch, out_ch, kernel, dilation, padding, groups, bias",
                         [(5, 7, 1, 1, 0, 1, True), (6, 9, 3, 1, 0, 1, True), (6, 9, 3, 1, 1, 1, False),
                          (8, 8, 3, 3, 3, 8, True), (8, 8, 3, 9, 9, 8, True), (4, 4, 5, 2, 4, 4, False)])  # fmt: skip
def test_gemm_conv_is_the_convolution(in_ch, out_ch, kernel, dilation, padding, groups, bias):
    """``GemmConv1d`` computes ``nn.Conv1d``'s sums (float64): plain, padded, bias-free and
    depthwise dilated, as the text encoder and the duration predictor use them."""
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(in_ch, out_ch, kernel, dilation=dilation, padding=padding, groups=groups, bias=bias).double()
    x = torch.randn(3, in_ch, 37, dtype=torch.float64)
    with torch.inference_mode():
        want, got = conv(x), GemmConv1d(conv)(x)
    assert got.shape == want.shape
    assert (got - want).abs().max() < 1e-12


@pytest.mark.parametrize("conv", [torch.nn.Conv1d(4, 4, 3, stride=2), torch.nn.Conv1d(4, 6, 3, groups=2),
                                  torch.nn.Conv1d(4, 4, 3, padding="same")])  # fmt: skip
def test_gemm_conv_refuses_what_it_does_not_compute(conv):
    with pytest.raises(ValueError, match="GemmConv1d"):
        GemmConv1d(conv)


def test_relative_position_indices_are_built_once_per_length(monkeypatch):
    """The attention's relative-position indices are constants of a length: kept after the first
    launch, equal to fresh ones; rebuilt (not kept) while exporting to ONNX, where lengths are symbolic."""
    from tts_engine.torch_vits import text_encoder

    first = text_encoder._relative_indices(23, 4, torch.device("cpu"))
    assert text_encoder._relative_indices(23, 4, torch.device("cpu")) is first
    fresh = (*text_encoder._band_indices(23, 4, torch.device("cpu")), *text_encoder._offset_indices(23, 4, torch.device("cpu")))
    assert all(torch.equal(a, b) for a, b in zip(first, fresh))
    monkeypatch.setattr(torch.onnx, "is_in_onnx_export", lambda: True)
    exported = text_encoder._relative_indices(997, 4, torch.device("cpu"))
    assert (997, 4, "cpu") not in text_encoder._RELATIVE_INDICES and exported[0].shape == (997, 997)


@pytest.mark.slow
def test_gemm_encoder_keeps_the_voices_durations(model):
    """The voice's text encoder and stochastic duration predictor with ``use_gemm_convs`` (fp32,
    the stochastic path with noise): the same frames per phoneme for 40 sentences in one padded
    batch, the prior's statistics equal up to fp32 rounding."""
    import copy

    gemm = copy.deepcopy(model)
    convs = sum(isinstance(m, torch.nn.Conv1d) for part in (model.enc_p, model.dp) for m in part.modules())
    assert use_gemm_convs(gemm.enc_p) + use_gemm_convs(gemm.dp) == convs > 30
    assert not any(isinstance(m, torch.nn.Conv1d) for part in (gemm.enc_p, gemm.dp) for m in part.modules())
    ids = bench_ids(40)
    padded, lengths = pad_ids(ids)
    noise = torch.randn(len(ids), 2, padded.shape[1], generator=torch.Generator().manual_seed(3))
    scales = torch.full((len(ids),), 0.8), torch.ones(len(ids))
    with torch.inference_mode():
        results = []
        for m in (model, gemm):
            x, m_p, logs_p, mask = m.encode(padded, lengths)
            results.append((m_p, logs_p, *m.durations(x, mask, *scales, noise=noise)))
    (m_a, logs_a, w_a, frames_a), (m_b, logs_b, w_b, frames_b) = results
    assert torch.equal(w_a, w_b) and torch.equal(frames_a, frames_b)
    assert (m_a - m_b).abs().max() < 1e-4 and (logs_a - logs_b).abs().max() < 1e-4


# ---------------------------------------------------------------- chunked == whole


@pytest.mark.slow
@pytest.mark.parametrize("chunk_frames", [7, 64])
def test_chunked_equals_whole_in_float64(model, chunk_frames):
    """Exact up to float64 rounding; one frame less of decoder context is visibly wrong."""
    m = Vits(model.config).double().eval()
    m.load_state_dict(model.state_dict())
    frames = 150  # not a multiple of either chunk size: the last chunk ends inside its window
    z_p = torch.randn(1, m.config.inter_channels, frames, dtype=torch.float64)
    with torch.inference_mode():
        whole = m.synthesize_latents(z_p, torch.ones(1, 1, frames, dtype=torch.float64))[0]
        chunked_audio = chunked.decode_chunked(m, z_p, frames, chunk_frames)
        assert chunked_audio.shape == whole.shape
        assert (chunked_audio - whole).abs().max() < 1e-10

        exact = chunked.ChunkGeometry.for_model
        short = replace(exact(m, chunk_frames), dec_context=exact(m, chunk_frames).dec_context - 1)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(chunked.ChunkGeometry, "for_model", staticmethod(lambda *_: short))
            wrong = chunked.decode_chunked(m, z_p, frames, chunk_frames)
        assert (wrong - whole).abs().max() > 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("chunk_frames, edge_frames, frames", [(7, 0, 150), (32, 1, 150), (64, 1, 20)])
def test_first_chunk_without_context_before_it_equals_the_symmetric_window(model, chunk_frames, edge_frames, frames):
    """A first geometry (start 0, no window before the chunk) computes what the symmetric window
    computes there, in float64, on a window shorter by its context; its edge before frame 0 is
    zeros, where the symmetric window has the decoder's output for masked frames. Also for an
    utterance shorter than the chunk."""
    m = Vits(model.config).double().eval()
    m.load_state_dict(model.state_dict())
    symmetric = chunked.ChunkGeometry.for_model(m, chunk_frames, edge_frames)
    first = chunked.ChunkGeometry.for_model(m, chunk_frames, edge_frames, first=True)
    assert first.left_context == 0 and first.window_frames == symmetric.window_frames - symmetric.context
    latents = torch.randn(1, frames, m.config.inter_channels, dtype=torch.float64)
    zero = torch.zeros(1, dtype=torch.long)
    with torch.inference_mode():
        rows = [chunked.decode_windows(m, *chunked.gather_windows(latents, zero, zero, zero + frames, g), g)[0]
                for g in (symmetric, first)]  # fmt: skip
    edge = edge_frames * m.hop_length
    assert rows[0].shape == rows[1].shape == ((chunk_frames + 2 * edge_frames) * m.hop_length,)
    assert (rows[1][:edge] == 0).all()
    inside = edge + min(chunk_frames + edge_frames, frames) * m.hop_length  # the row's samples of the utterance
    assert (rows[1][edge:inside] - rows[0][edge:inside]).abs().max() < 1e-10
    assert rows[0][edge:inside].abs().max() > 1e-3  # audio, not silence


@pytest.mark.parametrize("dilation_rate, gin", [(1, 0), (2, 0), (1, 4)])
def test_packed_flow_is_each_utterances_own_flow(dilation_rate, gin):
    """``pack_flow``: utterances laid end to end, each after ``conv_radius`` masked frames, in launches
    of the buckets (here small: several launches, one utterance alone in the largest), give through
    the flow, in float64, each utterance's own flow output on its kept frames, whatever stands
    next to it; one masked frame fewer between them does not. Positions not kept go to scratch rows
    of their own. A multi-speaker flow takes each position's speaker (``StepRunner._flow_fn``)."""
    from tts_engine.torch_vits.flow import ResidualCouplingBlock

    flow = ResidualCouplingBlock(8, 8, 5, dilation_rate, 3, gin_channels=gin).double().eval()
    speakers = torch.randn(6, gin, dtype=torch.float64)  # per slot
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    slots, max_frames, channels = 5, 200, 8
    latents = torch.randn(slots + 1, max_frames, channels, dtype=torch.float64)
    segments = [(0, 0, 37), (3, 50, 180), (1, 10, 90), (2, 0, 5), (4, 120, 200)]  # (slot, keep_from, frames)
    buckets = (64, 128, 256)
    scratch = (slots + 1) * max_frames

    def run(gap: int) -> torch.Tensor:
        flowed = torch.full((scratch + buckets[-1], channels), float("nan"), dtype=torch.float64)
        packs = chunked.pack_flow(segments, max_frames, buckets, flow.receptive_radius, gap)
        assert len(packs) > 1 and all(p.frames in buckets for p in packs)
        for p in packs:
            src, valid, dst = chunked.flow_positions(torch.from_numpy(p.table), p.frames, max_frames, scratch, slots)
            assert len(set(dst.tolist())) == p.frames and int(valid.sum()) == p.used  # every position its own row
            z = (latents.view(-1, channels)[src] * valid[:, None].double()).t().unsqueeze(0)
            g = speakers[src // max_frames].t().unsqueeze(0) if gin else None  # [1, gin, P]
            with torch.inference_mode():
                out = flow.reverse(z, valid.double().view(1, 1, -1), g=g)
            flowed[dst] = out[0].t()
        return flowed

    assert flow.conv_radius == 2 * dilation_rate ** 2
    flowed, short = run(flow.conv_radius), run(flow.conv_radius - 1)
    worst_short = 0.0
    for slot, keep_from, frames in segments:
        z = latents[slot, :frames].t().unsqueeze(0)
        g = speakers[slot].view(1, gin, 1) if gin else None
        with torch.inference_mode():
            whole = flow.reverse(z, torch.ones(1, 1, frames, dtype=torch.float64), g=g)[0].t()
        rows = slice(slot * max_frames + keep_from, slot * max_frames + frames)
        assert (flowed[rows] - whole[keep_from:]).abs().max() < 1e-12
        assert flowed[slot * max_frames : slot * max_frames + keep_from].isnan().all()  # nothing else written
        worst_short = max(worst_short, float((short[rows] - whole[keep_from:]).abs().max()))
    assert worst_short > 1e-6


def test_pack_flow_refuses_what_no_bucket_holds_and_starts_a_launch_per_table():
    with pytest.raises(ValueError, match="largest flow bucket"):
        chunked.pack_flow([(0, 0, 100)], 200, (64,), 8, 2)
    with pytest.raises(ValueError, match="outside the utterance"):
        chunked.pack_flow([(0, 30, 30)], 200, (64,), 8, 2)
    many = [(i % 4, 0, 3) for i in range(chunked.FLOW_PACK_SEGMENTS + 1)]  # tiny utterances: the table fills first
    packs = chunked.pack_flow(many, 200, (512, 1024), 8, 2)
    assert [p.frames for p in packs] == [512, 512] and [p.used for p in packs] == [3 * (len(many) - 1), 3]
    src, valid, dst = chunked.flow_positions(torch.from_numpy(packs[1].table), 512, 200, 1000, 4)
    assert valid.tolist() == [1.0] * 3 + [0.0] * 509 and src[:3].tolist() == [0, 1, 2] and dst[:3].tolist() == [0, 1, 2]
    assert (src[3:] == 4 * 200).all() and dst[3:].tolist() == list(range(1003, 1512))
    # the table the runner warms its graphs up with (padding only): every position masked, read from the
    # scratch slot and written to a scratch row (its positions lie before the first row's "at")
    src, valid, dst = chunked.flow_positions(torch.from_numpy(chunked.padding_table(512)), 512, 200, 1000, 4)
    assert not valid.any() and (src == 4 * 200).all() and dst.tolist() == list(range(1000, 1512))


@pytest.mark.parametrize("kernel, stride, padding", [(16, 8, 4), (8, 4, 2), (6, 3, 0), (6, 2, 2)])
def test_polyphase_upsampling_is_the_transposed_convolution(kernel, stride, padding):
    """``PolyphaseUp`` computes what ``ConvTranspose1d`` does (float64), also when the kernel spans
    more than two strides or the padding is not half a stride; other shapes are refused."""
    from torch import nn

    from tts_engine.torch_vits.decoder import PolyphaseUp

    gen = torch.Generator().manual_seed(1)
    up = nn.ConvTranspose1d(5, 3, kernel, stride, padding=padding).double()
    x = torch.randn(2, 5, 9, dtype=torch.float64, generator=gen)
    with torch.inference_mode():
        want, got = up(x), PolyphaseUp(up)(x)
    assert got.shape == want.shape
    assert (got - want).abs().max() < 1e-12
    assert not PolyphaseUp.supports(nn.ConvTranspose1d(5, 3, 5, 2))
    with pytest.raises(ValueError, match="no polyphase form"):
        PolyphaseUp(nn.ConvTranspose1d(5, 3, 5, 2))


@pytest.mark.slow
def test_voice_decoder_with_polyphase_upsampling_matches_chunk_by_chunk(model):
    """The real voice's decoder, masked 64-frame windows as the engine runs them: polyphase
    upsampling changes no sample beyond float64 rounding."""
    m = Vits(model.config).double().eval()
    m.load_state_dict(model.state_dict())
    frames = 150
    z_p = torch.randn(1, m.config.inter_channels, frames, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        plain = chunked.decode_chunked(m, z_p, frames, 64)
        m.dec.use_polyphase()
        assert m.dec.polyphase is not None
        poly = chunked.decode_chunked(m, z_p, frames, 64)
    assert (poly - plain).abs().max() < 1e-10


def test_receptive_radius_matches_perturbation():
    """Perturb one latent frame: audio changes exactly within the computed radius (tiny model, float64)."""
    m = tiny_model().double()
    frames, probe = 80, 40
    z = torch.randn(1, TINY.inter_channels, frames, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        base = m.dec(z)[0]
        assert base.abs().max() < 0.99  # tanh not saturated: every dependency shows
        bumped = z.clone()
        bumped[:, :, probe] += 1.0
        changed = ((m.dec(bumped)[0] - base).abs() > 0).nonzero()[:, 0] // m.hop_length
    radius = m.dec.receptive_radius
    assert int(changed.min()) == probe - radius and int(changed.max()) == probe + radius


# ---------------------------------------------------------------- checkpoints


def test_piper_checkpoint_with_weight_norm_loads(tmp_path):
    from torch.nn.utils import parametrizations, weight_norm

    m = tiny_model()
    trained = Vits(TINY)
    trained.load_state_dict(m.state_dict())
    normed = [*trained.dec.ups, *[c for rb in trained.dec.resblocks for c in rb.convs]]
    for wn in [c for layer in trained.flow.flows[::2] for c in (*layer.enc.in_layers, *layer.enc.res_skip_layers)]:
        parametrizations.weight_norm(wn)  # new spelling
    for conv in normed:
        weight_norm(conv)  # old spelling: weight_g / weight_v
    state = {f"model_g.{k}": v for k, v in trained.state_dict().items()}
    state["model_g.enc_q.pre.weight"] = torch.zeros(1)  # training-only parts are dropped
    state["model_d.discriminators.0.conv_post.weight"] = torch.zeros(1)
    hparams = {"resblock_dilation_sizes": [list(d) for d in TINY.resblock_dilation_sizes]}
    torch.save({"state_dict": state, "hyper_parameters": hparams}, tmp_path / "voice.ckpt")

    config, loaded = state_dict_from_checkpoint(tmp_path / "voice.ckpt")
    assert config == TINY
    restored = load_vits(tmp_path / "voice.ckpt")
    ids = torch.randint(1, TINY.n_vocab, (1, 30))
    a, _ = m.infer(ids, torch.tensor([30]), 0.0, 1.0, 0.0)
    b, _ = restored.infer(ids, torch.tensor([30]), 0.0, 1.0, 0.0)
    assert (a - b).abs().max() < 1e-5

    save_checkpoint(m, tmp_path / "tiny.pt", dtype=torch.float16)
    half = load_vits(tmp_path / "tiny.pt")
    c, _ = half.infer(ids, torch.tensor([30]), 0.0, 1.0, 0.0)
    assert c.shape == a.shape and (c - a).abs().max() < 0.05


# ---------------------------------------------------------------- scheduler (eager, CPU)


def tiny_runner(**kw) -> StepRunner:
    opts = RunnerOptions(**{"chunk_frames": 16, "max_frames": 512, "decode_batches": (1, 2, 4), "encode_batches": (1, 2, 4),
                            "phoneme_buckets": (32, 64), **kw})  # fmt: skip
    return StepRunner(tiny_model(), opts)


def speak_random_clauses(runner: StepRunner, sample_rate: int, seed: int) -> tuple[list[list[int]], list[list]]:
    """Six clauses of random ids (more than the tiny runner's slots: some queue) through a scheduler
    on ``runner``, noise off; returns the ids and each clause's chunks."""
    scheduler = BatchScheduler(runner, sample_rate=sample_rate, queue_size=16)
    rng = np.random.default_rng(seed)
    inputs = [list(rng.integers(1, TINY.n_vocab, n)) for n in (9, 30, 57, 12, 44, 20)]
    try:
        requests = [scheduler.submit(ids, Scales(0.0, 1.0, 0.0)) for ids in inputs]
        return inputs, [list(r) for r in requests]
    finally:
        scheduler.close()


@pytest.mark.parametrize("tail_chunk_frames, polyphase, chunks_per_step, main_in_flight, encoder_convs, batches",
                         [(0, False, 1, 1, "cudnn", (1, 2, 4)), (64, False, 1, 1, "cudnn", (1, 2, 4)),
                          (64, True, 1, 1, "cudnn", (1, 2, 4)), (32, False, 0, 1, "cudnn", (1, 2, 4)),
                          (32, False, 2, 1, "cudnn", (1, 2, 4)), (32, False, 1, 2, "cudnn", (1, 2, 4)),
                          (32, False, 0, 3, "cudnn", (1, 2, 4)), (32, True, 0, 2, "gemm", (1, 2, 4)),
                          (32, True, 0, 2, "gemm", (1, 2, 3, 4)), (64, False, 1, 1, "flow_once", (1, 2, 4)),
                          (32, True, 0, 2, "flow_once", (1, 2, 3, 4))])  # fmt: skip
def test_scheduler_batched_chunks_equal_whole_utterances(tail_chunk_frames, polyphase, chunks_per_step, main_in_flight,
                                                         encoder_convs, batches):  # fmt: skip
    """Chunks of batched requests make each whole utterance (``model.infer`` of the model as
    loaded: the plain decoder and ``nn.Conv1d`` encoder, also when the runner's upsamples
    polyphase or its encoder convolves by matrix products), in the same chunk sizes however many
    of a request's chunks one step decodes, however many main launches may be queued and whatever
    batch sizes are captured (every size, as ``batch_buckets`` "finer" has them at small batches);
    also with ``flow_once`` (the later chunks' flow run once per utterance, packed)."""
    flow_once = encoder_convs == "flow_once"
    encoder_convs = "cudnn" if flow_once else encoder_convs
    runner = tiny_runner(tail_chunk_frames=tail_chunk_frames, polyphase=polyphase, chunks_per_step=chunks_per_step,
                         main_in_flight=main_in_flight, encoder_convs=encoder_convs, decode_batches=batches,
                         encode_batches=batches, flow_once=flow_once)  # fmt: skip
    assert runner.geometry.flowed == flow_once and (runner.geometry.flow_context == 0) == flow_once
    flowed: list[int] = []  # requests per flow call
    flow = runner.flow
    runner.flow = lambda segments: flowed.append(len(segments)) or flow(segments)
    reference = tiny_model()  # tiny_runner's weights
    assert (runner.synth_model.dec.polyphase is not None) == polyphase
    gemm_convs = [m for m in runner.model.modules() if isinstance(m, GemmConv1d)]
    assert len(gemm_convs) == (0 if encoder_convs == "cudnn" else sum(
        isinstance(m, torch.nn.Conv1d) for part in (reference.enc_p, reference.dp) for m in part.modules()))
    inputs, results = speak_random_clauses(runner, 22050, seed=1)
    for ids, chunks in zip(inputs, results):
        whole, samples = reference.infer(torch.tensor([ids]), torch.tensor([len(ids)]), 0.0, 1.0, 0.0)
        audio = np.concatenate([c.pcm for c in chunks])
        expected = chunked.to_int16(whole[0]).numpy()
        assert audio.shape[0] == int(samples[0])
        assert np.abs(audio.astype(np.int32) - expected).max() <= 1  # float rounding before truncation
        frames, done, sizes = int(samples[0]) // runner.geometry.hop_length, 0, []
        while done < frames:
            sizes.append(min(runner.options.next_chunk(done, frames), frames - done))
            done += sizes[-1]
        assert [c.num_samples // runner.geometry.hop_length for c in chunks] == sizes
        assert [min(size, frames - start) for start, size in runner.options.chunk_plan(frames)] == sizes
        assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    # with flow_once each clause with later chunks had its flow queued once; else none was
    assert sum(flowed) == (sum(len(chunks) > 1 for chunks in results) if flow_once else 0)


def test_flow_once_runs_the_flow_once_per_utterance_and_reports_its_launches():
    """``flow_once``: one packed launch per main step holds the flow of every request starting its
    later chunks there, from the flow and decoder context before its first later chunk to its end;
    the benchmark's breakdown reports launches per step and the packing's gaps and padding."""
    runner = tiny_runner(tail_chunk_frames=32, chunks_per_step=0, flow_once=True)
    assert runner.options.flow_buckets[0] == 512 and len(runner.options.flow_buckets) == 8  # 512 ... 4096
    scheduler = BatchScheduler(runner, sample_rate=22050, queue_size=16)
    before = scheduler_counters(scheduler)
    rng = np.random.default_rng(5)
    try:
        requests = [scheduler.submit(list(rng.integers(1, TINY.n_vocab, n)), Scales(0.0, 1.0, 0.0)) for n in (40, 57)]
        for r in requests:
            list(r)
        stats = dict(scheduler.launch_stats)
        report = scheduler_breakdown(before, scheduler_counters(scheduler))
    finally:
        scheduler.close()
    g, flow = runner.geometry, runner.synth_model.flow
    later = [r.frames for r in requests if r.frames > 16]
    assert later, "the utterances should outlast their first chunk"
    # from 16 - decoder context (here before frame 0) less the flow's context, to the end
    used = sum(f - max(0, 16 - g.dec_context - g.edge_frames - flow.receptive_radius) for f in later)
    assert stats["flow_frames_used"] == used and 1 <= stats["flow_launches"] <= len(later)
    assert stats["flow_frames"] == 512 * stats["flow_launches"]  # short utterances: the smallest bucket
    assert report["flow_padding_pct"] == round(100 * (stats["flow_frames"] - used) / stats["flow_frames"], 1)
    assert report["flow_launches_per_step"] > 0


def test_a_launchs_chunks_reach_iterating_clients_together(monkeypatch):
    """Chunks of one hand-out enter the requests' queues together at its flush, none while its
    rows are still being copied out (a client woken per row would take the interpreter lock back
    between the copies)."""
    events: list = []
    requests: list = []
    deliver, flush = BatchScheduler._deliver_row, BatchScheduler._flush

    def deliver_row(self, request, *args):
        events.append(sum(r._chunks.qsize() for r in requests))  # chunks queued so far, before this row
        return deliver(self, request, *args)

    def flushed(self):
        events.append("flush")
        return flush(self)

    monkeypatch.setattr(BatchScheduler, "_deliver_row", deliver_row)
    monkeypatch.setattr(BatchScheduler, "_flush", flushed)
    runner = tiny_runner(tail_chunk_frames=32, chunks_per_step=0)
    scheduler = BatchScheduler(runner, sample_rate=22050, queue_size=16)
    rng = np.random.default_rng(3)
    try:
        requests += [scheduler.submit(list(rng.integers(1, TINY.n_vocab, n)), Scales(0.0, 1.0, 0.0)) for n in (30, 44, 57, 20)]
        # every row copied out before the test consumes any chunk (a chunk taken mid-hand-out would move the counts)
        wait_until(lambda: all(r.frames is not None and r.next_frame >= r.frames for r in requests))
        outs = [list(r) for r in requests]
    finally:
        scheduler.close()
    assert all(out and out[-1].final for out in outs)
    handouts, current = [], []
    for e in events:
        if e == "flush":
            handouts.append(current)
            current = []
        else:
            current.append(e)
    rows = [h for h in handouts if len(h) > 1]
    assert rows, handouts  # some hand-out had several rows
    assert all(len(set(h)) == 1 for h in rows), handouts  # nothing entered a queue between a hand-out's rows


@pytest.mark.parametrize("voice_rate, output_rate, flow_once", [(22050, 24000, False), (22050, 16000, False),
                                                                 (22050, 24000, True)])  # fmt: skip
def test_scheduler_resampled_chunks_equal_the_whole_utterance_resampled(voice_rate, output_rate, flow_once):
    """With ``output_rate`` each decoder step resamples its rows (``resample.ChunkResampler``): the
    chunks handed out are at ``output_rate`` and join into the whole utterance resampled at once
    (also with ``flow_once``, whose flowed frames must reach the resampler's edge before a chunk)."""
    runner = tiny_runner(tail_chunk_frames=32, chunks_per_step=0, main_in_flight=2, voice_rate=voice_rate,
                         output_rate=output_rate, flow_once=flow_once)  # fmt: skip
    assert runner.resampler.edge_frames > 0 and runner.geometry.edge_frames == runner.resampler.edge_frames
    reference = tiny_model()
    inputs, results = speak_random_clauses(runner, output_rate, seed=2)
    for ids, chunks in zip(inputs, results):
        whole, samples = reference.infer(torch.tensor([ids]), torch.tensor([len(ids)]), 0.0, 1.0, 0.0)
        expected = chunked.to_int16(runner.resampler.whole(whole[0, : int(samples[0])])).numpy()
        audio = np.concatenate([c.pcm for c in chunks])
        assert {c.sample_rate for c in chunks} == {output_rate} and len(chunks) > 1
        assert audio.shape == expected.shape == (-(-int(samples[0]) * output_rate // voice_rate),)
        assert np.abs(audio.astype(np.int32) - expected).max() <= 1  # float rounding before truncation


class _CountingRunner(StepRunner):
    """The real CPU runner, recording each main-lane launch as (chunk frames, start frames)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.main: list[tuple[int, list[int]]] = []

    def decode(self, slots, starts, chunk=None, lane="main", after=(), ahead=False):
        if lane == "main":
            self.main.append((chunk, list(starts)))
        return super().decode(slots, starts, chunk, lane, after, ahead)


@pytest.mark.parametrize("chunks_per_step", [0, 1, 2])
def test_chunks_per_step_decodes_a_requests_chunks_together(chunks_per_step):
    """``chunks_per_step``: once a request's length is known, the next step decodes that many of
    its later chunks (0: all), one row per start frame, a launch per chunk size; they are handed
    out in order and make the whole utterance in the same chunk sizes as one chunk per step."""
    opts = RunnerOptions(chunk_frames=16, tail_chunk_frames=32, max_frames=512, decode_batches=(1, 2, 4),
                         encode_batches=(1, 2, 4), phoneme_buckets=(32, 64), chunks_per_step=chunks_per_step)  # fmt: skip
    runner = _CountingRunner(tiny_model(), opts)
    scheduler = BatchScheduler(runner, sample_rate=22050, queue_size=16)
    before = scheduler_counters(scheduler)
    ids = list(np.random.default_rng(3).integers(1, TINY.n_vocab, 57))
    try:
        chunks = list(scheduler.submit(ids, Scales(0.0, 1.0, 0.0)))
    finally:
        scheduler.close()  # the step that handed out the last chunk is counted once the thread has stopped
    steps = scheduler.steps
    whole, samples = runner.model.infer(torch.tensor([ids]), torch.tensor([len(ids)]), 0.0, 1.0, 0.0)
    audio = np.concatenate([c.pcm for c in chunks])
    assert audio.shape[0] == int(samples[0])
    assert np.abs(audio.astype(np.int32) - chunked.to_int16(whole[0]).numpy()).max() <= 1
    hop = runner.geometry.hop_length
    frames = int(samples[0]) // hop
    later = [(opts.next_chunk(s, frames), s) for s in range(16, frames, 32)]  # 32-frame chunks, the last one fits
    assert len(later) >= 4 and later[-1][0] < 32, "the utterance should need several later chunks and a short last one"
    assert [c.num_samples // hop for c in chunks] == [16] + [min(size, frames - s) for size, s in later]
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    per_step = chunks_per_step or len(later)
    assert steps == math.ceil(len(later) / per_step)  # the first step also starts the request on the fast lane
    rows = sorted((start, size) for size, starts in runner.main for start in starts)
    assert rows == sorted((s, size) for size, s in later)  # each later chunk decoded once
    # What the benchmark reports: launches, rows and padding (first chunk: 16 frames in a batch-1 bucket).
    padded = 16 + sum(bucket_for(len(starts), opts.decode_batches) * size for size, starts in runner.main)
    assert scheduler.launch_stats == {
        "encode_launches": 1, "encode_rows": 1, "encode_padded_rows": 1, "encode_ids": 57, "encode_padded_ids": 64,
        "decode_launches": 1 + len(runner.main), "decode_rows": 1 + len(later),
        "decode_padded_rows": 1 + sum(bucket_for(len(starts), opts.decode_batches) for _, starts in runner.main),
        "decode_padded_frames": padded, "decode_frames_out": frames,
        "flow_launches": 0, "flow_frames": 0, "flow_frames_used": 0,
    }  # fmt: skip
    report = scheduler_breakdown(before, scheduler_counters(scheduler))
    assert report["steps"] == steps and report["lane_launches"]["fast"] == 1
    assert "flow_padding_pct" not in report  # no flow_once
    assert report["encode_padding_ids_pct"] == round(100 * 7 / 64, 1)
    assert report["decode_frames_not_out_pct"] == round(100 * (padded - frames) / padded, 1)
    assert report["decode_rows_per_launch"] == round((1 + len(later)) / (1 + len(runner.main)), 2)


class _AheadRunner(StepRunner):
    """The real CPU runner, except that a fast launch whose requests are decoded ahead stays "in
    flight" until waited for, as on a GPU: the main lane's launch ahead then goes before the host
    knows their lengths."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.in_flight: set[str] = set()
        self.main_starts: list[list[int]] = []  # start frames of each main-lane launch
        self.gate: threading.Event | None = None  # when set: encoder launches wait for it
        self.encoding = threading.Event()

    def encode(self, items, lane="fast"):
        self.encoding.set()
        if self.gate is not None:
            assert self.gate.wait(scaled(10))
        return super().encode(items, lane)

    def mark(self, lane):
        self.in_flight.add(lane)
        return super().mark(lane)

    def busy(self, lane) -> bool:
        return lane in self.in_flight

    def wait(self, lane) -> None:
        self.in_flight.discard(lane)

    def decode(self, slots, starts, chunk=None, lane="main", after=(), ahead=False):
        if lane == "main":
            self.main_starts.append(list(starts))
        return super().decode(slots, starts, chunk, lane, after, ahead)


@pytest.mark.parametrize("flow_once", [False, True])
def test_decoding_ahead_keeps_audio_and_saves_steps(flow_once):
    """``speculate_frames``: a lone request's chunks after the first are decoded in the same step
    as its first chunk (one main launch, rows from frame 16 and 48, before its length is known);
    what lies past its end is dropped, the rest follows as usual, the audio is the whole
    utterance's. With several requests at once (more than ``speculate_below``) nothing changes.
    With ``flow_once`` the chunks ahead run the flow on their own windows (it has not run yet) and
    the later ones read the flow run once from where they start."""
    opts = RunnerOptions(chunk_frames=16, tail_chunk_frames=32, max_frames=512, decode_batches=(1, 2, 4),
                         encode_batches=(1, 2, 4), phoneme_buckets=(32, 64), speculate_frames=64,
                         speculate_below=1, flow_once=flow_once)  # fmt: skip
    runner = _AheadRunner(tiny_model(), opts)
    scheduler = BatchScheduler(runner, sample_rate=22050, queue_size=16)
    rng = np.random.default_rng(2)
    inputs = [list(rng.integers(1, TINY.n_vocab, n)) for n in (6, 30, 57)]
    hop, shortest = runner.geometry.hop_length, 10**9

    def expected(ids):
        whole, samples = runner.model.infer(torch.tensor([ids]), torch.tensor([len(ids)]), 0.0, 1.0, 0.0)
        return chunked.to_int16(whole[0]).numpy()[: int(samples[0])]

    try:
        for ids in inputs:  # one at a time: each decoded ahead
            runner.main_starts.clear()
            chunks = list(scheduler.submit(ids, Scales(0.0, 1.0, 0.0)))
            audio = np.concatenate([c.pcm for c in chunks])
            want = expected(ids)
            assert audio.shape == want.shape
            assert np.abs(audio.astype(np.int32) - want).max() <= 1
            frames = len(want) // hop
            sizes, done = [min(16, frames)], min(16, frames)
            for _ in range(2):  # the two chunks decoded ahead, as far as the utterance goes
                if done < frames:
                    sizes.append(min(32, frames - done))
                    done += sizes[-1]
            while done < frames:
                sizes.append(min(opts.next_chunk(done, frames), frames - done))
                done += sizes[-1]
            assert [c.num_samples // hop for c in chunks] == sizes
            assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
            assert runner.main_starts[0] == [16, 48]  # the launch ahead, whatever the length
            shortest = min(shortest, frames)
            assert len(runner.main_starts) == 1 + max(0, len(sizes) - 3)
        assert shortest < 48 and frames > 80, "inputs should end inside and outlast what is decoded ahead"
        # The longest alone is decoded ahead; two more arrive during its encoder and start together
        # beside it (3 running > speculate_below): not ahead.
        runner.main_starts.clear()
        runner.gate, runner.encoding = threading.Event(), threading.Event()
        requests = [scheduler.submit(inputs[2], Scales(0.0, 1.0, 0.0))]
        assert runner.encoding.wait(scaled(10))
        requests += [scheduler.submit(ids, Scales(0.0, 1.0, 0.0)) for ids in inputs[:2]]
        runner.gate.set()
        for ids, request in zip([inputs[2], *inputs[:2]], requests):
            audio = np.concatenate([c.pcm for c in request])
            assert np.abs(audio.astype(np.int32) - expected(ids)).max() <= 1
        assert runner.main_starts.count([16, 48]) == 1, runner.main_starts
    finally:
        scheduler.close()


def wait_until(condition, shows=None) -> None:
    """Poll ``condition`` until true (10 s, scaled); the assertion shows ``shows()`` if it never is."""
    deadline = time.monotonic() + scaled(10)
    while not condition():
        assert time.monotonic() < deadline, shows() if shows else "condition never held"
        time.sleep(0.001)


class _BlockingRunner:
    """Stands in for StepRunner: each step waits for the test (orchestration only)."""

    def __init__(self, slots: int = 2, frames: int = 48) -> None:
        self.options = RunnerOptions(chunk_frames=16, decode_batches=tuple(range(1, slots + 1)), phoneme_buckets=(64,))
        self.fast_lanes = ("fast",)
        self.lanes = ("fast", "main")
        self.geometry = chunked.ChunkGeometry(16, 0, 0, 4)
        self.resampler = ChunkResampler(1, 1, 4)  # the voice's rate: no resampling
        self.frames = frames
        self.go = threading.Semaphore(0)
        self.decoded: list[list[tuple[int, int]]] = []
        self.entered = 0  # decode calls begun (each then waits for ``go``)

    def max_encode_batch(self, phonemes: int) -> int:
        return self.options.max_slots

    def encode(self, items, lane="fast"):
        return np.full(len(items), self.frames)

    def decode(self, slots, starts, chunk, lane="main"):
        self.entered += 1
        assert self.go.acquire(timeout=scaled(10))
        self.decoded.append(list(zip(slots, starts)))
        return np.ones((len(slots), self.geometry.chunk_samples), dtype=np.int16)

    def fetch(self, *arrays, lane="main"):
        return list(arrays)

    fetch_async = fetch

    def busy(self, lane) -> bool:
        return False

    def wait(self, lane) -> None:
        pass

    def mark(self, lane):
        return None  # launches are done when decode returns

    def done(self, event) -> bool:
        return True

    def wait_event(self, event) -> None:
        pass

    def take_staged(self, lane):
        return []

    def give_staged(self, blocks) -> None:
        pass

    def release_staged(self, lane=None) -> None:
        pass


def test_scheduler_cancel_frees_slot_and_queue_is_bounded():
    runner = _BlockingRunner(slots=2)
    scheduler = BatchScheduler(runner, sample_rate=16000, queue_size=2)  # type: ignore[arg-type]
    try:
        a, b = scheduler.submit([1] * 10), scheduler.submit([1] * 10)
        runner.go.release()  # step 1: a and b admitted, first chunks; step 2 then waits
        first_a, first_b = next(iter(a)), next(iter(b))
        assert not first_a.final and not first_b.final
        c, d = scheduler.submit([1] * 10), scheduler.submit([1] * 10)  # no free slot: they wait in the inbox
        with pytest.raises(Overloaded):
            scheduler.submit([1] * 10)
        a.cancel()
        assert list(a) == []  # iteration ends at once
        for _ in range(10):
            runner.go.release()
        assert [ch.final for ch in b] == [False, True]
        assert len(list(c)) == 3 and len(list(d)) == 3
        # a's slot went to c: its first chunk gets a launch of its own (fast lane), then b's last
        # and c's second chunk share the step's main-lane launch.
        assert [[start for _, start in launch] for launch in runner.decoded[2:4]] == [[0], [32, 16]]
    finally:
        for _ in range(10):
            runner.go.release()
        scheduler.close()


def test_cancelled_request_gets_nothing_from_a_launch_in_flight():
    """``chunks_per_step = 0``: a request cancelled while the launch holding all its later chunks runs
    gets none of them (its iteration has ended; a sink would not hear of it again); the other
    request of the launch gets all of its own, and the freed slot takes the next request."""
    runner = _BlockingRunner(slots=2, frames=64)
    runner.options = replace(runner.options, chunks_per_step=0)
    scheduler = BatchScheduler(runner, sample_rate=16000, queue_size=4)  # type: ignore[arg-type]
    try:
        a, b = scheduler.submit([1] * 10), scheduler.submit([1] * 10)
        runner.go.release()  # their first chunks (one fast launch)
        assert not next(iter(a)).final and not next(iter(b)).final
        wait_until(lambda: runner.entered >= 2)  # the step's first main launch (rows of both) waits for go
        a.cancel()
        assert list(a) == []
        runner.go.release(3)  # 6 later rows (3 per request) in launches of at most 2
        rest_b = list(b)
        assert [c.num_samples // runner.geometry.hop_length for c in rest_b] == [16, 16, 16] and rest_b[-1].final
        assert a._chunks.empty(), "nothing may follow the end of a cancelled request"
        assert sorted(start for launch in runner.decoded[1:4] for _, start in launch) == [16, 16, 32, 32, 48, 48]
        c = scheduler.submit([1] * 10)
        runner.go.release(10)
        assert len(list(c)) == 4  # a's slot was freed
    finally:
        runner.go.release(10)
        scheduler.close()


class _LaneRunner(_BlockingRunner):
    """Stands in for StepRunner on CUDA: main-lane work stays busy until the test lets it finish."""

    def __init__(self) -> None:
        super().__init__(slots=4)
        self.go.release(100)
        self.lane_done = {"main": threading.Event(), "fast": threading.Event(), "fast1": threading.Event()}
        self.main_done = self.lane_done["main"]
        #: Lanes whose launches stay busy until the test sets ``lane_done[lane]``.
        self.held = {"main"}
        self.delay_s = 0.0  # each decode takes this long
        self.launched: list[tuple[str, list[int]]] = []  # (lane, start frames) per decode

    def decode(self, slots, starts, chunk, lane="main"):
        self.launched.append((lane, list(starts)))
        time.sleep(self.delay_s)
        if lane in self.held:
            self.lane_done[lane].clear()
        return super().decode(slots, starts, chunk, lane)

    def lanes_used(self) -> list[str]:
        return [lane for lane, _ in self.launched]

    def busy(self, lane) -> bool:
        return lane in self.held and not self.lane_done[lane].is_set()

    def wait(self, lane) -> None:
        if lane in self.held:
            assert self.lane_done[lane].wait(scaled(10))

    def mark(self, lane):  # a held lane's launches are done when the test sets its event
        return self.lane_done[lane] if lane in self.held else None

    def done(self, event) -> bool:
        return event is None or event.is_set()

    def wait_event(self, event) -> None:
        assert event is None or event.wait(scaled(10))


def test_scheduler_starts_arrivals_on_the_fast_lane_while_the_main_lane_runs():
    """A request that arrives while the later chunks of another run gets its first chunk
    without waiting for them (on CUDA: a second, high-priority stream)."""
    runner = _LaneRunner()
    scheduler = BatchScheduler(runner, sample_rate=16000)  # type: ignore[arg-type]
    try:
        a = iter(scheduler.submit([1] * 10))
        assert not next(a).final  # a's first chunk (fast lane); its second now runs on the main lane
        deadline = time.monotonic() + scaled(10)
        while ("main", [16]) not in runner.launched:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        b_chunks: list = []
        b_first = threading.Event()

        def sink(outcomes):
            b_chunks.extend(o.final for _, o in outcomes)
            b_first.set()

        scheduler.submit([1] * 10, sink=sink)
        assert b_first.wait(scaled(5)), "b's first chunk waited for the main lane"  # main is held busy
        assert runner.launched[:3] == [("fast", [0]), ("main", [16]), ("fast", [0])]
        runner.held = set()
        runner.main_done.set()
        assert [c.final for c in a] == [False, True]
        deadline = time.monotonic() + scaled(10)
        while len(b_chunks) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert b_chunks == [False, False, True]
    finally:
        runner.main_done.set()
        scheduler.close()


def test_scheduler_launches_later_chunks_while_the_fast_lane_keeps_starting_arrivals():
    """Arrivals that keep the fast lane busy do not starve the later chunks of requests whose
    first chunk is out: the main lane launches them beside the fast lane's next launch."""
    runner = _LaneRunner()
    runner.held = {"fast"}  # fast-lane launches stay busy until the test lets each finish
    scheduler = BatchScheduler(runner, sample_rate=16000)  # type: ignore[arg-type]

    try:
        a = iter(scheduler.submit([1] * 10))
        wait_until(lambda: runner.launched == [("fast", [0])])  # a's first chunk: launched, busy
        scheduler.submit([1] * 10)  # b waits for the fast lane
        time.sleep(0.01)
        runner.lane_done["fast"].set()  # a's launch finishes: a's first chunk out, b's launch starts (busy)
        assert not next(a).final
        wait_until(lambda: ("main", [16]) in runner.launched)  # a's second chunk, while b's launch runs
        assert runner.launched[:2] == [("fast", [0]), ("fast", [0])]
        assert not runner.lane_done["fast"].is_set()  # b's launch is still in flight
    finally:
        runner.held = set()
        runner.lane_done["fast"].set()
        scheduler.close()


def test_later_chunks_are_queued_once_the_encoder_is_done_not_the_first_chunk():
    """The lengths come to the host right behind the encoder: the main lane queues a request's later
    chunks while its first chunk is still decoding on the fast lane, and hands them out after it."""

    class EncoderRunner(_LaneRunner):
        def __init__(self) -> None:
            super().__init__()
            self.encoded = threading.Event()  # the fast launch's encoder (and the copy of its lengths)
            self.held = {"fast"}

        def mark(self, lane):
            return self.encoded if lane in self.fast_lanes else super().mark(lane)

    runner = EncoderRunner()
    scheduler = BatchScheduler(runner, sample_rate=16000)  # type: ignore[arg-type]
    try:
        a = scheduler.submit([1] * 10)  # 48 frames: a first chunk of 16, then two more
        wait_until(lambda: runner.launched == [("fast", [0])])
        time.sleep(0.02)
        assert runner.launched == [("fast", [0])], "later chunks queued before the length was known"
        runner.encoded.set()
        wait_until(lambda: ("main", [16]) in runner.launched)
        assert not runner.lane_done["fast"].is_set()  # the first chunk is still decoding
        runner.lane_done["fast"].set()
        chunks = list(a)
        assert [c.final for c in chunks] == [False, False, True]
        assert [c.num_samples for c in chunks] == [16 * runner.geometry.hop_length] * 3
    finally:
        runner.held = set()
        runner.encoded.set()
        runner.lane_done["fast"].set()
        scheduler.close()


def test_second_fast_lane_starts_an_arrival_while_the_first_is_busy():
    """``fast_lanes = 2``: a request arriving while a fast launch is in flight is launched on the
    other fast lane at once and gets its first chunk before that launch is done."""
    runner = _LaneRunner()
    runner.options = replace(runner.options, fast_lanes=2)
    runner.fast_lanes = ("fast", "fast1")
    runner.lanes = ("fast", "fast1", "main")
    runner.held = {"fast"}  # the first fast lane's launch stays busy until the test lets it finish
    scheduler = BatchScheduler(runner, sample_rate=16000)  # type: ignore[arg-type]
    try:
        a = iter(scheduler.submit([1] * 10))
        deadline = time.monotonic() + scaled(10)
        while runner.lanes_used() != ["fast"]:
            assert time.monotonic() < deadline, runner.launched
            time.sleep(0.001)
        b = iter(scheduler.submit([1] * 10))
        assert not next(b).final  # b's first chunk, from the second fast lane, while a's is still busy
        assert runner.launched[:2] == [("fast", [0]), ("fast1", [0])] and not runner.lane_done["fast"].is_set()
        runner.lane_done["fast"].set()
        assert [c.final for c in a] == [False, False, True]
        assert [c.final for c in b] == [False, True]
        assert set(scheduler.lane_launches) == {"fast", "fast1", "main"} and scheduler.lane_launches["fast1"] == 1
    finally:
        runner.held = set()
        runner.lane_done["fast"].set()
        scheduler.close()


class _EventRunner(_BlockingRunner):
    """Stands in for StepRunner on CUDA: each main launch has an event of
    its own that the test sets (in launch order, as one stream finishes them); fast launches are
    done at once."""

    def __init__(self, main_in_flight: int) -> None:
        super().__init__(slots=4, frames=80)
        self.options = replace(self.options, main_in_flight=main_in_flight)
        self.go.release(1000)
        self.events: list[threading.Event] = []  # one per main launch
        self.main_starts: list[list[int]] = []
        self.given: list[list] = []

    def decode(self, slots, starts, chunk, lane="main"):
        if lane == "main":
            self.main_starts.append(list(starts))
            self.events.append(threading.Event())
        return super().decode(slots, starts, chunk, lane)

    def mark(self, lane):
        return self.events[-1] if lane == "main" else None  # fast launches (their encoders too) are done at once

    def done(self, event) -> bool:
        return event is None or event.is_set()

    def wait_event(self, event) -> None:
        assert event is None or event.wait(scaled(10))

    def take_staged(self, lane):
        return [f"blocks of main launch {len(self.events)}"]

    def give_staged(self, blocks) -> None:
        self.given.append(blocks)


@pytest.mark.parametrize("main_in_flight", [1, 2])
def test_main_launches_in_flight_queue_ready_chunks_behind_a_running_one(main_in_flight):
    """``main_in_flight = 2``: chunks that become ready while a main launch runs (the next chunk of a
    request in it, a new request's second) are queued at once behind it (one in flight: only once
    it is handed out); launches are handed out oldest first, each request's chunks in order, each
    launch's staged buffers given back once it is done (one in flight too); a cancelled request keeps its slot while a
    launch with its chunks may still read it."""
    runner = _EventRunner(main_in_flight)
    scheduler = BatchScheduler(runner, sample_rate=16000)  # type: ignore[arg-type]

    def holds_slot(request) -> bool:
        return any(r is request for r in scheduler._running.values())

    try:
        a = scheduler.submit([1] * 10)
        assert next(iter(a)).num_samples == 16 * 4  # a's first chunk; its second now runs (main launch 1)
        wait_until(lambda: len(runner.main_starts) == 1)
        b = scheduler.submit([1] * 10)
        assert not next(iter(b)).final  # b's first chunk, from the fast lane, while main launch 1 runs
        if main_in_flight == 2:
            wait_until(lambda: len(runner.main_starts) == 2)
            assert runner.main_starts == [[16], [32, 16]]  # a's third chunk and b's second, behind launch 1
        else:
            time.sleep(0.05)
            assert runner.main_starts == [[16]]  # they wait for main launch 1 to be handed out
        a.cancel()
        assert list(a) == []
        time.sleep(0.02)
        assert holds_slot(a)  # launch 1 reads a's slot
        runner.events[0].set()
        if main_in_flight == 2:
            wait_until(lambda: len(runner.given) == 1)
            assert runner.given == [["blocks of main launch 1"]]  # launch 2 still runs: its buffers kept
            time.sleep(0.02)
            assert holds_slot(a)  # launch 2 reads it too
            runner.events[1].set()
        wait_until(lambda: not holds_slot(a))
        rest: list = []
        consumer = threading.Thread(target=lambda: rest.extend(b))  # b's later chunks
        consumer.start()
        deadline = time.monotonic() + scaled(10)
        while consumer.is_alive():
            assert time.monotonic() < deadline, runner.main_starts
            for e in list(runner.events):  # later launches finish in order
                e.set()
            time.sleep(0.002)
        assert [c.num_samples // 4 for c in rest] == [16, 16, 16, 16] and rest[-1].final  # b: 80 frames
        assert all(starts.count(16) <= 2 for starts in runner.main_starts)
        wait_until(lambda: len(runner.given) == len(runner.events), lambda: runner.given)  # each launch's, once
    finally:
        for e in runner.events:
            e.set()
        scheduler.close()


def test_exclusive_fast_lane_starves_neither_lane():
    """``fast_lane = "exclusive"``: a request arriving while a long one runs still gets its first
    chunk within a step or two (not after the long one's last), and the long one keeps going."""
    runner = _LaneRunner()
    runner.held = set()  # like the CPU: every launch is done when it returns
    runner.delay_s = 0.005
    runner.frames = 16 * 40  # the long request: 40 chunks
    runner.options = replace(runner.options, fast_lane="exclusive")
    scheduler = BatchScheduler(runner, sample_rate=16000)  # type: ignore[arg-type]
    order: list[str] = []
    lock = threading.Lock()

    def sink(name):
        def record(outcomes):
            with lock:
                order.extend(name for _ in outcomes)
        return record

    try:
        scheduler.submit([1] * 10, sink=sink("long"))
        deadline = time.monotonic() + scaled(10)
        while order.count("long") < 3:
            assert time.monotonic() < deadline
            time.sleep(0.0005)
        scheduler.submit([1] * 10, sink=sink("new"))
        with lock:
            at_submit = order.count("long")
        while "new" not in order:
            assert time.monotonic() < deadline, order
            time.sleep(0.0005)
        with lock:
            before = order.index("new")
        assert order.count("long") < 40  # the long one was still running
        assert before <= at_submit + 3, order  # a step or two of the long one's chunks, not all of them
        while order.count("long") < 40:
            assert time.monotonic() < deadline
            time.sleep(0.0005)
    finally:
        scheduler.close()


def test_fast_lanes_decode_first_chunks_only():
    """The fast lanes' graphs read no context before the chunk: a chunk elsewhere is refused there."""
    runner = tiny_runner(fast_lanes=2)
    assert runner.first_geometry.first and runner.first_geometry.chunk_frames == runner.options.chunk_frames
    assert runner.first_geometry.window_frames == runner.geometry.window_frames - runner.geometry.context
    for lane in runner.fast_lanes:
        with pytest.raises(ValueError, match="from frame 0"):
            runner.decode([0, 1], [0, 16], lane=lane)
    assert runner.decode([0], [16], lane="main").shape[0] == 1  # the main lane decodes any chunk


def test_scheduler_rejects_bad_input():
    scheduler = BatchScheduler(_BlockingRunner(), sample_rate=16000)  # type: ignore[arg-type]
    try:
        with pytest.raises(InvalidInput):
            scheduler.submit([])
        with pytest.raises(InvalidInput):
            scheduler.submit([1] * 65)
    finally:
        scheduler.close()


# ---------------------------------------------------------------- engine, export


@pytest.mark.slow
@pytest.mark.parametrize("flow_once", [False, True])
def test_cuda_engine_on_cpu_speaks_text_like_the_onnx_engine(cfg, voice_path, flow_once):
    """The GPU engine's code on CPU speaks as the CPU engine does, also with ``flow_once`` (the real
    voice's flow, packed)."""
    from tts_engine.cpu_engine import OnnxTtsEngine
    from tts_engine.torch_vits.cuda_engine import CudaTtsEngine
    from tts_engine.voice import Voice

    voice = Voice.load(voice_path)
    options = RunnerOptions(
        chunk_frames=64, max_frames=1024, decode_batches=(1, 2), encode_batches=(1, 2), phoneme_buckets=(128, 256),
        flow_once=flow_once,
    )  # fmt: skip
    engine = CudaTtsEngine(voice, options, device="cpu")
    reference = OnnxTtsEngine(voice)
    quiet = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
    try:
        text = "Hello there. The second sentence is a little longer than the first one."
        chunks = list(engine.synthesize(text, quiet))
        ref = list(reference.synthesize(text, quiet))
        for index, ref_chunk in enumerate(ref):
            mine = [c for c in chunks if c.clause_index == index]
            assert [c.final for c in mine][-1] and len(mine) >= 2
            audio = np.concatenate([c.pcm for c in mine]).astype(np.int32)
            assert audio.shape == ref_chunk.pcm.shape
            assert np.abs(audio - ref_chunk.pcm).max() <= 40  # 1e-3 of full scale
        resampled = list(engine.synthesize("Hello there.", SynthesisOptions(sample_rate=16000)))
        assert {c.sample_rate for c in resampled} == {16000}
        stream = engine.synthesize_ids(bench_ids(1)[0])
        next(stream)
        stream.close()  # consumer gone (barge-in): the request is cancelled, the slot freed
        assert len(list(engine.synthesize_ids(bench_ids(1)[0]))) > 1
        assert (engine.scheduler.launch_stats["flow_launches"] > 0) == flow_once
    finally:
        engine.close()


@pytest.mark.slow
def test_cuda_engine_resampling_on_the_device_sounds_like_soxr(voice_path):
    """``output_rate`` = 24 kHz: the engine hands out 24 kHz chunks (also by default); each sentence is
    within 60 dB of the CPU engine's sentence resampled alone by soxr (HQ); other rates are resampled
    from 24 kHz."""
    import soxr

    from tts_engine.cpu_engine import OnnxTtsEngine
    from tts_engine.torch_vits.cuda_engine import CudaTtsEngine
    from tts_engine.voice import Voice

    voice = Voice.load(voice_path)
    options = RunnerOptions(chunk_frames=32, tail_chunk_frames=128, max_frames=1024, decode_batches=(1, 2),
                            encode_batches=(1, 2), phoneme_buckets=(128, 256), output_rate=24000)  # fmt: skip
    engine = CudaTtsEngine(voice, options, device="cpu")
    reference = OnnxTtsEngine(voice)
    quiet = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
    try:
        assert engine.sample_rate == 24000 and engine.runner.resampler.edge_frames == 1
        text = "Hello there. The second sentence is a little longer than the first one."
        chunks = list(engine.synthesize(text, quiet))  # no rate named: the engine's
        ref = list(reference.synthesize(text, quiet))  # the voice's 22 050 Hz
        assert {c.sample_rate for c in chunks} == {24000} and {c.sample_rate for c in ref} == {22050}
        for index in range(2):
            mine = np.concatenate([c.pcm for c in chunks if c.clause_index == index]).astype(np.float64)
            native = np.concatenate([c.pcm for c in ref if c.clause_index == index]).astype(np.float64)
            theirs = soxr.resample(native, 22050, 24000, quality="HQ")
            assert len(mine) == -(-len(native) * 24000 // 22050) and abs(len(mine) - len(theirs)) <= 1
            n = min(len(mine), len(theirs))
            noise = ((mine[:n] - theirs[:n]) ** 2).mean()
            assert 10 * np.log10((theirs[:n] ** 2).mean() / noise) > 60  # 72-75 dB measured on CPU
        at_16k = list(engine.synthesize("Hello there.", SynthesisOptions(sample_rate=16000)))
        assert {c.sample_rate for c in at_16k} == {16000}
    finally:
        engine.close()


@pytest.mark.slow
def test_onnx_export_matches_pytorch(model, tmp_path):
    from tts_engine.torch_vits import export_onnx

    enc, dec = export_onnx.export(model, tmp_path)
    report = export_onnx.check(model, enc, dec, bench_ids(1)[0])
    assert report["frames_equal"] == 1.0
    assert report["encoder_max_abs"] < 1e-3 and report["decoder_max_abs"] < 1e-3


def test_compiled_kernels_are_cached_per_gpu_cuda_and_torch(tmp_path, monkeypatch):
    """``tts.compile``: Inductor's cache goes under the models cache, one directory per GPU model, CUDA
    and torch (a reboot or a container restart keeps it); a TORCHINDUCTOR_CACHE_DIR of the user wins.
    ``tts.triton_kernels``: Triton's cache likewise."""
    from tts_engine.torch_vits.compile_cache import ENV, cache_key, use_compile_cache

    h200 = cache_key("NVIDIA H200", (9, 0), "13.0", "2.11.0+cu130")
    assert h200 == "NVIDIA-H200-sm90-cuda13.0-torch2.11.0+cu130"
    assert cache_key("NVIDIA H200", (9, 0), "13.0", "2.12.0") != h200
    assert cache_key("NVIDIA GeForce RTX 4090", (8, 9), "12.8", "2.11.0") == "NVIDIA-GeForce-RTX-4090-sm89-cuda12.8-torch2.11.0"
    monkeypatch.delenv(ENV, raising=False)
    used = use_compile_cache(tmp_path / "inductor", h200)
    assert used == tmp_path / "inductor" / h200 and used.is_dir()
    assert os.environ[ENV] == str(used)
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    assert cache_dir() == str(used)  # what Inductor itself will use
    monkeypatch.setenv(ENV, str(tmp_path / "mine"))
    assert use_compile_cache(tmp_path / "inductor", h200) == tmp_path / "mine"
    monkeypatch.delenv(ENV)
    blocked = tmp_path / "read-only"
    blocked.write_text("a file where the directory would go")  # as a read-only models volume: no mkdir
    assert use_compile_cache(blocked, h200) is None and ENV not in os.environ
    # tts.triton_kernels: Triton's own cache (kernels outside Inductor) the same way
    from tts_engine.torch_vits.compile_cache import TRITON_ENV

    monkeypatch.delenv(TRITON_ENV, raising=False)
    used = use_compile_cache(tmp_path / "triton", h200, TRITON_ENV)
    assert used == tmp_path / "triton" / h200 and os.environ[TRITON_ENV] == str(used) and ENV not in os.environ
    triton_cache = pytest.importorskip("triton.runtime.cache")
    assert triton_cache.get_cache_manager("00ff").cache_dir.startswith(str(used))  # what Triton itself will use


def test_engine_remembers_resolved_options_but_never_refused_ones(cfg):
    """Request options are resolved once per distinct options (the served path sends the same ones
    with every sentence): equal options give the first result, options that were refused are
    refused again each time, and what is kept stays bounded."""
    from tts_engine.torch_vits.cuda_engine import RESOLVED_OPTIONS, CudaTtsEngine

    tts = replace(cfg.tts, backend="cuda", device="cpu", cuda_graphs=False, max_batch=4, output_rate=24000)
    engine = CudaTtsEngine.from_config(replace(cfg, tts=tts))
    ids = [1, 0, 41, 0, 59, 0, 2]
    try:
        requests, rate = engine.submit_sentences([ids], SynthesisOptions(length_scale=1.25, sample_rate=16000))
        assert rate == 16000 and requests[0].scales.length_scale == 1.25
        again, rate = engine.submit_sentences([ids], SynthesisOptions(length_scale=1.25, sample_rate=16000))
        assert rate == 16000 and again[0].scales is requests[0].scales
        plain, rate = engine.submit_sentences([ids])
        assert rate == 24000  # no options: the engine's output rate
        for r in requests + again + plain:
            r.cancel()
        for bad in (SynthesisOptions(length_scale=0.0), SynthesisOptions(noise_w=float("nan")),
                    SynthesisOptions(speaker_id=[3]), SynthesisOptions(sample_rate=1)):  # fmt: skip
            for _ in range(2):
                with pytest.raises(InvalidInput):
                    engine.submit_sentences([ids], bad)
        assert len(engine._resolved) == 2
        for i in range(RESOLVED_OPTIONS + 5):
            engine._resolve(SynthesisOptions(length_scale=1 + i / 1000))
        assert 0 < len(engine._resolved) <= RESOLVED_OPTIONS
    finally:
        engine.close()


def test_engine_from_config_captures_the_configured_batch_buckets(cfg):
    """``tts.batch_buckets`` and ``tts.encode_batch_buckets`` (each level's sizes, the padding they
    allow), the decoding-ahead settings and the phoneme buckets reach the runner (built on the CPU) with
    the engine's measured forms (``runner.SHIPPED``: polyphase upsampling, the encoder's convolutions as
    cuBLAS products, the flow once, all later chunks in one step, two main launches); ``tts.triton_kernels``
    is refused there (no CUDA), naming the kernels: the encoder's at fp32, the decoder's too at fp16."""
    from tts_engine.torch_vits.cuda_engine import CudaTtsEngine
    from tts_engine.torch_vits.runner import SHIPPED, batch_buckets

    tts = replace(cfg.tts, backend="cuda", device="cpu", cuda_graphs=False, max_batch=32,
                  batch_buckets="coarse", encode_batch_buckets="finer", speculate_frames=512, speculate_below=3,
                  phoneme_buckets=(32, 48, 64, 96, 128))  # fmt: skip
    with pytest.raises(ValueError, match="^fused_duration_predictor and fused_text_encoder and fused_prior need CUDA"):
        CudaTtsEngine.from_config(replace(cfg, tts=replace(tts, triton_kernels=True)))  # fp32: no decoder kernels
    with pytest.raises(ValueError, match="^fused_blocks needs CUDA"):
        CudaTtsEngine.from_config(replace(cfg, tts=replace(tts, triton_kernels=True, precision="fp16")))
    engine = CudaTtsEngine.from_config(replace(cfg, tts=tts))
    try:
        options = engine.runner.options
        assert {name: getattr(options, name) for name in SHIPPED} == SHIPPED
        assert not options.fused_kernels and options.precision == "fp32"
        assert engine.runner.synth_model.dec.polyphase is not None
        assert engine.runner.model.dec.polyphase is None  # fp32: the encoder's copy stays as loaded
        assert options.decode_batches == (1, 2, 4, 8, 16, 32)
        assert options.encode_batches == (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32)
        assert (options.speculate_frames, options.speculate_below) == (512, 3)
        assert isinstance(engine.runner.model.enc_p.encoder.ffn_layers[0].conv_1, GemmConv1d)
        assert options.phoneme_buckets == (32, 48, 64, 96, 128)
        with pytest.raises(InvalidInput, match="limit of 128"):
            engine.submit([1] * 129)
        assert isinstance(engine.runner.synth_model.flow.flows[0].enc.in_layers[0], torch.nn.Conv1d)  # flow + decoder: as loaded
        assert options.text_encoder_products == "cublas"
        with pytest.raises(ValueError, match="fused_attention needs tensor-core text_encoder_products .* got 'cublas'"):
            replace(options, fused_attention=True)
    finally:
        engine.close()
    assert batch_buckets(32) == (1, 2, 4, 8, 16, 24, 32)  # "fine": every multiple of 8 up to 64 too
    assert batch_buckets(128) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128)
    assert batch_buckets(128, "coarse") == (1, 2, 4, 8, 16, 32, 64, 128)
    finer = batch_buckets(128, "finer")
    assert finer[:12] == (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16) and finer[-5:] == (64, 80, 96, 112, 128)
    assert batch_buckets(100, "finer")[-3:] == (80, 96, 100)  # max_batch itself is a size

    def padding(sizes, n):  # the share of a launch's rows that are padding
        bucket = min(b for b in sizes if b >= n)
        return (bucket - n) / bucket

    assert max(padding(finer, n) for n in range(1, 129)) == pytest.approx(15 / 80)  # 65 rows to 80
    assert max(padding(batch_buckets(128), n) for n in range(1, 129)) == pytest.approx(7 / 16)  # 9 rows to 16
    assert max(padding(batch_buckets(128), n) for n in range(17, 129)) == pytest.approx(7 / 24)
    assert max(padding(batch_buckets(128, "coarse"), n) for n in range(1, 129)) == pytest.approx(63 / 128)  # 65 rows to 128
    with pytest.raises(ValueError, match="level must be one of"):
        batch_buckets(128, "finest")
