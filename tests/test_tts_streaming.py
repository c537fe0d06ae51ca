"""Streaming CPU TTS: the voice's chunked ONNX export, chunked == whole, first audio early, export caching."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import scaled

from tts_engine import chunked_voice, onnx_streaming
from tts_engine.cpu_engine import OnnxTtsEngine
from tts_engine.engine import SynthesisOptions
from tts_engine.onnx_backend import InferenceScales, OnnxVits
from tts_engine.onnx_streaming import ChunkPlan, _SessionPool
from base import models
from base.errors import ModelError

SENTENCES = Path(__file__).resolve().parent.parent / "bench" / "tts_sentences.json"
ZERO = InferenceScales(noise_scale=0.0, length_scale=1.0, noise_w=0.0)
QUIET = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
TEXT = "Hello there, how are you today? The weather is lovely this afternoon, so we could walk to the river."


def bench_sentences(n: int) -> list[dict]:
    """The first ``n`` benchmark sentences (frozen espeak-ng ids, 3-5 s of audio each)."""
    return json.loads(SENTENCES.read_text())["sentences"][:n]


# ---------------------------------------------------------------- pure parts


@pytest.mark.parametrize("frames", [1, 63, 64, 65, 345, 576, 577, 3000])
def test_chunk_plan_covers_the_sentence_with_a_small_first_chunk(frames):
    plan = ChunkPlan(first_frames=64, tail_frames=512)
    sizes = plan.sizes(frames)
    assert sum(sizes) == frames and sizes[0] == min(frames, 64)
    later = sizes[1:]
    assert len(later) == (math.ceil((frames - 64) / 512) if frames > 64 else 0)
    assert all(0 < s <= 512 for s in later) and (not later or max(later) - min(later) <= 1)


def test_session_pool_serves_the_earliest_deadline_first():
    pool = _SessionPool([("enc", "dec")])
    order: list[str] = []

    def wait(name: str, deadline: float) -> None:
        with pool.take(deadline):
            order.append(name)

    with pool.take(0.0):  # the only pair is busy while two callers queue up
        late = threading.Thread(target=wait, args=("later chunk", 5.0))
        late.start()
        _until(lambda: len(pool._waiting) == 1)
        first = threading.Thread(target=wait, args=("first chunk", 1.0))
        first.start()
        _until(lambda: len(pool._waiting) == 2)
    for t in (late, first):
        t.join(scaled(10))
    assert order == ["first chunk", "later chunk"]


def _until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + scaled(timeout_s)
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_missing_torch_is_a_clear_model_error(cfg, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    monkeypatch.setitem(sys.modules, "tts_engine.torch_vits.export_onnx", None)
    stream_cfg = cfg.replace("models", cache_dir=str(tmp_path)).replace("tts", streaming=True)
    with pytest.raises(ModelError, match=r"needs PyTorch.*pip install -e '\.\[torch\]'.*tts\.streaming = false"):
        OnnxTtsEngine.from_config(stream_cfg)
    assert list((tmp_path / "vits-chunked").iterdir()) == []  # no half-written export left behind


def test_stale_export_is_replaced_atomically(cfg, tmp_path, monkeypatch):
    """Orchestration only (a fake exporter): an old-format folder is re-exported and swapped in whole."""
    calls: list[Path] = []

    def fake_export(voice: Path, out: Path) -> None:
        calls.append(out)
        (out / onnx_streaming.ENCODER_FILE).write_bytes(b"enc")
        (out / onnx_streaming.DECODER_FILE).write_bytes(b"dec")

    monkeypatch.setattr(onnx_streaming, "export_chunked", fake_export)
    stream_cfg = cfg.replace("models", cache_dir=str(tmp_path)).replace("tts", streaming=True)
    target = chunked_voice.chunked_voice_dir(stream_cfg, models.resolve_voice(stream_cfg).path)
    target.mkdir(parents=True)
    (target / "voxloop-export.json").write_text(json.dumps({"format": chunked_voice.CHUNKED_FORMAT - 1}))
    (target / "leftover.onnx").write_bytes(b"old")
    info = chunked_voice.resolve_chunked_voice(stream_cfg)
    assert info.path == target and len(calls) == 1 and calls[0] != target
    assert sorted(p.name for p in target.iterdir()) == ["chunk_decoder.onnx", "encoder.onnx", "voxloop-export.json"]
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # scratch and old folders gone
    chunked_voice.resolve_chunked_voice(stream_cfg)
    assert len(calls) == 1


# ---------------------------------------------------------------- the real voice


@pytest.fixture(scope="module")
def exported(cfg, tmp_path_factory):
    """One real export into a fresh cache (counted), then the streaming engine built from that config."""
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    stream_cfg = cfg.replace("models", cache_dir=str(tmp_path_factory.mktemp("cache"))).replace("tts", streaming=True)
    calls: list[Path] = []
    real_export = onnx_streaming.export_chunked

    def counting_export(voice: Path, out: Path) -> None:
        calls.append(out)
        real_export(voice, out)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(onnx_streaming, "export_chunked", counting_export)
        first = chunked_voice.resolve_chunked_voice(stream_cfg)
        second = chunked_voice.resolve_chunked_voice(stream_cfg)
        engine = OnnxTtsEngine.from_config(stream_cfg)  # the lazy path: finds the export, no second one
    return SimpleNamespace(cfg=stream_cfg, first=first, second=second, calls=calls, engine=engine)


@pytest.fixture(scope="module")
def whole(exported) -> OnnxTtsEngine:
    return OnnxTtsEngine(exported.engine.voice)


@pytest.mark.slow
def test_export_happens_once_into_the_cache(exported):
    assert len(exported.calls) == 1
    assert exported.first.path == exported.second.path == exported.engine.chunked.model_dir
    assert exported.first.path.parent == models.cache_dir(exported.cfg) / "vits-chunked"
    names = sorted(p.name for p in exported.first.path.iterdir())
    assert names == ["chunk_decoder.onnx", "encoder.onnx", "voxloop-export.json"]
    assert [p.name for p in exported.first.path.parent.iterdir()] == [exported.first.path.name]
    assert exported.engine.streaming and exported.engine.chunked.context_frames > 0


@pytest.mark.slow
def test_models_command_lists_the_export_without_redoing_it(exported, monkeypatch, capsys):
    from voxloop.cli import main

    def no_export(voice: Path, out: Path) -> None:
        raise AssertionError("exported again")

    monkeypatch.setattr(onnx_streaming, "export_chunked", no_export)
    argv = ["--set", f"models.cache_dir={exported.cfg.models.cache_dir}", "--set", "tts.streaming=true"]
    assert main([*argv, "models", "--no-checksum"]) == 0
    out = capsys.readouterr().out
    assert "tts-chunked" in out and str(exported.first.path) in out


@pytest.mark.slow
def test_chunked_audio_equals_the_whole_sentence(exported):
    """Noise 0: many chunks == one chunk of the same export, and == Piper's own graph run whole."""
    chunked, rate = exported.engine.chunked, exported.engine.sample_rate
    piper = OnnxVits(exported.engine.voice.model_path)
    for sentence in bench_sentences(3):
        pieces = list(chunked.stream(sentence["ids"], ZERO, ChunkPlan(32, 96), rate))
        assert len(pieces) >= 4 and [last for _, last in pieces] == [False] * (len(pieces) - 1) + [True]
        audio = np.concatenate([a for a, _ in pieces])
        (one_chunk, _), = chunked.stream(sentence["ids"], ZERO, ChunkPlan(100_000, 100_000), rate)
        reference = piper.infer(sentence["ids"], ZERO)
        assert audio.shape == one_chunk.shape == reference.shape
        assert np.abs(audio - one_chunk).max() < 1e-5
        assert np.abs(audio - reference).max() < 1e-3  # float rounding of the re-export only


