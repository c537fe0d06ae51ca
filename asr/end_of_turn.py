"""End of turn from the audio: has the user finished speaking? (smart-turn v3.2, ONNX on CPU)

``EndOfTurnModel.score(pcm16k)`` takes the utterance so far (int16 or float32 mono at
16 kHz, ending at the pause) and returns the probability (0..1) that the speaker's turn
is complete. The model reads the last ``WINDOW_S`` seconds; shorter audio is zero-padded
*in front*, as the model was trained.

Input of the ONNX graph (``input_features``, float32 ``(1, 80, 800)``): Whisper log-mel
features of the 8 s window: the waveform is first normalized to zero mean and unit
variance (over the padded window), then 80 Slaney mel bands of a 400-point periodic-Hann
STFT with hop 160 (10 ms), the last frame dropped, log10 clipped to 8 below the maximum
and scaled as ``(x + 4) / 4``. faster-whisper's ``FeatureExtractor`` computes exactly
that spectrogram (float32 arithmetic) when called without its trailing padding, so the
normalization is the only step done here. The output (``(1, 1)``) is already a sigmoid
probability; the model's authors call ``> 0.5`` complete.

The ONNX file is quantized (QuantizeLinear / DequantizeLinear around its matrix products), which
onnxruntime fuses into int8 kernels. On an x86-64 CPU without VNNI (AVX2 only) those kernels'
16-bit intermediate sums saturate (microsoft/onnxruntime#6004) and the model stops telling
complete from incomplete: on such a CPU (AMD EPYC, AVX2) the bundled voice's complete sentences
scored 0.730 on average and the cut ones 0.791 (``tests/test_end_of_turn.py``). Unfused, the
products run in float32 on the dequantized weights (slower) and the model separates them again
(``test_unfused_model_tells_complete_from_incomplete``). ``int8_kernels_exact`` decides: with VNNI
(or off x86) the fused int8 kernels, else the unfused graph.
"""

from __future__ import annotations

import logging
import platform
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort

from base.config import Config
from base.errors import InvalidInput

SAMPLE_RATE = 16000
#: Audio the model reads, seconds (the end of the utterance).
WINDOW_S = 8
WINDOW_SAMPLES = WINDOW_S * SAMPLE_RATE
#: The waveform normalization's variance floor (Whisper's feature extractor).
_VARIANCE_EPS = 1e-7

log = logging.getLogger(__name__)


def int8_kernels_exact(cpuinfo: str | None = None) -> bool:
    """Whether onnxruntime's fused int8 matrix kernels compute without saturating on this CPU: any
    non-x86 CPU, or an x86-64 one with AVX-512 VNNI or AVX-VNNI. Unknown flags (no /proc/cpuinfo)
    count as no. ``cpuinfo``: the text of /proc/cpuinfo (default: read it)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return True
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    return re.search(r"\b(avx512_vnni|avx_vnni)\b", cpuinfo) is not None


def window(pcm16k: np.ndarray) -> np.ndarray:
    """The last ``WINDOW_S`` s of ``pcm16k`` as float32 in [-1, 1], zero-padded in front."""
    if not isinstance(pcm16k, np.ndarray) or pcm16k.ndim != 1:
        raise InvalidInput("end-of-turn audio must be a 1-D array of 16 kHz samples")
    x = pcm16k.astype(np.float32) / 32768.0 if pcm16k.dtype == np.int16 else pcm16k.astype(np.float32)
    x = x[-WINDOW_SAMPLES:]
    if len(x) < WINDOW_SAMPLES:
        x = np.concatenate((np.zeros(WINDOW_SAMPLES - len(x), np.float32), x))
    return x


class LogMel:
    """Whisper log-mel features of one 8 s window: float32 ``(80, 800)``."""

    def __init__(self) -> None:
        from faster_whisper.feature_extractor import FeatureExtractor

        self._extract = FeatureExtractor(feature_size=80, chunk_length=WINDOW_S)

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """``audio``: exactly ``WINDOW_SAMPLES`` float32 samples (``window()``)."""
        x = (audio - audio.mean()) / np.sqrt(audio.var() + _VARIANCE_EPS)
        return self._extract(x.astype(np.float32), padding=0).astype(np.float32)


class EndOfTurnModel:
    """smart-turn v3.2 on onnxruntime; one instance per thread (``ModelWorker``)."""

    def __init__(self, path: str | Path, threads: int = 1, int8_kernels: bool | None = None) -> None:
        """``int8_kernels``: let onnxruntime fuse the quantized products into int8 kernels (default:
        ``int8_kernels_exact()``); False keeps them in float32 on the dequantized weights."""
        so = ort.SessionOptions()
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.inter_op_num_threads = 1
        so.intra_op_num_threads = threads
        #: Whether the int8 kernels run (False: the float32 graph, on a CPU where they would saturate).
        self.int8_kernels = int8_kernels_exact() if int8_kernels is None else int8_kernels
        if not self.int8_kernels:
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            log.info("end-of-turn model: no VNNI on this CPU, its int8 products would saturate; running them "
                     "in float32 (slower)")  # fmt: skip
        self._session = ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
        #: The model's input features: 16 kHz audio -> Whisper log-mel frames of one window (``LogMel``).
        self.features = LogMel()

    @classmethod
    def from_config(cls, cfg: Config) -> "EndOfTurnModel":
        from base.models import resolve_turn

        return cls(resolve_turn(cfg).path, threads=cfg.turn.threads)

    def score(self, pcm16k: np.ndarray) -> float:
        """Probability (0..1) that the turn is complete, from the utterance ending now."""
        features = self.features(window(pcm16k))[np.newaxis]
        out = self._session.run(None, {"input_features": features})[0]
        return float(np.asarray(out).reshape(-1)[0])

    def warmup(self) -> None:
        self.score(np.zeros(SAMPLE_RATE, np.int16))
