"""VoiceActivityDetector on speech from the bundled Piper voice (16 kHz int16)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from bench.piper_speech import RATE, PiperSpeech, noise, silence

from asr.vad import (
    NOISE_RISE_DB_S,
    SILENT_DBFS,
    TRAILING_MS,
    Pause,
    SpeechEnd,
    SpeechStart,
    VoiceActivityDetector,
)
from bench.turn_taking import human_voices, read_voice
from base.config import VadConfig
from base.errors import ConfigError, InvalidInput

VAD = VadConfig(aggressiveness=2, frame_ms=30, start_frames=3, silence_duration_ms=500,
                prefix_padding_ms=300, speculative_pause_ms=200)


def run(pcm: np.ndarray, vad: VadConfig = VAD, chunk: int = 480, max_utterance_s: float = 30.0):
    det = VoiceActivityDetector(vad, sample_rate=RATE, max_utterance_s=max_utterance_s)
    events = []
    for i in range(0, len(pcm), chunk):
        events += det.feed(pcm[i : i + chunk])
    return events


def kinds(events) -> list[str]:
    return [type(e).__name__ for e in events]


def ms(samples: int) -> float:
    return samples * 1000 / RATE


@pytest.fixture(scope="module")
def speech(cfg):
    say = PiperSpeech(cfg).say
    return {
        "a": say("Turn off the lights"),
        "b": say("in the kitchen, please."),
        "q": say("What is the capital of France?"),
    }


# --- speech ------------------------------------------------------------------


@pytest.mark.slow
def test_short_pause_does_not_end_the_turn(speech):
    vad = dataclasses.replace(VAD, speculative_pause_ms=90)
    pcm = np.concatenate([silence(500), speech["a"], silence(190), speech["b"], silence(1000)])
    events = run(pcm, vad)
    assert kinds(events) == ["SpeechStart", "Pause", "Resume", "Pause", "SpeechEnd"]
    pause, resume, end = events[1], events[2], events[-1]
    gap_start, gap_end = 500 + ms(len(speech["a"])), 500 + ms(len(speech["a"])) + 190
    assert gap_start - 60 <= pause.t_ms <= gap_start + 60
    assert gap_end - 60 <= resume.t_ms <= gap_end + 60
    # One utterance holding both parts and the gap.
    assert ms(len(end.audio)) >= ms(len(speech["a"]) + len(speech["b"])) + 190


@pytest.mark.slow
def test_one_second_silence_splits_two_utterances(speech):
    a, q = speech["a"], speech["q"]
    pcm = np.concatenate([silence(600), a, silence(1000), q, silence(800)])
    events = run(pcm)
    starts = [e for e in events if isinstance(e, SpeechStart)]
    ends = [e for e in events if isinstance(e, SpeechEnd)]
    assert len(starts) == 2 and len(ends) == 2
    assert not any(e.forced for e in ends)
    onset_q = 600 + ms(len(a)) + 1000
    assert abs(starts[0].t_ms - 600) <= 60
    assert abs(starts[1].t_ms - onset_q) <= 60
    assert abs(ends[0].t_ms - (600 + ms(len(a)))) <= 90
    times = [e.t_ms for e in events]
    assert times == sorted(times)


@pytest.mark.slow
def test_utterance_audio_is_the_input_from_prefix_to_trailing(speech):
    pcm = np.concatenate([silence(700), speech["q"], silence(900)])
    events = run(pcm)
    start, end = events[0], events[-1]
    assert isinstance(start, SpeechStart) and isinstance(end, SpeechEnd)
    first = (start.t_ms - VAD.prefix_padding_ms) * RATE // 1000
    last = (end.t_ms + TRAILING_MS) * RATE // 1000
    np.testing.assert_array_equal(end.audio, pcm[first:last])
    # The whole spoken part is inside, with (almost all of) the padding before it.
    assert first <= (700 - VAD.prefix_padding_ms + VAD.frame_ms) * RATE // 1000
    assert last >= (700 + ms(len(speech["q"]))) * RATE // 1000


@pytest.mark.slow
def test_prefix_padding_length(speech):
    pcm = np.concatenate([silence(700), speech["q"], silence(900)])
    lengths = {}
    for pad in (0, 150, 300):
        end = run(pcm, dataclasses.replace(VAD, prefix_padding_ms=pad))[-1]
        lengths[pad] = ms(len(end.audio))
    assert lengths[150] - lengths[0] == pytest.approx(150, abs=1)
    assert lengths[300] - lengths[0] == pytest.approx(300, abs=1)


@pytest.mark.slow
def test_end_after_pause_carries_the_pause_audio(speech):
    pcm = np.concatenate([silence(400), speech["q"], silence(800)])
    events = run(pcm)
    assert kinds(events) == ["SpeechStart", "Pause", "SpeechEnd"]
    np.testing.assert_array_equal(events[1].audio, events[2].audio)
    assert events[1].audio_so_far is events[1].audio


@pytest.mark.parametrize("chunk", [77, 160, 1000, 4801])
@pytest.mark.slow
def test_odd_chunk_sizes_give_the_same_events(speech, chunk):
    pcm = np.concatenate([silence(300), speech["a"], silence(700), speech["q"], silence(700)])
    ref = run(pcm, chunk=len(pcm))
    got = run(pcm, chunk=chunk)
    assert kinds(got) == kinds(ref) and len(ref) >= 4
    for e, r in zip(got, ref):
        assert e.t_ms == r.t_ms
        if isinstance(r, (SpeechEnd, Pause)):
            np.testing.assert_array_equal(e.audio, r.audio)


@pytest.mark.slow
def test_max_utterance_forces_an_end(speech):
    # 6.6 s of talk cut every 1.5 s: the fifth piece is 0.6 s of speech, then silence ends it.
    talk = np.concatenate([speech["q"], speech["a"], speech["b"]] * 2)[: RATE * 66 // 10]
    pcm = np.concatenate([silence(300), talk, silence(800)])
    events = run(pcm, max_utterance_s=1.5)
    ends = [e for e in events if isinstance(e, SpeechEnd)]
    assert ends[0].forced
    assert ms(len(ends[0].audio)) == pytest.approx(1500, abs=30)
    assert kinds(events).count("SpeechStart") >= 2  # speech goes on after the cut
    assert not ends[-1].forced


@pytest.mark.slow
def test_utterance_so_far_flush_and_reset(speech):
    det = VoiceActivityDetector(VAD)
    assert det.utterance_so_far() is None and det.flush() == []
    events = det.feed(np.concatenate([silence(400), speech["q"][: RATE // 2]]))
    assert kinds(events) == ["SpeechStart"] and det.in_speech
    partial = det.utterance_so_far()
    assert partial is not None and ms(len(partial)) >= 400
    (end,) = det.flush()
    assert isinstance(end, SpeechEnd) and end.forced
    np.testing.assert_array_equal(end.audio, partial)
    assert not det.in_speech
    det.feed(speech["q"][RATE // 2 :])
    assert det.in_speech
    det.reset()
    assert not det.in_speech and det.utterance_so_far() is None
    assert det.stream_ms == pytest.approx(400 + ms(len(speech["q"])), abs=1)


# --- the noise gate ------------------------------------------------------------------


def end_after_speech(pcm: np.ndarray, rms: float, gate_db: float) -> list[float]:
    """SpeechEnd times minus the end of ``pcm`` (ms), for ``pcm`` between 0.5 s and 1 s of noise."""
    x = np.concatenate([silence(500), pcm, silence(1000)]).astype(np.float64)
    if rms:
        x += noise(ms(len(x)), rms, seed=1)
    events = run(np.clip(x, -32768, 32767).astype(np.int16), dataclasses.replace(VAD, noise_gate_db=gate_db))
    assert kinds(events)[0] == "SpeechStart" and kinds(events).count("SpeechStart") == 1
    assert kinds(events)[-2:] == ["Pause", "SpeechEnd"]  # one utterance (with pauses inside)
    return [e.t_ms - 500 - ms(len(pcm)) for e in events if isinstance(e, SpeechEnd)]


@pytest.mark.slow
@pytest.mark.parametrize("rms", [0, 10, 30])  # digital silence, -70 and -60 dBFS white noise
def test_noise_gate_ends_speech_where_the_voice_ends(speech, rms):
    """webrtcvad alone calls 30-100 ms after the last word voiced; the gate ends the speech there."""
    gated = [end_after_speech(speech[k], rms, 3.0)[0] for k in ("q", "a", "b")]
    alone = [end_after_speech(speech[k], rms, 0.0)[0] for k in ("q", "a", "b")]
    assert all(-30 <= g <= 30 for g in gated), gated
    assert np.mean(alone) - np.mean(gated) >= 40, (alone, gated)


ALSA_VOICES = human_voices()


@pytest.mark.skipif(not ALSA_VOICES, reason="no human recordings: apt-get install alsa-utils (make system-deps)")
def test_noise_gate_on_a_human_voice():
    """alsa-utils' recordings of a person ("Front center", ...): the gate ends them near the last sound."""
    gated, alone = [], []
    for f in ALSA_VOICES:
        pcm = read_voice(f)
        loud = np.flatnonzero(np.abs(pcm) > 100)  # -50 dBFS: the recording's own floor is lower
        pcm = pcm[loud[0]: loud[-1] + 1]
        gated += end_after_speech(pcm, 10, 3.0)
        alone += end_after_speech(pcm, 10, 0.0)
    assert len(gated) == len(ALSA_VOICES) == 8
    assert all(-60 <= g <= 40 for g in gated), gated
    assert np.mean(alone) - np.mean(gated) >= 25, (alone, gated)


