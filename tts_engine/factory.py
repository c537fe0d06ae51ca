"""Build the TTS engine instances the server's TTS worker threads use, from config."""

from __future__ import annotations

import importlib

from tts_engine.engine import TtsEngine
from base.config import Config
from base.errors import ConfigError, ModelError

#: Streaming CPU engine: clauses in flight per onnxruntime session. Their chunks share the
#: sessions first-chunk-first, so a new clause's first audio waits for one chunk, not whole clauses.
STREAMS_PER_SESSION = 4


def create_engines(cfg: Config) -> list[TtsEngine]:
    """One engine per TTS worker thread, for ``cfg.tts.backend``.

    "onnx": one ``OnnxTtsEngine`` holding ``tts.onnx_workers`` onnxruntime sessions,
    returned once per session (``STREAMS_PER_SESSION`` times per session when it streams);
    it is thread-safe, so each worker thread calls the same object and takes a free
    session per clause, or per chunk when streaming (voice and front end are shared).
    "cuda": delegated to ``tts_engine.torch_vits.create_engines(cfg)``, imported only then.
    """
    backend = cfg.tts.backend
    if backend == "onnx":
        from tts_engine.cpu_engine import OnnxTtsEngine

        engine = OnnxTtsEngine.from_config(cfg)
        return [engine] * (max(1, cfg.tts.onnx_workers) * (STREAMS_PER_SESSION if engine.streaming else 1))
    if backend == "cuda":
        try:
            module = importlib.import_module("tts_engine.torch_vits")
        except ImportError as exc:
            raise ModelError(
                f"tts.backend = 'cuda' needs PyTorch and tts_engine.torch_vits ({exc}); "
                "install with `pip install -e '.[torch]'` or set tts.backend = 'onnx'"
            ) from None
        return list(module.create_engines(cfg))
    raise ConfigError(f"tts.backend must be 'onnx' or 'cuda', got {backend!r}")
