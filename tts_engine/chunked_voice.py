"""The voice as chunked ONNX for streaming CPU synthesis (``tts.streaming``), exported once and cached.

``encoder.onnx`` + ``chunk_decoder.onnx`` (``tts_engine.onnx_streaming.export_chunked``) are
written into a scratch folder, then renamed into ``<cache>/vits-chunked/<voice>-<sha256[:16]>``
(the cache directory of ``base.models``), so a half-written export never looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from base import models
from base.config import Config

#: Version of the chunked export's layout; a cache folder of another version is exported again.
CHUNKED_FORMAT = 1
_CHUNKED_STAMP = "voxloop-export.json"


def needs_chunked_voice(cfg: Config) -> bool:
    """True when the CPU backend streams (``tts.streaming`` or ``tts.stream_first_clause``) a
    single-speaker voice."""
    if cfg.tts.backend != "onnx" or not (cfg.tts.streaming or cfg.tts.stream_first_clause):
        return False
    voice = models.resolve_voice(cfg).path
    data = json.loads(models.voice_config_path(cfg, voice).read_text(encoding="utf-8"))
    return int(data.get("num_speakers", 1)) <= 1


def chunked_voice_dir(cfg: Config, voice: Path) -> Path:
    """Cache folder of ``voice``'s chunked export, named by the voice file's sha256."""
    return models.cache_dir(cfg) / "vits-chunked" / f"{voice.stem}-{models.sha256_file(voice)[:16]}"


def resolve_chunked_voice(cfg: Config, prepare: bool = True) -> models.ModelInfo:
    """The voice as ``encoder.onnx`` + ``chunk_decoder.onnx``, exported on first use.

    The export needs PyTorch (ModelError with an install hint without it) and ~10 s;
    running the files needs only onnxruntime.
    """
    voice = models.resolve_voice(cfg)
    target = chunked_voice_dir(cfg, voice.path)
    if prepare and not _chunked_complete(target):
        export_chunked_voice(voice.path, target)
    size = models.size_of(target) if target.exists() else 0
    return models.ModelInfo("tts-chunked", f"export:{voice.path.name}", target, size, None, voice.license)


def _chunked_complete(target: Path) -> bool:
    stamp = target / _CHUNKED_STAMP
    try:
        return json.loads(stamp.read_text()).get("format") == CHUNKED_FORMAT
    except (OSError, ValueError):
        return False


def export_chunked_voice(voice: Path, target: Path) -> Path:
    """Export ``voice`` into ``target`` atomically: scratch folder, fsync, rename, stamp inside."""
    from tts_engine.onnx_streaming import export_chunked

    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        export_chunked(voice, scratch)
        (scratch / _CHUNKED_STAMP).write_text(json.dumps({"voice": voice.name, "format": CHUNKED_FORMAT}) + "\n")
        for path in scratch.iterdir():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        os.chmod(scratch, 0o755)  # mkdtemp makes it owner-only
        if target.exists():  # stale format or incomplete: move it aside first
            os.rename(target, scratch.with_name(scratch.name + "-old"))
        try:
            os.rename(scratch, target)
        except OSError:
            if not _chunked_complete(target):  # another process finished first: keep its files
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(scratch.with_name(scratch.name + "-old"), ignore_errors=True)
    return target
