"""Voice / VoiceConfig loading and the ModelError for missing or corrupt voice files."""

from __future__ import annotations

import json
import shutil

import pytest

from tts_engine.voice import Voice, VoiceConfig
from base.errors import InvalidInput, ModelError


@pytest.fixture(scope="module")
def voice_files(cfg):
    from base import models

    onnx = models.resolve_voice(cfg).path
    return onnx, models.voice_config_path(cfg, onnx)


@pytest.fixture()
def config_dict(voice_files):
    return json.loads(voice_files[1].read_text())


def test_from_dict_reads_piper_fields(config_dict):
    config = VoiceConfig.from_dict(config_dict)
    assert config.sample_rate == config_dict["audio"]["sample_rate"]
    assert config.espeak_voice == config_dict["espeak"]["voice"]
    assert config.noise_scale == pytest.approx(config_dict["inference"]["noise_scale"])
    assert config.noise_w == pytest.approx(config_dict["inference"]["noise_w"])
    assert config.length_scale == pytest.approx(config_dict["inference"]["length_scale"])
    assert config.num_speakers == config_dict["num_speakers"]
    assert config.phoneme_id_map["^"] == tuple(config_dict["phoneme_id_map"]["^"])
    assert len(config.phoneme_id_map) == len(config_dict["phoneme_id_map"])


def test_defaults_when_inference_absent(config_dict):
    del config_dict["inference"]
    config = VoiceConfig.from_dict(config_dict)
    assert (config.noise_scale, config.length_scale, config.noise_w) == (0.667, 1.0, 0.8)


def test_missing_phoneme_id_map_names_the_file(tmp_path, config_dict):
    del config_dict["phoneme_id_map"]
    path = tmp_path / "v.onnx.json"
    path.write_text(json.dumps(config_dict))
    with pytest.raises(ModelError, match=r"v\.onnx\.json.*phoneme_id_map"):
        VoiceConfig.load(path)


def test_id_map_without_pad_is_rejected(config_dict):
    del config_dict["phoneme_id_map"]["_"]
    with pytest.raises(ModelError, match="special symbol '_'"):
        VoiceConfig.from_dict(config_dict, source="x.json")


def test_invalid_json_names_the_file(tmp_path, voice_files):
    onnx = tmp_path / "voice.onnx"
    onnx.symlink_to(voice_files[0])
    (tmp_path / "voice.onnx.json").write_text('{"audio": {"sample_rate": 22050},')
    with pytest.raises(ModelError, match=r"voice\.onnx\.json is not valid JSON"):
        Voice.load(onnx)


def test_missing_voice_names_the_file(tmp_path):
    with pytest.raises(ModelError, match=r"nope\.onnx does not exist"):
        Voice.load(tmp_path / "nope.onnx")


def test_missing_config_names_the_file(tmp_path, voice_files):
    onnx = tmp_path / "voice.onnx"
    onnx.symlink_to(voice_files[0])
    with pytest.raises(ModelError, match=r"voice\.onnx\.json does not exist"):
        Voice.load(onnx)


def test_explicit_config_path(tmp_path, voice_files):
    cfg_copy = tmp_path / "other.json"
    shutil.copyfile(voice_files[1], cfg_copy)
    voice = Voice.load(voice_files[0], cfg_copy)
    assert voice.config_path == cfg_copy and voice.sample_rate == 22050


def test_truncated_onnx_is_a_model_error(tmp_path, voice_files):
    from tts_engine.onnx_backend import OnnxVits

    truncated = tmp_path / "cut.onnx"
    with open(voice_files[0], "rb") as src:
        truncated.write_bytes(src.read(1_000_000))
    shutil.copyfile(voice_files[1], tmp_path / "cut.onnx.json")
    voice = Voice.load(truncated)  # the config is fine; the weights fail when a backend loads them
    with pytest.raises(ModelError, match=r"cannot load voice model .*cut\.onnx"):
        OnnxVits(voice.model_path)


def test_empty_onnx_is_a_model_error(tmp_path, voice_files):
    (tmp_path / "empty.onnx").write_bytes(b"")
    shutil.copyfile(voice_files[1], tmp_path / "empty.onnx.json")
    with pytest.raises(ModelError, match=r"empty\.onnx is empty"):
        Voice.load(tmp_path / "empty.onnx")


def test_speaker_ids(voice_files, config_dict):
    single = Voice.load(voice_files[0])
    assert single.speaker_id(None) is None and single.speaker_id(0) is None
    with pytest.raises(InvalidInput, match="one speaker"):
        single.speaker_id(3)
    config_dict.update(num_speakers=4, default_speaker_id=2)
    multi = Voice(single.model_path, VoiceConfig.from_dict(config_dict), single.config_path)
    assert multi.speaker_id(None) == 2 and multi.speaker_id(1) == 1
    with pytest.raises(InvalidInput, match="speaker 4 out of range"):
        multi.speaker_id(4)
