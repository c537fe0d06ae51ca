"""The text encoder's feed-forward layers with their elementwise work fused into the stacking of
convolution taps (GPU; ``tts.fused_text_encoder``).

Each of the encoder's six feed-forward layers is ``conv_2(pad(relu(conv_1(pad(x * mask))) * mask)) * mask``
with 3-tap convolutions, in fp32. As cuBLAS products (``gemm_conv.GemmConv1d``, ``tts.encoder_convs =
"gemm"``) each convolution first stacks its shifted inputs (``[B, 3 C, T]``); in PyTorch the mask,
padding, stacking, bias and ReLU around the two products are eight passes over tensors of up to
``[B, 3 x 768, T]``, about a third of a layer's time on the H200 at 64 sentences of the 256-id bucket
(``bench/results/tts_load-h200-2026-12-04-encoder.md``). Here one Triton kernel per convolution writes
the stacked taps straight from its input:

* before ``conv_1``: ``x * mask`` (``x`` in any layout: the encoder's LayerNorm hands it transposed);
* before ``conv_2``: ``relu(y + bias_1) * mask`` of ``conv_1``'s product ``y``;

taps outside the sequence are 0 (the zero padding). The products are the same ``torch.matmul`` calls
on the same contiguous stacks as ``GemmConv1d``'s, and the elementwise operations are PyTorch's in
PyTorch's order, so the layer's output is the same, bit for bit, as with ``GemmConv1d`` (tested:
``tests/test_fused_ffn.py`` in Triton's interpreter, ``tests/test_gpu_tts.py`` on a GPU).

``use_fused_ffn(module)`` swaps every ``FeedForward`` inside ``module`` for ``FusedFeedForward``.
"""

from __future__ import annotations

import torch
from torch import nn

from tts_engine.torch_vits.fused_resblock import available, triton
from tts_engine.torch_vits.gemm_conv import GemmConv1d
from tts_engine.torch_vits.text_encoder import FeedForward

#: Channels and time steps per program.
BLOCK_C = 32
BLOCK_T = 64


if triton is not None:
    import triton.language as tl

    @triton.jit
    def _stack_taps(x_ptr, mask_ptr, bias_ptr, out_ptr, C, T, s_b, s_c, s_t,
                    K: tl.constexpr, PAD: tl.constexpr, RELU_BIAS: tl.constexpr,
                    BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr):  # fmt: skip
        """``out[b, i * C + c, t] = v[b, c, t + i - PAD]`` (0 outside ``[0, T)``), with
        ``v = x * mask`` or, with ``RELU_BIAS``, ``v = relu(x + bias[c]) * mask``; ``out`` contiguous."""
        pid_t = tl.program_id(0)
        pid_c = tl.program_id(1)
        b = tl.program_id(2)
        offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        cin = offs_c < C
        if RELU_BIAS:
            bias = tl.load(bias_ptr + offs_c, mask=cin, other=0.0)
        for i in tl.static_range(K):
            s = offs_t + (i - PAD)
            inside = (s >= 0) & (s < T)
            v = tl.load(x_ptr + b * s_b + offs_c[:, None] * s_c + s[None, :] * s_t,
                        mask=cin[:, None] & inside[None, :], other=0.0)  # fmt: skip
            m = tl.load(mask_ptr + b * T + s, mask=inside, other=0.0)
            if RELU_BIAS:
                v = tl.maximum(v + bias[:, None], 0.0)
            v = tl.where(inside[None, :], v * m[None, :], 0.0)
            out = out_ptr + b * (K * C * T) + (i * C + offs_c[:, None]) * T + offs_t[None, :]
            tl.store(out, v, mask=cin[:, None] & (offs_t < T)[None, :])


def stack_taps(x: torch.Tensor, mask: torch.Tensor, kernel: int, pad: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` [B, C, T] float32 (any strides), ``mask`` [B, 1, T] -> the ``kernel`` shifted views of
    ``v`` (``x * mask``, or ``relu(x + bias) * mask`` with ``bias`` [C]) zero-padded by ``pad`` on the
    left, stacked on the channel axis: [B, kernel * C, T] contiguous."""
    b, c, t = x.shape
    out = torch.empty(b, kernel * c, t, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(t, BLOCK_T), triton.cdiv(c, BLOCK_C), b)
    _stack_taps[grid](x, mask.contiguous(), x if bias is None else bias, out, c, t, *x.stride(),
                      K=kernel, PAD=pad, RELU_BIAS=bias is not None, BLOCK_C=BLOCK_C, BLOCK_T=BLOCK_T,
                      num_warps=4)  # fmt: skip
    return out


def _tap_major(conv: nn.Module) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A ``GemmConv1d``'s or ``nn.Conv1d``'s weight as ``[out, kernel * in]`` (tap-major, as ``GemmConv1d``
    lays it out), its bias as ``[out, 1]`` and its kernel size."""
    if isinstance(conv, GemmConv1d):
        if conv.depthwise or conv.dilation != 1 or conv.padding:
            raise ValueError(f"fused feed-forward: plain unpadded convolutions only, got {conv}")
        return conv.weight, conv.bias, conv.kernel
    if isinstance(conv, nn.Conv1d) and conv.groups == 1 and conv.dilation == (1,) and conv.padding == (0,):
        w = conv.weight.detach()
        return w.permute(0, 2, 1).reshape(w.shape[0], -1).contiguous(), conv.bias.detach().view(-1, 1), w.shape[2]
    raise ValueError(f"fused feed-forward: plain unpadded convolutions only, got {conv}")


class FusedFeedForward(nn.Module):
    """``FeedForward`` (same weights) with its taps stacked by ``stack_taps``."""

    def __init__(self, ffn: FeedForward) -> None:
        super().__init__()
        w1, b1, self.kernel = _tap_major(ffn.conv_1)
        w2, b2, kernel_2 = _tap_major(ffn.conv_2)
        if kernel_2 != self.kernel or ffn.pad[0] + ffn.pad[1] != self.kernel - 1:
            raise ValueError("fused feed-forward: both convolutions 'same'-padded with one kernel size")
        self.pad = ffn.pad[0]
        self.register_buffer("w1", w1)
        self.register_buffer("b1", b1.reshape(-1).contiguous())
        self.register_buffer("w2", w2)
        self.register_buffer("b2", b2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y = torch.matmul(self.w1, stack_taps(x, mask, self.kernel, self.pad))
        z = torch.matmul(self.w2, stack_taps(y, mask, self.kernel, self.pad, self.b1))
        return (z + self.b2) * mask


def use_fused_ffn(module: nn.Module) -> int:
    """Swap every ``FeedForward`` inside ``module`` for ``FusedFeedForward``; returns how many."""
    swapped = 0
    for name, child in list(module.named_children()):
        if isinstance(child, FeedForward):
            setattr(module, name, FusedFeedForward(child))
            swapped += 1
        else:
            swapped += use_fused_ffn(child)
    return swapped


__all__ = ["FusedFeedForward", "available", "stack_taps", "use_fused_ffn"]
