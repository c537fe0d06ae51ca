"""``fused_ffn`` in plain PyTorch: the text encoder's feed-forward convolutions with their mask, padding,
tap stacking, bias and ReLU, as the kernels compute them (``tests/test_kernels.py`` holds them to it)."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def stack_taps(x: torch.Tensor, mask: torch.Tensor, kernel: int, pad: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` [B, C, T], ``mask`` [B, 1, T] -> the ``kernel`` shifted views of ``v`` (``x * mask``, or
    ``relu(x + bias) * mask``) zero-padded by ``pad`` on the left, stacked tap-major: [B, kernel * C, T]."""
    v = x * mask if bias is None else torch.relu(x + bias.view(1, -1, 1)) * mask
    padded = F.pad(v, (pad, kernel - 1 - pad))
    return torch.cat([padded[:, :, k : k + x.shape[2]] for k in range(kernel)], dim=1)


def conv(x: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, kernel: int, pad: int,
         relu: bool) -> torch.Tensor:  # fmt: skip
    """``relu(conv(x * mask) + bias)`` or (``relu`` False) ``(conv(x * mask) + bias) * mask``; ``weight``
    [O, kernel * C] tap-major, ``bias`` [O], ``pad`` zeros on the left (``kernel - 1 - pad`` on the right).
    Past a sentence's end nothing reads the output (the kernel stores 0 in blocks wholly past it)."""
    y = torch.matmul(weight, stack_taps(x, mask, kernel, pad)) + bias.view(1, -1, 1)
    return torch.relu(y) if relu else y * mask
