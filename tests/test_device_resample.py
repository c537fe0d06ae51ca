"""The GPU engine's resampler (``tts_engine.torch_vits.resample``), run here on the CPU: the filter's
accuracy against exact sines, its stopband, and chunks that join into the whole utterance resampled
at once whatever the chunk size, position and utterance end."""

from __future__ import annotations

import numpy as np
import pytest
from triton_interpreter import interpret, needs_triton

torch = pytest.importorskip("torch")

from tts_engine.torch_vits.resample import ChunkResampler, OutputSpan  # noqa: E402

HOP = 256
RATES = [(22050, 24000), (16000, 24000), (22050, 16000), (22050, 48000), (24000, 24000)]


def tones(rate: int, n: int, freqs: list[float]) -> np.ndarray:
    t = np.arange(n) / rate
    return sum(0.2 * np.sin(2 * np.pi * f * t + i) for i, f in enumerate(freqs))


def snr_db(reference: np.ndarray, signal: np.ndarray) -> float:
    return float(10 * np.log10((reference**2).mean() / ((signal - reference) ** 2).mean()))


def level_db(audio: np.ndarray, rate: int, freq: float) -> float:
    """Peak level near ``freq`` relative to a full-scale sine, dB (Hann window)."""
    window = np.hanning(len(audio))
    spectrum = np.abs(np.fft.rfft(audio * window)) / (window.sum() / 2)
    k = int(round(freq * len(audio) / rate))
    return float(20 * np.log10(spectrum[max(k - 20, 0) : k + 20].max()))


