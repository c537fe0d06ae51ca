"""INT8 decoder convolutions (``tts_engine/torch_vits/int8.py``) on CPU: ``torch._int_mm`` runs there too.

SNR bounds (waveform vs float32 whole utterance, noise scales 0, the first benchmark
sentence, the bundled voice), measured on CPU with torch 2.13: 24.9 dB for the default
static scales (calibrated at build on the 16 committed sentences, through ``StepRunner``'s
64- then 256-frame chunks), 29.7 dB for dynamic per-row scales. For scale: int8 weights
with float activations give ~31 dB; GPU bf16 gives 19.7-24.2 dB with fp32's WER
(docs/benchmarks.md, 2026-11-29). Bounds sit 3 dB below the measurements.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

from tts_engine.torch_vits import chunked, int8  # noqa: E402
from tts_engine.torch_vits.int8 import Int8Conv1d, Int8Options  # noqa: E402
from tts_engine.torch_vits.runner import EncodeItem, RunnerOptions, StepRunner  # noqa: E402
from tts_engine.torch_vits.weights import load_vits  # noqa: E402

BENCH = Path(__file__).resolve().parent.parent / "bench" / "tts_sentences.json"
DYNAMIC_MIN_SNR_DB = 26.7
STATIC_MIN_SNR_DB = 21.9


@pytest.fixture(scope="module")
def voice_path(cfg) -> Path:
    from base import models

    return models.resolve_voice(cfg).path


@pytest.fixture(scope="module")
def model(voice_path):
    torch.set_num_threads(2)
    return load_vits(voice_path)


@pytest.fixture(scope="module")
def sentence(model):
    """First benchmark sentence at noise 0: (ids, fp32 whole-utterance audio)."""
    ids = json.loads(BENCH.read_text())["sentences"][0]["ids"]
    audio, _ = model.infer(torch.tensor([ids]), torch.tensor([len(ids)]), 0.0, 1.0, 0.0)
    return ids, audio[0].numpy().astype(np.float64)


def snr_db(ref: np.ndarray, audio: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum((audio - ref) ** 2), 1e-20)))


class IntMmSpy:
    """Wraps ``torch._int_mm``: records operand dtypes, shapes and strides."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple] = []
        self._real = torch._int_mm
        monkeypatch.setattr(torch, "_int_mm", self)

    def __call__(self, a, b):
        self.calls.append(
            (a.dtype, b.dtype, tuple(a.shape), tuple(b.shape), a.stride(), b.stride())
        )
        return self._real(a, b)


# ---------------------------------------------------------------- Int8Conv1d


def speak_in_chunks(runner, ids) -> list[np.ndarray]:
    """Encode ``ids`` into slot 0 (noise scales 0) and decode it chunk by chunk: int16 pieces."""
    frames = int(runner.fetch(runner.encode([EncodeItem(ids, 0, 0.0, 1.0, 0.0)]))[0][0])
    pieces, done = [], 0
    while done < frames:
        size = runner.options.next_chunk(done, frames)
        pieces.append(runner.fetch(runner.decode([0], [done], size))[0][0])
        done += size
    return pieces


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
@pytest.mark.parametrize(
    "cin, cout, kernel, dilation, length, batch",
    [
        (32, 32, 7, 3, 101, 2),
        (64, 64, 5, 6, 33, 1),
        (128, 128, 3, 1, 7, 1),
        (192, 256, 7, 1, 50, 3),
        (32, 32, 3, 12, 5, 3),
    ],
)
def test_int8_conv_matches_float_conv(
    cin, cout, kernel, dilation, length, batch, dynamic
):
    """~1 % relative error (int8 weights and activations); a wrong tap or channel order gives ~100 %."""
    torch.manual_seed(cin + kernel + length)
    conv = torch.nn.Conv1d(
        cin, cout, kernel, dilation=dilation, padding=dilation * (kernel - 1) // 2
    )
    x = torch.randn(batch, cin, length)
    with torch.inference_mode():
        ref = conv(x)
        q = Int8Conv1d(conv, act_amax=float(x.abs().max()), dynamic=dynamic)
        y = q(x)
    assert y.shape == ref.shape and y.dtype == x.dtype and y.is_contiguous()
    assert float((y - ref).norm() / ref.norm()) < 0.02


