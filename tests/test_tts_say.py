"""``voxloop say`` end to end through ``voxloop.cli.main``."""

from __future__ import annotations

import sys
import types
import wave

import numpy as np
import pytest

from voxloop.cli import main


@pytest.mark.slow
def test_say_writes_a_wav(tmp_path):
    out = tmp_path / "hello.wav"
    rc = main(["say", "Hello there. This is a test of the voice.", "-o", str(out), "--rate", "16000",
               "--length-scale", "1.1"])
    assert rc == 0
    with wave.open(str(out), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 16000)
        frames = wav.getnframes()
        pcm = np.frombuffer(wav.readframes(frames), dtype="<i2")
    assert 1.5 < frames / 16000 < 6.0
    assert np.sqrt(np.mean(pcm.astype(np.float64) ** 2)) > 300  # speech, not silence


@pytest.mark.slow
def test_say_with_explicit_voice(tmp_path, cfg):
    from base import models

    out = tmp_path / "v.wav"
    assert main(["say", "Hi.", "-o", str(out), "--voice", str(models.resolve_voice(cfg).path)]) == 0
    with wave.open(str(out), "rb") as wav:
        assert wav.getframerate() == 22050 and wav.getnframes() > 0


def test_say_missing_voice_is_a_clear_error(tmp_path, capsys):
    rc = main(["say", "Hi.", "-o", str(tmp_path / "x.wav"), "--voice", str(tmp_path / "missing.onnx")])
    assert rc == 2
    assert "missing.onnx does not exist" in capsys.readouterr().err
    assert not (tmp_path / "x.wav").exists()


@pytest.mark.slow
def test_say_nothing_speakable(tmp_path, capsys):
    assert main(["say", "?!", "-o", str(tmp_path / "x.wav")]) == 2
    assert "nothing to say" in capsys.readouterr().err


def test_say_needs_an_output(capsys):
    assert main(["say", "Hi."]) == 2
    assert "-o FILE.wav and/or --play" in capsys.readouterr().err


def _portaudio_output_available() -> bool:
    try:
        import sounddevice

        sounddevice.check_output_settings()
    except Exception:
        return False
    return True


@pytest.mark.skipif(_portaudio_output_available(), reason="this machine can play sound")
def test_play_without_sound_support_fails_clearly(capsys):
    """No PortAudio or no output device here: a clear message, before any synthesis."""
    assert main(["say", "Hi.", "--play"]) == 2
    err = capsys.readouterr().err
    assert "cannot play audio" in err and "-o FILE.wav" in err


def test_play_without_output_device_fails_clearly(monkeypatch, capsys):
    class PortAudioError(Exception):
        pass

    def no_device(**_kwargs):
        raise PortAudioError("Error querying device -1")

    fake = types.SimpleNamespace(PortAudioError=PortAudioError, check_output_settings=no_device)
    monkeypatch.setitem(sys.modules, "sounddevice", fake)
    assert main(["say", "Hi.", "--play"]) == 2
    assert "no usable output device" in capsys.readouterr().err