def test_noise_floor_follows_the_noise():
    det = VoiceActivityDetector(VAD)
    assert det.noise_dbfs is None
    det.feed(noise(1000, 100, seed=2))  # -50.3 dBFS
    assert det.noise_dbfs == pytest.approx(20 * np.log10(100 / 32768), abs=1.5)
    det.feed(noise(300, 10, seed=3))  # falls at once
    assert det.noise_dbfs == pytest.approx(20 * np.log10(10 / 32768), abs=1.5)
    quiet = det.noise_dbfs
    det.feed(noise(1000, 100, seed=4))  # rises at most NOISE_RISE_DB_S per second
    assert quiet < det.noise_dbfs <= quiet + NOISE_RISE_DB_S + 0.5
    det.feed(silence(300))
    assert det.noise_dbfs == SILENT_DBFS


# --- no speech ------------------------------------------------------------------


# White noise RMS in int16 units: 30 / 300 / 1000 ~ -60 / -40 / -30 dBFS. webrtcvad calls
# loud white noise speech at low aggressiveness (and at -20 dBFS at any setting).
@pytest.mark.parametrize("aggressiveness, noise_levels", [(1, (30, 300)), (2, (30, 300, 1000)),
                                                          (3, (30, 300, 1000))])
def test_silence_and_noise_give_nothing(aggressiveness, noise_levels):
    vad = dataclasses.replace(VAD, aggressiveness=aggressiveness)
    assert run(silence(3000), vad) == []
    for rms in noise_levels:
        assert run(noise(3000, rms, seed=rms), vad) == [], rms


