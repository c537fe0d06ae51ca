"""The decoder's convolutions outside its residual blocks as fused Triton kernels (GPU;
``tts.triton_kernels``).

Around the residual blocks (``fused_resblock``) a Piper decoder runs its input convolution
(``conv_pre``, 7 taps), one upsampling transposed convolution per stage and the output
convolution (``conv_post``, 32 channels to 1, then tanh). With cuDNN each is several passes
over tensors at the stage's sample rate: the leaky ReLU, the mask, NCHW -> NHWC and back
(cuDNN's fp16 kernels are channels-last), the bias add, the polyphase outputs interleaved by a
copy and the slice made contiguous by another. Here one kernel does each:

* ``_conv_rows``: ``y = conv(mask * act(x)) + bias`` for ``conv_pre`` (stride 1) and for an
  upsampling layer in its polyphase form (``decoder.PolyphaseUp``: a convolution to
  ``stride x C_out`` rows, ``taps = kernel / stride``); the rows are ordered channel-major
  (row = channel x stride + phase), so a program writes each output channel's samples
  ``m x stride + phase`` in one interleaved span: no copy, no slice;
* ``_conv_out``: ``tanh(conv_post(mask * leaky_relu(x)))`` to the audio row, on the tensor cores:
  rows of 16 samples times the taps laid out as a band matrix (H200: the decode step at 256 frames
  x 48 rows 8.92 -> 7.89 ms against one multiply-add per tap and channel,
  ``bench/results/tts_gpu_experiments-h200-2026-12-04-convout.json``).

Inputs are ``[B, C, T]`` contiguous in the model's dtype (fp16, bf16 or, in the tests, fp32);
products accumulate in fp32 on the tensor cores (``tl.dot``). The sums are PyTorch's in another
order, bias added before the one rounding to the model's dtype instead of after it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from tts_engine.torch_vits.kernels import available, triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _conv_rows(x_ptr, w_ptr, b_ptr, m_ptr, y_ptr, N, L_OUT,
                   C_IN: tl.constexpr, ROWS: tl.constexpr, S: tl.constexpr, TAPS: tl.constexpr,
                   LPAD: tl.constexpr, OFF: tl.constexpr, SLOPE: tl.constexpr,
                   HAS_ACT: tl.constexpr, HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_CI: tl.constexpr):  # fmt: skip
        """acc[row, m] = sum_tap W[tap, row] @ xa[:, m + tap - LPAD] (+ bias[row // S]),
        xa = mask * act(x), zero outside [0, N); y[b, row // S, m * S + row % S - OFF] = acc
        where that index is in [0, L_OUT)."""
        pid_m, pid_r, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        x_row = x_ptr + b * C_IN * N
        acc = tl.zeros((BLOCK_R, BLOCK_M), dtype=tl.float32)
        for tap in tl.static_range(TAPS):
            ts = m + (tap - LPAD)
            inside = (ts >= 0) & (ts < N)
            if HAS_MASK:
                mv = tl.load(m_ptr + b * N + ts, mask=inside, other=0.0).to(tl.float32)
            for c0 in tl.static_range(0, C_IN, BLOCK_CI):
                ci = c0 + tl.arange(0, BLOCK_CI)
                xv = tl.load(x_row + ci[:, None] * N + ts[None, :], mask=inside[None, :], other=0.0).to(tl.float32)
                if HAS_ACT:
                    xv = tl.where(xv >= 0, xv, xv * SLOPE)
                if HAS_MASK:
                    xv = xv * mv[None, :]
                w = tl.load(w_ptr + tap * ROWS * C_IN + rows[:, None] * C_IN + ci[None, :])
                acc += tl.dot(w, xv.to(w.dtype))
        channel = rows // S
        if HAS_BIAS:
            acc += tl.load(b_ptr + channel).to(tl.float32)[:, None]
        j = m[None, :] * S + (rows % S)[:, None] - OFF
        keep = (j >= 0) & (j < L_OUT)
        c_out = ROWS // S
        tl.store(y_ptr + b * c_out * L_OUT + channel[:, None] * L_OUT + j, acc.to(y_ptr.dtype.element_ty), mask=keep)

    @triton.jit
    def _conv_out(x_ptr, w_ptr, b_ptr, m_ptr, y_ptr, T,
                  C: tl.constexpr, K: tl.constexpr, SLOPE: tl.constexpr, HAS_MASK: tl.constexpr,
                  HAS_BIAS: tl.constexpr, GROUPS: tl.constexpr, WIN: tl.constexpr):  # fmt: skip
        """y[b, t] = tanh(sum_c sum_k w[c, k] xa[c, t + k - (K - 1) / 2] (+ bias)), xa = mask * leaky_relu(x).

        A program's ``GROUPS x 16`` samples as ``GROUPS`` rows of 16: per channel, each row's window of
        ``WIN`` (>= 15 + K) inputs is loaded and activated once, and multiplied on the tensor cores by
        the channel's taps laid out as a band ``[WIN, 16]`` (``band[i, j] = w[i - j]``), so an input is
        loaded and activated ``WIN / 16`` times instead of ``K`` and the products are not one
        multiply-add per tap and channel on the ALUs."""
        pid, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
        g = tl.arange(0, GROUPS)
        i = tl.arange(0, WIN)
        j = tl.arange(0, 16)
        ts = (pid * GROUPS * 16 + g * 16 - (K - 1) // 2)[:, None] + i[None, :]  # [GROUPS, WIN] inputs
        inside = (ts >= 0) & (ts < T)
        if HAS_MASK:
            mv = tl.load(m_ptr + b * T + ts, mask=inside, other=0.0).to(tl.float32)
        acc = tl.zeros((GROUPS, 16), dtype=tl.float32)
        for c in tl.static_range(C):
            xv = tl.load(x_ptr + (b * C + c) * T + ts, mask=inside, other=0.0).to(tl.float32)
            xv = tl.where(xv >= 0, xv, xv * SLOPE)
            if HAS_MASK:
                xv = xv * mv
            band = tl.load(w_ptr + c * WIN * 16 + i[:, None] * 16 + j[None, :])
            acc += tl.dot(xv.to(band.dtype), band)
        if HAS_BIAS:
            acc += tl.load(b_ptr).to(tl.float32)
        # tanh(a) = 1 - 2 / (exp(2a) + 1): exact limits (exp overflows to inf -> 1, underflows to 0 -> -1)
        y = 1.0 - 2.0 / (tl.exp(2.0 * acc) + 1.0)
        t = pid * GROUPS * 16 + g[:, None] * 16 + j[None, :]
        tl.store(y_ptr + b * T + t, y.to(y_ptr.dtype.element_ty), mask=t < T)


#: (BLOCK_R, BLOCK_M, num_warps) of ``_conv_rows``; BLOCK_R is capped by the layer's rows. H200: the
#: decode step within 5 % of this (batches of 16-64: 3 %) with 64x64x4, 128x128x8, 64x128x4 or 128x32x4
#: (``04af75d:bench/results/tts_gpu_experiments-h200-2026-12-03-fusedup.json``).
ROW_TILES = (128, 64, 8)
#: Rows of 16 samples per program of ``_conv_out`` (1024 samples; not tuned).
OUT_GROUPS = 64


def _channel_block(c_in: int) -> int | None:
    """The input channels ``tl.dot`` takes per step (16..64, dividing ``c_in``), or None."""
    for block in (64, 32, 16):
        if c_in % block == 0:
            return block
    return None


class FusedRows:
    """A stride-1 ``nn.Conv1d`` (``act``: with the decoder's leaky ReLU on its input) or a
    ``decoder.PolyphaseUp`` as one ``_conv_rows`` launch; holds its own copy of the weights
    (take it after the last dtype or device change)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, stride: int, lpad: int, offset: int,
                 length: Callable[[int], int], act_slope: float | None) -> None:  # fmt: skip
        rows, self.c_in, self.taps = weight.shape
        if rows % stride:
            raise ValueError(f"rows {rows} are not a multiple of the stride {stride}")
        self.block_ci = _channel_block(self.c_in)
        if self.block_ci is None or rows < 16:
            raise ValueError(f"fused convolution needs input channels a multiple of 16 and >= 16 rows; got {weight.shape}")
        self.rows, self.stride, self.lpad, self.offset = rows, stride, lpad, offset
        self.c_out = rows // stride
        self.weight = weight.detach().permute(2, 0, 1).contiguous()  # [taps, rows, c_in]
        self.bias = None if bias is None else bias.detach().contiguous()
        self.length = length  # input frames -> output samples
        self.act_slope = act_slope

    @staticmethod
    def takes_inputs(channels: int) -> bool:
        """Input channels the kernel takes (a multiple of 16)."""
        return _channel_block(channels) is not None

    @staticmethod
    def supports(conv: nn.Module) -> bool:
        """A stride-1 ``nn.Conv1d`` the kernel computes (upsampling layers: ``decoder.PolyphaseUp.supports``
        and ``takes_inputs``)."""
        return (type(conv) is nn.Conv1d and conv.stride[0] == 1 and conv.dilation[0] == 1 and conv.groups == 1
                and isinstance(conv.padding[0], int) and _channel_block(conv.in_channels) is not None
                and conv.out_channels >= 16)  # fmt: skip

    @classmethod
    def from_conv(cls, conv: nn.Conv1d, act_slope: float | None = None) -> FusedRows:
        pad, k = conv.padding[0], conv.kernel_size[0]
        return cls(conv.weight, conv.bias, 1, pad, 0, lambda n: n + 2 * pad - k + 1, act_slope)

    @classmethod
    def from_polyphase(cls, poly: object, act_slope: float | None) -> FusedRows:
        """From a ``decoder.PolyphaseUp`` (an upsampling layer's polyphase weights)."""
        s, c_out = poly.stride, poly.c_out
        # PolyphaseUp's rows are phase-major (phase x C_out + channel); here channel-major (channel x s + phase)
        weight = poly.weight.view(s, c_out, -1, poly.taps).transpose(0, 1).reshape(s * c_out, -1, poly.taps)
        bias = poly.bias[:c_out] if poly.bias is not None else None
        k, p = poly.kernel, poly.padding
        return cls(weight, bias, s, poly.taps - 1, p, lambda n: (n - 1) * s - 2 * p + k, act_slope)

    def __call__(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x.contiguous()
        batch, _, n = x.shape
        length = self.length(n)
        y = torch.empty(batch, self.c_out, length, dtype=x.dtype, device=x.device)
        block_r, block_m, warps = ROW_TILES
        block_r = min(block_r, self.rows)
        spans = n + self.taps - 1  # positions m of the full (unsliced) output
        grid = (triton.cdiv(spans, block_m), triton.cdiv(self.rows, block_r), batch)
        w = self.weight
        _conv_rows[grid](x, w, self.bias if self.bias is not None else w, mask.contiguous() if mask is not None else x,
                         y, n, length, C_IN=self.c_in, ROWS=self.rows, S=self.stride, TAPS=self.taps, LPAD=self.lpad,
                         OFF=self.offset, SLOPE=self.act_slope or 0.0, HAS_ACT=self.act_slope is not None,
                         HAS_MASK=mask is not None, HAS_BIAS=self.bias is not None, BLOCK_R=block_r,
                         BLOCK_M=block_m, BLOCK_CI=self.block_ci, num_warps=warps)  # fmt: skip
        return y


class FusedOut:
    """``tanh(conv_post(mask * leaky_relu(x, slope)))[:, 0]`` as one ``_conv_out`` launch: ``[B, C, T] -> [B, T]``."""

    def __init__(self, conv: nn.Conv1d, slope: float) -> None:
        if not self.supports(conv):
            raise ValueError(f"no fused output convolution for {conv}")
        self.channels, self.kernel = conv.in_channels, conv.kernel_size[0]
        self.window = 1 << (14 + self.kernel).bit_length()  # a power of two >= 15 + kernel
        taps = conv.weight.detach()[0]  # [C, K]
        band = taps.new_zeros(self.channels, self.window, 16)  # band[c, j + k, j] = w[c, k]
        for j in range(16):
            band[:, j : j + self.kernel, j] = taps
        self.weight = band.contiguous()
        self.bias = None if conv.bias is None else conv.bias.detach().contiguous()
        self.slope = slope

    @staticmethod
    def supports(conv: nn.Module) -> bool:
        return (isinstance(conv, nn.Conv1d) and conv.out_channels == 1 and conv.stride[0] == 1 and conv.groups == 1
                and conv.dilation[0] == 1 and conv.kernel_size[0] % 2 == 1
                and conv.padding[0] == (conv.kernel_size[0] - 1) // 2
                and 16 <= conv.in_channels == 2 ** int(math.log2(conv.in_channels)))  # fmt: skip

    def __call__(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x.contiguous()
        batch, _, length = x.shape
        y = torch.empty(batch, length, dtype=x.dtype, device=x.device)
        grid = (triton.cdiv(length, OUT_GROUPS * 16), batch)
        _conv_out[grid](x, self.weight, self.bias if self.bias is not None else self.weight,
                        mask.contiguous() if mask is not None else x, y, length, C=self.channels, K=self.kernel,
                        SLOPE=self.slope, HAS_MASK=mask is not None, HAS_BIAS=self.bias is not None,
                        GROUPS=OUT_GROUPS, WIN=self.window, num_warps=4)  # fmt: skip
        return y


__all__ = ["FusedOut", "FusedRows", "available"]