@pytest.mark.parametrize("rate", [None, 16000])
@pytest.mark.slow
def test_engine_streams_what_the_whole_sentence_engine_says(exported, whole, rate):
    options = SynthesisOptions(noise_scale=0.0, noise_w=0.0, sample_rate=rate)
    streamed = list(exported.engine.synthesize(TEXT, options))
    reference = list(whole.synthesize(TEXT, options))
    assert len(streamed) > len(reference) == 2
    for index, ref in enumerate(reference):
        mine = [c for c in streamed if c.clause_index == index]
        assert [c.final for c in mine] == [False] * (len(mine) - 1) + [True]
        pcm = np.concatenate([c.pcm for c in mine]).astype(np.int32)
        assert pcm.shape == ref.pcm.shape
        assert np.abs(pcm - ref.pcm).max() <= 8  # ~2.4e-4 of full scale, resampler joins included


@pytest.mark.slow
def test_first_chunk_arrives_before_the_sentence_is_done(exported):
    sentence = min(bench_sentences(40), key=lambda s: abs(s["audio_s"] - 4.0))  # a 4 s sentence
    start = time.perf_counter()
    arrivals, chunks = [], []
    for chunk in exported.engine.synthesize_ids(sentence["ids"], QUIET):
        arrivals.append(time.perf_counter() - start)
        chunks.append(chunk)
    hop, plan = exported.engine.chunked.hop_length, exported.engine.chunk_plan
    assert sum(c.duration_s for c in chunks) > 3.0 and len(chunks) > 1
    assert chunks[0].num_samples == plan.first_frames * hop and not chunks[0].final and chunks[-1].final
    assert arrivals[0] < 0.75 * arrivals[-1]  # the first chunk is ~1/3 of the work


