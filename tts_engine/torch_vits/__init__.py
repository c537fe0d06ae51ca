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

from base.config import Config


def create_engines(cfg: Config) -> list:
    """Engines for the server's TTS worker threads (``tts_engine.factory``).

    One ``CudaTtsEngine`` serves every session: the server submits clauses to its scheduler
    directly and receives each GPU step's chunks in bulk (``pipeline.speech.BatchedSpeech``).
    """
    from tts_engine.torch_vits.cuda_engine import CudaTtsEngine

    engine = CudaTtsEngine.from_config(cfg)
    return [engine]
