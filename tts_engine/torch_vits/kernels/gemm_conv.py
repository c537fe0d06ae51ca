"""The encoder's 1-D convolutions without cuDNN: matrix products and shifted multiply-adds.

The text encoder and the duration predictor run in fp32 (durations are ceil'd: TF32 or fp16
could move an utterance's length by a frame), where cuDNN has no tensor-core kernels. On the
H200 its fp32 implicit-GEMM kernels took a fifth of the GPU's time under load, it has to time
its algorithms for every captured shape at start-up, and its untimed choice held ~100 GB of
workspace in the captured graphs (``0e31f7b:bench/results/tts_load-h200-2026-12-03-inflight.md``).

``GemmConv1d`` computes the same sums in fp32 as

* a convolution of ``groups = 1``: the ``kernel_size`` shifted views of the padded input stacked
  on the channel axis (one copy), times the weight as a ``[out, kernel_size * in]`` matrix
  (one cuBLAS product; ``kernel_size = 1``: no copy);
* a depthwise convolution (``groups = in = out``): one multiply-add per tap.

Only the summation order differs from cuDNN's, as it differs between cuDNN's own algorithms.
``use_gemm_convs`` swaps them into a module in place (weights shared, nothing copied).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class GemmConv1d(nn.Module):
    """An ``nn.Conv1d`` (stride 1, zero padding) computed without cuDNN."""

    def __init__(self, conv: nn.Conv1d) -> None:
        super().__init__()
        (stride,), (dilation,), (kernel,) = conv.stride, conv.dilation, conv.kernel_size
        padding = conv.padding
        if stride != 1 or conv.padding_mode != "zeros" or isinstance(padding, str):
            raise ValueError(f"GemmConv1d: stride 1, zero padding given as a number only; got {conv}")
        out_ch, in_per_group, _ = conv.weight.shape
        self.depthwise = conv.groups > 1
        if self.depthwise and not (conv.groups == conv.in_channels == out_ch and in_per_group == 1):
            raise ValueError(f"GemmConv1d: groups must be 1 or in = out channels (depthwise); got {conv}")
        self.kernel, self.dilation, self.padding = kernel, dilation, padding[0]
        w = conv.weight.detach()
        # depthwise: [C, k]; otherwise [out, k * in], tap-major as the stacked input below
        self.register_buffer("weight", w[:, 0, :].contiguous() if self.depthwise else w.permute(0, 2, 1).reshape(out_ch, -1).contiguous())
        self.register_buffer("bias", None if conv.bias is None else conv.bias.detach().view(-1, 1).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [B, in, T] -> [B, out, T + 2 * padding - dilation * (kernel - 1)]."""
        if self.padding:
            x = F.pad(x, (self.padding, self.padding))
        k, d = self.kernel, self.dilation
        t = x.shape[2] - d * (k - 1)
        taps = [x[:, :, i * d : i * d + t] for i in range(k)]
        if self.depthwise:
            y = taps[0] * self.weight[:, :1]
            for i in range(1, k):
                y = torch.addcmul(y, taps[i], self.weight[:, i : i + 1])
        else:
            y = torch.matmul(self.weight, taps[0] if k == 1 else torch.cat(taps, dim=1))
        return y if self.bias is None else y + self.bias


def use_gemm_convs(module: nn.Module) -> int:
    """Replace every ``nn.Conv1d`` inside ``module`` by a ``GemmConv1d`` of the same weights;
    returns how many were replaced."""
    replaced = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Conv1d):
            setattr(module, name, GemmConv1d(child))
            replaced += 1
        else:
            replaced += use_gemm_convs(child)
    return replaced
