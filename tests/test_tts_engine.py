"""OnnxTtsEngine on the real Piper voice: parity with Piper, resampling, options, bad input."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from conftest import scaled

from tts_engine.cpu_engine import OnnxTtsEngine
from tts_engine.engine import AudioChunk, SynthesisOptions
from base.errors import InvalidInput

pytestmark = pytest.mark.slow

DETERMINISTIC = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
TEXT = "Hello there, how are you today? The weather is lovely this afternoon."


@pytest.fixture(scope="module")
def engine(cfg) -> OnnxTtsEngine:
    return OnnxTtsEngine.from_config(cfg)


@pytest.fixture(scope="module")
def piper_voice(engine):
    from piper.voice import PiperVoice

    return PiperVoice.load(engine.voice.model_path, engine.voice.config_path)


def pcm_of(chunks: list[AudioChunk]) -> np.ndarray:
    return np.concatenate([c.pcm for c in chunks])


def test_audio_equals_piper(engine, piper_voice):
    """Same text, deterministic scales: every sentence's int16 audio equals Piper's (±1 LSB)."""
    from piper.config import SynthesisConfig

    reference = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, normalize_audio=False)
    theirs = [c.audio_int16_array for c in piper_voice.synthesize(TEXT, reference)]
    ours = [c.pcm for c in engine.synthesize(TEXT, DETERMINISTIC)]
    assert len(ours) == len(theirs) == 2
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == np.int16 and a.shape == b.shape
        assert np.abs(a.astype(np.int32) - b).max() <= 1


def test_synthesize_ids_equals_direct_onnx_run(engine, piper_voice):
    ids = piper_voice.phonemes_to_ids(piper_voice.phonemize("Parity on ids alone.")[0])
    raw = piper_voice.session.run(
        None,
        {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),
        },
    )[0].reshape(-1)
    expected = np.clip(raw * 32767.0, -32767, 32767).astype(np.int16)
    (chunk,) = engine.synthesize_ids(ids, SynthesisOptions(noise_scale=0.0, noise_w=0.0, length_scale=1.0))
    assert chunk.final and chunk.clause_index == 0 and chunk.sample_rate == 22050
    assert np.abs(chunk.pcm.astype(np.int32) - expected).max() <= 1


def test_one_final_chunk_per_sentence(engine):
    chunks = list(engine.synthesize("One. Two, three? Four!"))
    assert [c.clause_index for c in chunks] == [0, 1, 2]
    assert all(c.final and c.sample_rate == engine.sample_rate and c.num_samples > 0 for c in chunks)


@pytest.mark.parametrize("rate", [16000, 24000])
def test_resampled_length_and_energy(engine, rate):
    native = pcm_of(list(engine.synthesize(TEXT, DETERMINISTIC))).astype(np.float64)
    chunks = list(engine.synthesize(TEXT, SynthesisOptions(noise_scale=0.0, noise_w=0.0, sample_rate=rate)))
    assert all(c.sample_rate == rate for c in chunks)
    resampled = pcm_of(chunks).astype(np.float64)
    expected_len = len(native) * rate / engine.sample_rate
    assert abs(len(resampled) - expected_len) <= 0.01 * expected_len
    energy_native = np.sum(native**2) / engine.sample_rate  # energy per second of signal
    energy_resampled = np.sum(resampled**2) / rate
    assert energy_resampled == pytest.approx(energy_native, rel=0.03)


def test_streaming_resampler_has_no_click_at_sentence_joins(engine):
    """Sentence-by-sentence streaming output equals resampling the joined native audio at once."""
    import soxr

    native = pcm_of(list(engine.synthesize(TEXT, DETERMINISTIC))).astype(np.float32) / 32767
    whole = soxr.resample(native, engine.sample_rate, 16000, quality="HQ") * 32767
    streamed = pcm_of(list(engine.synthesize(TEXT, SynthesisOptions(noise_scale=0.0, noise_w=0.0, sample_rate=16000))))
    n = min(len(whole), len(streamed))
    assert abs(len(whole) - len(streamed)) <= 2
    assert np.abs(streamed[:n].astype(np.float64) - whole[:n]).max() <= 3


def test_length_scale_per_request(engine):
    base = pcm_of(list(engine.synthesize(TEXT, DETERMINISTIC)))
    slow = pcm_of(list(engine.synthesize(TEXT, SynthesisOptions(noise_scale=0.0, noise_w=0.0, length_scale=1.5))))
    assert 1.35 < len(slow) / len(base) < 1.65


def test_noise_scale_zero_is_deterministic_and_default_is_not(engine):
    a, b = (pcm_of(list(engine.synthesize(TEXT, DETERMINISTIC))) for _ in range(2))
    assert np.array_equal(a, b)
    c, d = (pcm_of(list(engine.synthesize(TEXT))) for _ in range(2))
    assert len(c) != len(d) or not np.array_equal(c, d)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (SynthesisOptions(length_scale=0.0), "length_scale"),
        (SynthesisOptions(noise_scale=-1.0), "noise_scale"),
        (SynthesisOptions(noise_w=float("nan")), "finite"),
        (SynthesisOptions(sample_rate=100), "sample_rate"),
        (SynthesisOptions(speaker_id=5), "speaker 5"),
    ],
)
def test_bad_options_raise_at_call_time(engine, options, match):
    with pytest.raises(InvalidInput, match=match):
        engine.synthesize("Hello.", options)


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        ([], "phoneme_ids is empty"),
        ([1, 0, 999, 0, 2], "phoneme id 999 out of range: the voice has"),
        ([1, 0, -3, 0, 2], "phoneme id -3 out of range"),
        (["x"], "must be integers"),
        (["5"], "must be integers"),  # no silent int("5")
        ([1.5, 2.0], "must be integers"),  # no silent truncation
        ([True, False], "must be integers"),
        ([[1, 2], [3, 4]], "must be integers"),
        ([1, None], "must be integers"),
    ],
)
def test_bad_ids_are_invalid_input(engine, ids, match):
    with pytest.raises(InvalidInput, match=match):
        engine.synthesize_ids(ids)


def test_phoneme_id_array_keeps_the_ids_as_int64():
    from tts_engine.engine import check_phoneme_ids, phoneme_id_array

    for given in ([1, 5, 9], (1, 5, 9), np.array([1, 5, 9], np.int32), np.array([1, 5, 9], np.uint8)):
        ids = phoneme_id_array(given, 10)
        assert ids.dtype == np.int64 and ids.tolist() == [1, 5, 9]
        assert check_phoneme_ids(given, 10) == [1, 5, 9] and all(type(i) is int for i in check_phoneme_ids(given, 10))
    with pytest.raises(InvalidInput, match="phoneme id 10 out of range: the voice has 10 symbols"):
        phoneme_id_array([1, 10], 10)


@pytest.mark.parametrize("text", ["", "   ", "?!...", "😀 🎉", "\x00\x07"])
def test_nothing_to_say_yields_no_chunks(engine, text):
    assert list(engine.synthesize(text)) == []


def test_emoji_and_control_chars_still_speak_the_words(engine):
    chunks = list(engine.synthesize("Good\x07 morning 😀 everyone.", DETERMINISTIC))
    plain = list(engine.synthesize("Good morning everyone.", DETERMINISTIC))
    assert np.array_equal(pcm_of(chunks), pcm_of(plain))


def test_20000_chars_stream_the_first_sentence_quickly(engine):
    sentence = "The quick brown fox jumps over the lazy dog near the river bank. "
    start = time.perf_counter()
    one = engine.synthesize(sentence)
    next(one)
    one.close()
    alone = time.perf_counter() - start
    text = (sentence * 400)[:20_000]
    start = time.perf_counter()
    chunks = engine.synthesize(text)
    first = next(chunks)
    elapsed = time.perf_counter() - start
    chunks.close()  # the caller may stop early; the rest is never computed
    assert first.clause_index == 0 and first.num_samples > engine.sample_rate  # > 1 s of speech
    # About the time of that sentence alone (measured just before, under the same load),
    # not of 400 sentences: the rest of the text waits until it is read.
    assert elapsed < 3 * alone + scaled(0.5), (elapsed, alone)


def test_text_over_the_limit_is_rejected(engine, cfg):
    with pytest.raises(InvalidInput, match="limit is 20000"):
        engine.synthesize("a" * (cfg.limits.max_text_chars + 1))


def test_two_sessions_serve_two_threads(cfg):
    engine = OnnxTtsEngine.from_config(cfg.replace("tts", onnx_workers=2, onnx_threads=1))
    results: dict[int, np.ndarray] = {}

    def speak(i: int) -> None:
        results[i] = pcm_of(list(engine.synthesize(TEXT, DETERMINISTIC)))

    threads = [threading.Thread(target=speak, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(scaled(60))
    assert len(results) == 4
    assert all(np.array_equal(results[0], r) for r in results.values())


def test_factory_shares_one_engine_across_worker_threads(cfg):
    from tts_engine.factory import create_engines

    engines = create_engines(cfg.replace("tts", onnx_workers=2))
    assert len(engines) == 2 and engines[0] is engines[1]
    assert engines[0].model.workers == 2


def test_factory_rejects_unknown_backend(cfg):
    from tts_engine.factory import create_engines
    from base.errors import ConfigError

    with pytest.raises(ConfigError, match="tts.backend"):
        create_engines(cfg.replace("tts", backend="tpu"))
