"""Export the PyTorch VITS as two ONNX models for other runtimes (e.g. TensorRT's ``trtexec``).

- ``encoder.onnx``: ``ids`` [B, T] int64, ``lengths`` [B] int64, ``scales`` [B, 3] float32
  (noise_scale, length_scale, noise_w) -> ``z_p`` [B, 192, F] float32 (per-frame prior
  sample), ``frames`` [B] int64 (F = max frames). Noise is drawn inside (RandomNormalLike).
- ``chunk_decoder.onnx``: ``z`` [B, 192, W], ``mask`` [B, 1, W] float32 (a window of
  ``z_p`` with ``context`` frames each side, 0 outside the utterance) -> ``audio``
  [B, (W - 2 * context) * hop] float32 in [-1, 1]. ``context`` is written in the model's
  metadata (``context_frames``, ``hop_length``).

Dynamic axes: batch, phonemes, frames, window. Usage::

    python -m tts_engine.torch_vits.export_onnx VOICE.onnx OUT_DIR [--check]

``--check`` runs both files with onnxruntime against PyTorch. TensorRT itself is not
part of voxloop; build engines with, e.g.,
``trtexec --onnx=chunk_decoder.onnx --minShapes=z:1x192x152,mask:1x1x152 ...``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tts_engine.torch_vits.chunked import ChunkGeometry, decode_windows
from tts_engine.torch_vits.model import Vits
from tts_engine.torch_vits.weights import load_vits

OPSET = 17


class EncoderExport(nn.Module):
    """ids -> per-frame prior sample (text encoder, duration predictor, expansion)."""

    def __init__(self, model: Vits) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x, m_p, logs_p, mask = self.model.encode(ids, lengths)
        w_ceil, frames = self.model.durations(x, mask, scales[:, 2], scales[:, 1])
        z_p = self.model.expand_prior(m_p, logs_p, w_ceil, frames.max(), scales[:, 0])
        return z_p, frames


class ChunkDecoderExport(nn.Module):
    """A masked ``z_p`` window -> the audio of its middle (flow + decoder)."""

    def __init__(self, model: Vits) -> None:
        super().__init__()
        self.model = model
        self.geometry = ChunkGeometry.for_model(model, 1)

    def forward(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return decode_windows(self.model, z * mask, mask, self.geometry)


def export(model: Vits, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``encoder.onnx`` and ``chunk_decoder.onnx`` (float32) into ``out_dir``."""
    import onnx

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = model.float().eval().cpu()
    geometry = ChunkGeometry.for_model(model, 64)
    enc_path, dec_path = out / "encoder.onnx", out / "chunk_decoder.onnx"
    ids = torch.randint(1, model.config.n_vocab, (2, 40))
    lengths = torch.tensor([40, 31])
    scales = torch.tensor([[0.667, 1.0, 0.8]] * 2)
    with torch.no_grad():
        torch.onnx.export(
            EncoderExport(model), (ids, lengths, scales), str(enc_path), dynamo=False, opset_version=OPSET,
            input_names=["ids", "lengths", "scales"], output_names=["z_p", "frames"],
            dynamic_axes={"ids": {0: "batch", 1: "phonemes"}, "lengths": {0: "batch"}, "scales": {0: "batch"},
                          "z_p": {0: "batch", 2: "frames"}, "frames": {0: "batch"}},
        )  # fmt: skip
        w = geometry.window_frames
        z = torch.randn(2, model.config.inter_channels, w)
        mask = torch.ones(2, 1, w)
        torch.onnx.export(
            ChunkDecoderExport(model), (z, mask), str(dec_path), dynamo=False, opset_version=OPSET,
            input_names=["z", "mask"], output_names=["audio"],
            dynamic_axes={"z": {0: "batch", 2: "window"}, "mask": {0: "batch", 2: "window"},
                          "audio": {0: "batch", 1: "samples"}},
        )  # fmt: skip
    meta = onnx.load(str(dec_path))
    for key, value in (("context_frames", geometry.context), ("hop_length", geometry.hop_length)):
        entry = meta.metadata_props.add()
        entry.key, entry.value = key, str(value)
    onnx.save(meta, str(dec_path))
    return enc_path, dec_path


def check(model: Vits, enc_path: Path, dec_path: Path, ids: list[int]) -> dict[str, float]:
    """Max abs difference, onnxruntime vs PyTorch, for one utterance (noise scales 0) and a 2-chunk batch."""
    import onnxruntime as ort

    model = model.float().eval().cpu()
    enc = ort.InferenceSession(str(enc_path), providers=["CPUExecutionProvider"])
    dec = ort.InferenceSession(str(dec_path), providers=["CPUExecutionProvider"])
    feeds = {"ids": np.array([ids], dtype=np.int64), "lengths": np.array([len(ids)], dtype=np.int64),
             "scales": np.array([[0.0, 1.0, 0.0]], dtype=np.float32)}  # fmt: skip
    z_ort, frames_ort = enc.run(None, feeds)
    with torch.no_grad():
        z_pt, frames_pt = EncoderExport(model)(*(torch.from_numpy(v) for v in feeds.values()))
    report = {"encoder_max_abs": float(np.abs(z_ort - z_pt.numpy()).max()),
              "frames_equal": float(np.array_equal(frames_ort, frames_pt.numpy()))}  # fmt: skip
    geometry = ChunkGeometry.for_model(model, 48)
    z = torch.randn(2, model.config.inter_channels, geometry.window_frames)
    mask = torch.ones(2, 1, geometry.window_frames)
    mask[1, :, -geometry.context - 10 :] = 0  # second row: the utterance ends inside the chunk
    with torch.no_grad():
        audio_pt = ChunkDecoderExport(model)(z, mask).numpy()
    audio_ort = dec.run(None, {"z": z.numpy(), "mask": mask.numpy()})[0]
    report["decoder_max_abs"] = float(np.abs(audio_ort - audio_pt).max())
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("voice", help="Piper voice .onnx (or a PyTorch checkpoint)")
    parser.add_argument("out_dir")
    parser.add_argument("--check", action="store_true", help="compare with PyTorch through onnxruntime")
    args = parser.parse_args(argv)
    model = load_vits(args.voice)
    enc_path, dec_path = export(model, args.out_dir)
    print(f"wrote {enc_path} and {dec_path}")
    if args.check:
        print(check(model, enc_path, dec_path, [1, 0, *range(20, 60), 0, 2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