# --- validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [{"frame_ms": 25}, {"aggressiveness": 4}, {"aggressiveness": -1}, {"start_frames": 0},
     {"silence_duration_ms": 10}, {"prefix_padding_ms": -1}, {"noise_gate_db": -1.0},
     {"noise_gate_db": 21.0}],
)
def test_bad_config_is_a_config_error(change):
    with pytest.raises(ConfigError):
        VoiceActivityDetector(dataclasses.replace(VAD, **change))


def test_bad_rate_and_input():
    with pytest.raises(ConfigError):
        VoiceActivityDetector(VAD, sample_rate=22050)
    with pytest.raises(ConfigError):
        VoiceActivityDetector(VAD, max_utterance_s=0)
    det = VoiceActivityDetector(VAD)
    with pytest.raises(InvalidInput):
        det.feed(np.zeros(480, dtype=np.float32))
    with pytest.raises(InvalidInput):
        det.feed(np.zeros((2, 480), dtype=np.int16))
    with pytest.raises(InvalidInput):
        det.feed(b"\x00\x00\x00")
    assert det.feed(b"\x00\x00" * 1000) == []
    assert det.stream_ms == pytest.approx(1000 * 1000 / RATE)


def test_from_config(cfg):
    det = VoiceActivityDetector.from_config(cfg)
    assert det.frame_samples == RATE * cfg.vad.frame_ms // 1000