@pytest.mark.slow
def test_noise_zero_is_deterministic_and_default_noise_is_not(exported):
    a, b = (np.concatenate([c.pcm for c in exported.engine.synthesize(TEXT, QUIET)]) for _ in range(2))
    assert np.array_equal(a, b)
    c, d = (np.concatenate([c.pcm for c in exported.engine.synthesize(TEXT)]) for _ in range(2))
    assert len(c) != len(d) or not np.array_equal(c, d)


@pytest.mark.slow
def test_concurrent_streams_share_one_session_and_stay_exact(exported):
    """Three threads, one session pair: chunks interleave, every result equals the sequential one."""
    ids = bench_sentences(1)[0]["ids"]
    expected = np.concatenate([c.pcm for c in exported.engine.synthesize_ids(ids, QUIET)])
    results: dict[int, np.ndarray] = {}

    def speak(i: int) -> None:
        results[i] = np.concatenate([c.pcm for c in exported.engine.synthesize_ids(ids, QUIET)])

    threads = [threading.Thread(target=speak, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(scaled(60))
    assert exported.engine.chunked.workers == 1 and len(results) == 3
    assert all(np.array_equal(r, expected) for r in results.values())


@pytest.mark.slow
def test_factory_gives_streaming_engines_more_threads_than_sessions(exported):
    from tts_engine.factory import STREAMS_PER_SESSION, create_engines

    engines = create_engines(exported.cfg.replace("tts", onnx_workers=2))
    assert len(engines) == 2 * STREAMS_PER_SESSION and all(e is engines[0] for e in engines)
    assert engines[0].chunked.workers == 2 and engines[0].model is None


@pytest.mark.slow
async def test_stream_first_clause_streams_a_replys_first_clause_only(exported, whole):
    """``tts.stream_first_clause``: whole sentences by default, decoder chunks for what is asked
    with ``stream=True`` — which ``ThreadedSpeech`` asks for a reply's first clause (URGENT)."""
    import threading

    from pipeline.speech import ThreadedSpeech
    from pipeline.workers import NORMAL, URGENT, ModelWorker

    cfg = exported.cfg.replace("tts", streaming=False, stream_first_clause=True)
    engine = OnnxTtsEngine.from_config(cfg)  # finds the export made above
    assert engine.can_stream and not engine.streaming and engine.model is not None
    options = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
    reference = list(whole.synthesize(TEXT, options))
    assert len(list(engine.synthesize(TEXT, options))) == len(reference) == 2  # one chunk per sentence
    streamed = list(engine.synthesize(TEXT, options, stream=True))
    assert len(streamed) > 2
    pcm = np.concatenate([c.pcm for c in streamed if c.clause_index == 0]).astype(np.int32)
    assert np.abs(pcm - reference[0].pcm).max() <= 8
    worker = ModelWorker("tts-test", [engine], queue_size=4)
    try:
        speech = ThreadedSpeech(worker)
        counts = {}
        for priority in (URGENT, NORMAL):
            counts[priority] = len([c async for c in speech.stream(TEXT, options, threading.Event(), priority)])
    finally:
        worker.close()
    assert counts[URGENT] > counts[NORMAL] == 2