def test_int8_conv_keeps_fp16_input_dtype():
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(32, 32, 5, dilation=2, padding=4)
    x = torch.randn(2, 32, 40)
    with torch.inference_mode():
        y = Int8Conv1d(conv, act_amax=float(x.abs().max()))(x.half())
        ref = conv(x)
    assert y.dtype == torch.float16
    assert float((y.float() - ref).norm() / ref.norm()) < 0.02


def test_int8_conv_runs_int_mm_on_int8_in_the_cuda_layout(monkeypatch):
    """One int8 x int8 GEMM ``W @ cols^T`` per call, with shapes CUDA accepts (``a.size(0)``
    = Cout > 16, ``a.size(1)`` and ``b.size(1)`` multiples of 8: 7 samples become 8 rows)
    and both operands K-contiguous."""
    spy = IntMmSpy(monkeypatch)
    conv = torch.nn.Conv1d(32, 64, 3, dilation=2, padding=2)
    q = Int8Conv1d(conv, dynamic=True)
    assert q.weight.dtype == torch.int8 and q.weight.shape == (64, 3 * 32)
    with torch.inference_mode():
        y = q(torch.randn(1, 32, 7))
    assert y.shape == (1, 64, 7)
    ((a_dtype, b_dtype, a_shape, b_shape, a_stride, b_stride),) = spy.calls
    assert a_dtype == b_dtype == torch.int8
    assert a_shape == (64, 96) and b_shape == (96, 8)
    assert a_stride == (96, 1) and b_stride == (1, 96)


def test_layers_that_break_the_shape_rules_stay_float():
    conv_post = torch.nn.Conv1d(32, 1, 7, padding=3, bias=False)
    assert not int8.supports(conv_post)  # 1 output channel: the GEMM needs > 16 rows
    assert not int8.supports(torch.nn.Conv1d(32, 32, 3, stride=2, padding=1))
    assert not int8.supports(torch.nn.Conv1d(3, 32, 3, padding=1))  # K * Cin = 9
    assert not int8.supports(
        torch.nn.Conv1d(16, 16, 3, padding=1)
    )  # 16 output channels
    assert not int8.supports(torch.nn.ConvTranspose1d(64, 32, 8, 4, padding=2))
    with pytest.raises(ValueError, match="cannot replace"):
        Int8Conv1d(conv_post, dynamic=True)
    with pytest.raises(ValueError, match="act_amax"):
        Int8Conv1d(torch.nn.Conv1d(32, 32, 3, padding=1))  # static without calibration


def test_options_are_checked():
    with pytest.raises(ValueError):
        Int8Options(mode="per-channel")
    with pytest.raises(ValueError):
        Int8Options(clip=20.0)
    with pytest.raises(ValueError):
        Int8Options(smooth_alpha=1.5)


def test_observer_percentile_and_mse_bound():
    """Percentiles from the log histogram within a bin (2 %); the MSE bound quantizes with less
    squared error than the amax or a percentile (it clips one outlier, keeps the bulk)."""
    obs = int8.ActivationObserver()
    x = torch.randn(1, 4, 200_000, generator=torch.Generator().manual_seed(0))
    x[0, 0, 0] = 100.0
    obs.update(x)
    assert obs.amax == 100.0
    assert (
        abs(obs.bound(99.9) / float(torch.quantile(x.abs().flatten(), 0.999)) - 1)
        < 0.02
    )

    def error(bound: float) -> float:
        s = bound / int8.QMAX
        return float(((torch.round(x / s).clamp(-127, 127) * s - x) ** 2).sum())

    best = obs.mse_bound()
    assert 5.0 < best < 100.0
    assert error(best) < min(
        error(100.0), error(obs.bound(99.9)), error(obs.bound(99.999))
    )


# ---------------------------------------------------------------- the real decoder


def test_calibration_set_is_valid_for_the_voice(voice_path):
    from tts_engine.engine import check_phoneme_ids
    from tts_engine.voice import Voice

    doc = json.loads(int8.CALIBRATION_SENTENCES.read_text())
    voice = Voice.load(voice_path)
    assert doc["voice"] == voice_path.name
    bench_texts = {s["text"] for s in json.loads(BENCH.read_text())["sentences"]}
    sentences = doc["sentences"]
    assert len(sentences) == 16
    id_map = voice.config.phoneme_id_map
    for s in sentences:
        assert 8 <= len(s["text"].split()) <= 20 and s["text"] not in bench_texts
        ids = check_phoneme_ids(s["ids"], voice.config.num_symbols)
        assert ids[:1] == list(id_map["^"]) and ids[-1:] == list(id_map["$"])
    assert int8.load_calibration_ids() == [s["ids"] for s in sentences]