@pytest.mark.parametrize("in_rate, out_rate", RATES)
def test_resampled_tones_match_the_exact_tones_at_the_new_rate(in_rate, out_rate):
    """Tones up to 80 % of the lower Nyquist frequency come out as the same tones sampled at
    ``out_rate`` (the sample grids aligned at 0) to within 90 dB."""
    resampler = ChunkResampler(in_rate, out_rate, HOP)
    freqs = [440.0, 1000.0, 3000.0, 0.8 * min(in_rate, out_rate) / 2]
    n = 257 * HOP
    out = resampler.whole(torch.from_numpy(tones(in_rate, n, freqs)).float()).numpy()
    assert out.shape == (-(-n * out_rate // in_rate),)
    exact = tones(out_rate, len(out), freqs)
    inner = slice(len(out) // 10, -len(out) // 10)  # away from the zeros before and after
    assert snr_db(exact[inner], out[inner]) > 90


def test_stopband_removes_images_and_aliases():
    up = ChunkResampler(22050, 24000, HOP)
    n = 400 * HOP
    out = up.whole(torch.from_numpy(tones(22050, n, [10000.0]) / 0.2).float()).numpy()[5000:-5000]
    assert level_db(out, 24000, 10000) > -1  # passband (0.91 of 11 025 Hz)
    assert level_db(out, 24000, 24000 - (22050 - 10000)) < -80  # the image at 12 050 Hz, folded
    down = ChunkResampler(22050, 16000, HOP)
    out = down.whole(torch.from_numpy(tones(22050, n, [9000.0]) / 0.2).float()).numpy()[5000:-5000]
    assert level_db(out, 16000, 16000 - 9000) < -80  # 9 kHz is above 8 kHz: it must not alias to 7 kHz


@pytest.mark.parametrize("in_rate, out_rate", RATES)
@pytest.mark.parametrize("chunk", [1, 7, 32, 256])
def test_chunks_join_into_the_whole_utterance(in_rate, out_rate, chunk):
    """Each chunk is resampled from its window (the chunk and ``edge_frames`` beyond each side, as
    the decoder delivers it, with noise past the utterance's end that must be ignored); the
    chunks' spans, put together, are exactly the whole utterance resampled at once."""
    resampler = ChunkResampler(in_rate, out_rate, HOP)
    rng = np.random.default_rng(chunk)
    frames = 97  # not a multiple of any chunk size above but 1
    audio = rng.uniform(-0.5, 0.5, frames * HOP).astype(np.float32)
    whole = resampler.whole(torch.from_numpy(audio)).numpy()
    edge = resampler.edge_frames
    # What the decoder sees: its output is defined (but not the utterance) before 0 and past the end.
    padded = rng.uniform(-1, 1, (frames + 2 * edge + chunk) * HOP).astype(np.float32)
    padded[edge * HOP : (edge + frames) * HOP] = audio
    joined = np.full(resampler.out_samples(frames * HOP), np.nan, np.float32)
    starts = list(range(0, frames, chunk))
    windows = torch.from_numpy(np.stack([padded[s * HOP : (s + chunk + 2 * edge) * HOP] for s in starts]))
    rows = resampler(windows, torch.tensor(starts), torch.full((len(starts),), frames), chunk).numpy()
    assert rows.shape == (len(starts), resampler.row_samples(chunk))
    for s, row in zip(starts, rows):
        span = resampler.span(s, min(s + chunk, frames))
        assert np.isnan(joined[span.start : span.stop]).all()  # no output sample belongs to two chunks
        joined[span.start : span.stop] = span.of(row)
    assert not np.isnan(joined).any()
    np.testing.assert_allclose(joined, whole, atol=1e-6)


def test_equal_rates_pass_through():
    resampler = ChunkResampler(22050, 22050, HOP)
    assert resampler.identity and resampler.edge_frames == 0 and resampler.row_samples(32) == 32 * HOP
    audio = torch.linspace(-1, 1, 32 * HOP)[None]
    assert torch.equal(resampler(audio, torch.tensor([64]), torch.tensor([200]), 32), audio)
    assert resampler.span(64, 96) == OutputSpan(0, 64 * HOP, 96 * HOP)


def test_padding_rows_are_silent():
    """A batch's padding rows (utterance length 0) resample to zeros, whatever the decoder made."""
    resampler = ChunkResampler(22050, 24000, HOP)
    window = torch.rand(2, (32 + 2 * resampler.edge_frames) * HOP)
    rows = resampler(window, torch.tensor([0, 0]), torch.tensor([100, 0]), 32)
    assert rows[0].abs().max() > 0.1 and rows[1].abs().max() == 0


def test_bad_rates_are_refused():
    with pytest.raises(ValueError, match="positive"):
        ChunkResampler(0, 24000, HOP)


FUSED_SCRIPT = r"""
import json
import torch
from tts_engine.torch_vits.resample import ChunkResampler

worst, rows_checked = 0, 0
torch.manual_seed(0)
for in_rate, out_rate in [(22050, 24000), (16000, 24000), (22050, 16000)]:
    plain = ChunkResampler(in_rate, out_rate, 256)
    fused = ChunkResampler(in_rate, out_rate, 256, fused=True)
    for chunk in (1, 8):
        width = (chunk + 2 * plain.edge_frames) * 256 + 64
        audio = torch.rand(3, width) - 0.5
        audio = audio[:, 32:-32]  # a view with a row stride larger than its width, as the decoder's slice
        starts = torch.tensor([0, 5, 40])
        frames = torch.tensor([7, 50, 0])  # an utterance that ends inside the chunk; a padding row
        want = plain.int16(audio, starts, frames, chunk)
        got = fused.int16(audio, starts, frames, chunk)
        assert got.dtype == torch.int16 and got.shape == want.shape
        for row, (s, f) in enumerate(zip(starts.tolist(), frames.tolist())):
            span = plain.span(s, max(s, min(s + chunk, f)))  # the samples handed out (none of a padding row)
            if span.stop > span.start:
                worst = max(worst, int((span.of(got[row]).int() - span.of(want[row]).int()).abs().max()))
            rows_checked += 1
print(json.dumps({"worst": worst, "rows": rows_checked, "peak": int(want.abs().max())}))
"""


@needs_triton
def test_fused_kernel_is_the_same_resampler():
    """The Triton kernel (``fused=True``, in Triton's interpreter here) against the PyTorch path:
    the same int16 samples where a row's span is (the sums in another order: at most one step apart
    after truncation), for up- and downsampling, partial chunks and padding rows, from a strided
    decoder slice. (Past the span the PyTorch path reads clamped indices; those samples are dropped.)"""
    result = interpret(FUSED_SCRIPT)
    assert result["rows"] == 18 and result["peak"] > 1000 and result["worst"] <= 1
