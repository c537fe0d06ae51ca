"""``fused_resblock`` in plain PyTorch: one residual step of a HiFi-GAN stage, as the kernel computes it.

The reference the interpreter tests hold ``fused_resblock.conv_step`` to (``tests/test_kernels.py``);
a stage of blocks is ``decoder.ResBlock1``/``ResBlock2`` themselves.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def conv_step(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dilation: int, mask: torch.Tensor | None,
              residual: torch.Tensor | None, out: torch.Tensor, scale: float = 1.0, accumulate: bool = False,
              slope: float = 0.1) -> torch.Tensor:  # fmt: skip
    """``out (+)= scale * (conv(mask * leaky_relu(x, slope)) + bias + residual)`` in float32, ``weight``
    [K, C_out, C_in] tap-major, "same" padding at ``dilation``; written into ``out`` in its dtype."""
    h = F.leaky_relu(x.float(), slope)
    if mask is not None:
        h = h * mask.float()
    taps = weight.shape[0]
    y = F.conv1d(h, weight.float().permute(1, 2, 0), bias.float(), dilation=dilation,
                 padding=(taps - 1) * dilation // 2)  # fmt: skip
    if residual is not None:
        y = y + residual.float()
    y = y * scale
    if accumulate:
        y = y + out.float()
    return out.copy_(y)
