"""``fused_upsample`` in plain PyTorch: the decoder's input convolution, upsampling layers and output
convolution with the leaky ReLU and mask before each, as the kernels compute them (``tests/test_kernels.py``)."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def _act(x: torch.Tensor, mask: torch.Tensor | None, slope: float | None) -> torch.Tensor:
    h = x.float() if slope is None else F.leaky_relu(x.float(), slope)
    return h if mask is None else h * mask.float()


def conv(x: torch.Tensor, mask: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None, padding: int,
         slope: float | None = None) -> torch.Tensor:  # fmt: skip
    """``conv1d(mask * act(x)) + bias`` (``FusedRows.from_conv``; ``slope`` None: no activation)."""
    return F.conv1d(_act(x, mask, slope), weight.float(), None if bias is None else bias.float(), padding=padding)


def upsample(x: torch.Tensor, mask: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None, stride: int,
             padding: int, slope: float | None) -> torch.Tensor:  # fmt: skip
    """The transposed convolution ``FusedRows.from_polyphase`` computes: ``conv_transpose1d(mask * act(x)) + bias``."""
    return F.conv_transpose1d(_act(x, mask, slope), weight.float(), None if bias is None else bias.float(),
                              stride=stride, padding=padding)  # fmt: skip


def conv_out(x: torch.Tensor, mask: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None,
             slope: float) -> torch.Tensor:  # fmt: skip
    """``FusedOut``: ``tanh(conv_post(mask * leaky_relu(x)))`` to one row, [B, C, T] -> [B, T]."""
    y = F.conv1d(_act(x, mask, slope), weight.float(), None if bias is None else bias.float(),
                 padding=(weight.shape[-1] - 1) // 2)  # fmt: skip
    return torch.tanh(y[:, 0])
