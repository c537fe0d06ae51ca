"""``fused_flow`` in plain PyTorch: a flow WaveNet's gated dilated layers from ``FusedWaveNet.layers``, in
float32 as the kernels keep the residual stream and the skip sum (``tests/test_kernels.py``)."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def wavenet(x: torch.Tensor, mask: torch.Tensor, layers: list[tuple], hidden: int) -> torch.Tensor:
    """``x`` [B, H, T] (masked) -> the masked skip sum [B, H, T] in ``x``'s dtype; ``layers``: per layer
    (input weight [K, 2H, H] tap-major, its bias, dilation, res/skip weight [2H or H, H], its bias)."""
    h, out = x.float(), torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for i, (w_in, b_in, dilation, w_rs, b_rs) in enumerate(layers):
        taps = w_in.shape[0]
        x_in = F.conv1d(h, w_in.float().permute(1, 2, 0), b_in.float(), dilation=dilation,
                        padding=(taps - 1) * dilation // 2)  # fmt: skip
        acts = torch.tanh(x_in[:, :hidden]) * torch.sigmoid(x_in[:, hidden:])
        rs = torch.matmul(w_rs.float(), acts) + b_rs.float().view(1, -1, 1)
        if i < len(layers) - 1:
            h = (h + rs[:, :hidden]) * mask
            out = out + rs[:, hidden:]
        else:
            out = out + rs
    return (out * mask).to(x.dtype)
