"""The GPU engine's Triton kernels, each beside its plain PyTorch reference.

Layout (as kernel libraries such as Liger-Kernel lay theirs out): ``<kernel>.py`` holds the Triton
kernels and the small modules that carry a layer's weights into them; ``<kernel>_ref.py`` is what the
kernel computes, in plain PyTorch on the same arguments. ``tests/test_kernels.py`` holds each kernel
to its reference in Triton's interpreter on the CPU; ``tests/test_fused_*.py`` hold them to the
model's own layers (the voice's weights); ``tests/test_gpu_tts.py`` runs them on a GPU, in the engine.
``gemm_conv`` is no Triton kernel: PyTorch convolutions as cuBLAS products (its reference is
``nn.Conv1d`` itself).

The kernels know the model's layers only by their attributes (a layer's weights): nothing here imports
the model, runner or scheduler around it (``tests/test_layers.py`` checks it); the engine
(``runner.StepRunner``) swaps them in with ``tts.triton_kernels``.

- ``fused_resblock``: the decoder's residual blocks, one launch per dilated convolution step;
- ``fused_upsample``: the decoder's input, upsampling (polyphase) and output convolutions;
- ``fused_flow``: the flow's WaveNet layers (gate; residual and skip);
- ``fused_duration``: the duration predictor's depth-separable convolutions and spline;
- ``fused_ffn``: the text encoder's feed-forward convolutions;
- ``fused_attention``: the text encoder's relative-position attention, residual sums and LayerNorms;
- ``fused_prior``: the prior's expansion to frames into the engine's slots;
- ``gemm_conv``: the fp32 encoder's convolutions as cuBLAS products.
"""

from __future__ import annotations

import os

import torch

try:  # triton ships with CUDA builds of PyTorch; CPU-only installs lack it
    import triton
except ImportError:  # pragma: no cover - depends on the install
    triton = None


def available() -> bool:
    """Triton importable and a CUDA device present (or Triton's interpreter asked for)."""
    return triton is not None and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")