def test_calibration_set_must_fit_the_voice():
    from tts_engine.torch_vits.model import Vits, VitsConfig
    from base.errors import ConfigError

    small = VitsConfig(n_vocab=64, inter_channels=16, hidden_channels=16, filter_channels=32,
                       n_layers=2, upsample_initial_channel=32, dp_filter_channels=16)  # fmt: skip
    with pytest.raises(ConfigError, match="calibration set"):
        int8.int8_synth_model(Vits(small).eval(), Int8Options(mode="static"))


@pytest.mark.slow
def test_calibration_ids_are_what_the_frontend_says(voice_path):
    """The frozen ids equal today's espeak-ng phonemization (regenerate: bench/tts_int8.py --make-calibration)."""
    from tts_engine.frontend import TextFrontend
    from tts_engine.voice import Voice

    frontend = TextFrontend(Voice.load(voice_path).config)
    for s in json.loads(int8.CALIBRATION_SENTENCES.read_text())["sentences"]:
        assert list(frontend.sentence_ids(s["text"])) == [s["ids"]]


@pytest.mark.slow
def test_runner_int8_precision_quality(voice_path, sentence, monkeypatch):
    """precision "int8" (default options: static scales calibrated at build on the committed
    set): int8 decoder convolutions, float32 around them on CPU, chunk plan 64 then 256."""
    ids, ref = sentence
    runner = StepRunner(
        load_vits(voice_path),
        RunnerOptions(chunk_frames=64, tail_chunk_frames=256, max_frames=1024, decode_batches=(1,),
                      encode_batches=(1,), phoneme_buckets=(256,), precision="int8"),
    )  # fmt: skip
    quantized = [
        m for m in runner.synth_model.dec.modules() if isinstance(m, Int8Conv1d)
    ]
    assert len(quantized) == 18 and not any(m.dynamic for m in quantized)
    assert runner.dtype == torch.float32 and isinstance(
        runner.synth_model.dec.conv_post, torch.nn.Conv1d
    )
    spy = IntMmSpy(monkeypatch)
    pieces = speak_in_chunks(runner, ids)
    assert len(spy.calls) == 18 * len(pieces)
    audio = np.concatenate(pieces)[: len(ref)] / 32767.0
    assert len(audio) == len(ref)
    snr = snr_db(ref, audio)
    print(f"int8 static via StepRunner: SNR {snr:.1f} dB")
    assert snr >= STATIC_MIN_SNR_DB


@pytest.mark.slow
def test_dynamic_decoder_quality(model, sentence):
    """Per-row scales: no calibration, and closer to float32 than static scales."""
    import copy

    ids, ref = sentence
    quantized = copy.deepcopy(model)
    assert int8.quantize_decoder(quantized, None, Int8Options(mode="dynamic")) == {}
    convs = [m for m in quantized.dec.modules() if isinstance(m, Int8Conv1d)]
    assert len(convs) == 18 and all(c.dynamic for c in convs)
    with torch.inference_mode():
        x, m_p, logs_p, mask = model.encode(
            torch.tensor([ids]), torch.tensor([len(ids)])
        )
        one = torch.ones(1)
        w_ceil, frames = model.durations(x, mask, one * 0, one)
        z_p = model.expand_prior(m_p, logs_p, w_ceil, int(frames), one * 0)
        audio = chunked.decode_chunked(quantized, z_p, int(frames), 256).numpy()
    snr = snr_db(ref, audio)
    print(f"int8 dynamic: SNR {snr:.1f} dB")
    assert snr >= DYNAMIC_MIN_SNR_DB


