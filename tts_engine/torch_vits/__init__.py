"""PyTorch VITS for Piper voices: one model definition, the GPU engine, ONNX export.

- ``model.Vits`` (+ ``text_encoder``, ``duration``, ``flow``, ``decoder``): the model;
- ``weights.load_vits``: weights from a Piper ``.onnx`` or a PyTorch checkpoint;
- ``chunked``: flow + decoder on frame chunks, equal to the whole utterance;
- ``runner`` / ``scheduler``: static-shape CUDA-graph steps and continuous batching;
- ``cuda_engine.CudaTtsEngine``: the ``TtsEngine`` for ``tts.backend = "cuda"``;
- ``export_onnx``: encoder and chunk decoder as ONNX (for TensorRT users).

Needs ``pip install -e '.[torch]'`` (torch, onnx). Importing this package imports torch.
"""

from __future__ import annotations

from voxloop.config import Config


def create_engines(cfg: Config) -> list:
    """Engines for the server's TTS worker threads (``tts_engine.factory``).

    One ``CudaTtsEngine`` is shared by ``tts.max_batch`` worker threads: each thread
    streams one clause at a time, and the engine batches all of them on the GPU.
    """
    from tts_engine.torch_vits.cuda_engine import CudaTtsEngine

    engine = CudaTtsEngine.from_config(cfg)
    return [engine] * max(1, cfg.tts.max_batch)