def test_quantize_decoder_calibrates_from_latents(model):
    """Static mode from decoder-input latents: hooks see every quantized layer's input."""
    import copy

    latents = [
        torch.randn(
            1,
            model.config.inter_channels,
            12,
            generator=torch.Generator().manual_seed(1),
        )
    ]
    quantized = copy.deepcopy(model)
    with pytest.raises(ValueError, match="calibration"):
        int8.quantize_decoder(quantized, None, Int8Options(mode="static"))
    observers = int8.quantize_decoder(quantized, latents, Int8Options(mode="static"))
    assert len(observers) == 18 and all(o.amax > 0 for o in observers.values())
    assert "conv_pre" not in observers and isinstance(
        quantized.dec.conv_pre, torch.nn.Conv1d
    )
    assert sum(isinstance(m, Int8Conv1d) for m in quantized.dec.modules()) == 18


def test_from_config_accepts_int8(cfg):
    """The cuda backend's precision check lets int8 through (then wants a GPU); int4 is refused."""
    from dataclasses import replace

    from tts_engine.torch_vits.cuda_engine import CudaTtsEngine
    from base.errors import ConfigError, ModelError

    if torch.cuda.is_available():
        pytest.skip("builds a whole engine on CUDA")
    with pytest.raises(ModelError, match="no CUDA"):
        CudaTtsEngine.from_config(replace(cfg, tts=replace(cfg.tts, precision="int8")))
    with pytest.raises(ConfigError, match="int4"):
        CudaTtsEngine.from_config(replace(cfg, tts=replace(cfg.tts, precision="int4")))


# ---------------------------------------------------------------- CUDA (skipped without it)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize(
    "cout, k, m", [(24, 96, 16), (32, 224, 8), (128, 384, 70_000), (256, 1344, 4096)]
)
def test_cuda_int_mm_is_exact_in_our_layout(cout, k, m):
    """cuBLASLt int8 GEMM ``W @ cols^T`` with both operands K-contiguous, as ``Int8Conv1d``
    calls it: bit-exact against int32 arithmetic (cuBLAS once got transposed int8 inputs wrong)."""
    gen = torch.Generator(device="cuda").manual_seed(cout + k + m)
    w = torch.randint(
        -127, 128, (cout, k), device="cuda", dtype=torch.int8, generator=gen
    )
    cols = torch.randint(
        -127, 128, (m, k), device="cuda", dtype=torch.int8, generator=gen
    )
    ref = w.cpu().int() @ cols.cpu().int().t()
    assert torch.equal(torch._int_mm(w, cols.t()).cpu(), ref)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
def test_cuda_int8_conv_matches_float_conv(dynamic):
    torch.manual_seed(0)
    for cin, kernel, dilation in [(128, 3, 1), (64, 5, 6), (32, 7, 12)]:
        pad = dilation * (kernel - 1) // 2
        conv = torch.nn.Conv1d(cin, cin, kernel, dilation=dilation, padding=pad).cuda()
        x = torch.randn(3, cin, 2000, device="cuda")
        with torch.inference_mode():
            ref = conv(x)
            q = Int8Conv1d(conv, act_amax=float(x.abs().max()), dynamic=dynamic)
            y = q(x.half())
        assert y.dtype == torch.float16
        assert float((y.float() - ref).norm() / ref.norm()) < 0.02


@pytest.mark.gpu
@cuda
def test_cuda_runner_int8_with_graphs(voice_path):
    """precision "int8" on CUDA with graphs: calibration at build, fp16 around int8 convolutions."""
    ids = json.loads(BENCH.read_text())["sentences"][0]["ids"]
    ref_model = load_vits(voice_path, device="cuda")
    with torch.inference_mode():
        ref, _ = ref_model.infer(
            torch.tensor([ids], device="cuda"),
            torch.tensor([len(ids)], device="cuda"),
            0.0,
            1.0,
            0.0,
        )
    ref = ref[0].double().cpu().numpy()
    runner = StepRunner(
        load_vits(voice_path),
        RunnerOptions(chunk_frames=64, tail_chunk_frames=256, max_frames=1024, decode_batches=(1, 8),
                      encode_batches=(1,), phoneme_buckets=(256,), precision="int8"),
        "cuda",
    )  # fmt: skip
    assert runner.dtype == torch.float16
    assert (
        sum(isinstance(m, Int8Conv1d) for m in runner.synth_model.dec.modules()) == 18
    )
    pieces = speak_in_chunks(runner, ids)
    audio = np.concatenate(pieces)[: len(ref)] / 32767.0
    snr = snr_db(ref, audio)
    print(f"int8 on CUDA (graphs): SNR {snr:.1f} dB")
    assert snr >= STATIC_MIN_SNR_DB
