"""The text encoder's feed-forward layers with their elementwise work fused into the stacking of
convolution taps (GPU; ``tts.triton_kernels``).

Each of the encoder's six feed-forward layers is ``conv_2(pad(relu(conv_1(pad(x * mask))) * mask)) * mask``
with 3-tap convolutions, in fp32. As cuBLAS products (``gemm_conv.GemmConv1d``, the engine's
encoder convolutions) each convolution first stacks its shifted inputs (``[B, 3 C, T]``); in PyTorch the mask,
padding, stacking, bias and ReLU around the two products are eight passes over tensors of up to
``[B, 3 x 768, T]``, about a third of a layer's time on the H200 at 64 sentences of the 256-id bucket
(``c7cf715:bench/results/tts_load-h200-2026-12-04-encoder.md``). Here one Triton kernel per convolution writes
the stacked taps straight from its input:

* before ``conv_1``: ``x * mask`` (``x`` in any layout: the encoder's LayerNorm hands it transposed);
* before ``conv_2``: ``relu(y + bias_1) * mask`` of ``conv_1``'s product ``y``;

taps outside the sequence are 0 (the zero padding). The products are the same ``torch.matmul`` calls
on the same contiguous stacks as ``GemmConv1d``'s, and the elementwise operations are PyTorch's in
PyTorch's order, so the layer's output is the same, bit for bit, as with ``GemmConv1d`` (tested:
``tests/test_fused_ffn.py`` in Triton's interpreter, ``tests/test_gpu_tts.py`` on a GPU).

With ``products`` other than "cublas" (``tts.text_encoder_products``) each convolution is instead one
Triton kernel reading its shifted inputs in place (no stacked copy), the bias, ReLU and mask in its
epilogue, that skips every block of 64 time steps past its sentence's end: cuBLAS multiplies the
padding of the phoneme bucket too (about half the ids of a batch at 50 clients); batches under
``MIN_ROWS`` sentences keep cuBLAS's products (faster there). Its ``tl.dot`` runs
in ``products`` precision: "ieee" (fp32 multiply-adds on the CUDA cores), "tf32x3" (each product as
three TF32 tensor-core products of the operands' high and low parts: close to fp32), "tf32" (one
TF32 product: a 10-bit mantissa) or "fp16x3": each operand split into an fp16 high part and the fp16
rest, three fp16 tensor-core products (low x high, high x low, high x high, fp32 sums). fp16 has
TF32's 10-bit mantissa at twice its rate on Hopper, so "fp16x3" keeps about 21 bits like "tf32x3" in
half its tensor-core time, within fp16's range: the weights are scaled by a power of two (exact)
that puts their largest at 1024, the inputs are not scaled (the encoder's feed-forward inputs, a
LayerNorm's output and a ReLU of it, stay far from fp16's 65 504); a low part under 2^-14 (a value
under 1/8 of 1, or of the scaled weight) keeps fewer bits, an absolute error under 3e-8 per value.
Not bit for bit cuBLAS's sums: the durations (ceil'd) can move where
a phoneme's length lies within rounding of a whole frame; ``bench.tts_gpu_experiments
--encoder-products`` counts the phonemes that move, and times the encoder.

``use_fused_ffn(module)`` swaps every ``FeedForward`` inside ``module`` for ``FusedFeedForward``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tts_engine.torch_vits.kernels import available, triton
from tts_engine.torch_vits.kernels.gemm_conv import GemmConv1d
from base.config import TEXT_ENCODER_PRODUCTS

#: Channels and time steps per program.
BLOCK_C = 32
BLOCK_T = 64
#: ``FusedFeedForward``'s products: "cublas" (stacked taps through ``torch.matmul``: bit for bit
#: ``GemmConv1d``) or the Triton convolution in one of ``tl.dot``'s precisions.
PRODUCTS = TEXT_ENCODER_PRODUCTS
#: The Triton convolution's (output channels, time steps, input channels per ``tl.dot``, num_warps,
#: num_stages) per program and precision: the fastest of eight shapes for the voice's encoder at 16 and
#: 64 sentences on the H200 (``bench/results/tts_gpu_experiments-h200-2026-12-04-products.json``;
#: "ieee" not swept).
CONV_TILES = {"ieee": (64, 64, 32, 4, 3), "tf32x3": (32, 64, 32, 4, 3), "tf32": (64, 64, 32, 4, 3),
              "fp16x3": (32, 64, 32, 4, 3)}  # fmt: skip
#: "fp16x3": the scaled weights' largest magnitude (a power of two; fp16's largest is 65 504).
FP16_WEIGHT_PEAK = 1024.0
#: Batches (the encoder graph's rows) below this keep the cuBLAS products: one sentence's encoder took
#: 0.87 ms with them, 1.21 ms with "tf32x3" (too few programs for the GPU); 16 sentences 2.89 vs 2.56 ms.
MIN_ROWS = 16


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


    @triton.jit
    def _conv(x_ptr, w_ptr, b_ptr, mask_ptr, y_ptr, T, s_b, s_c, s_t, w_scale,
              CIN: tl.constexpr, CIN_BLOCKS: tl.constexpr, COUT: tl.constexpr, K: tl.constexpr,
              PAD: tl.constexpr, RELU: tl.constexpr, PREC: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_T: tl.constexpr,
              BLOCK_K: tl.constexpr):  # fmt: skip
        """``y[b, o, t] = sum_{i, c} W[o, i * CIN + c] * v[b, c, t + i - PAD] + bias[o]`` with ``v = x``
        where ``mask`` is set, else 0 (and 0 outside ``[0, T)``); then ``relu(.)`` (``RELU``) or ``. * mask``.
        A block of time steps all past the sentence's end (``mask`` 0) is not computed: it stores 0.
        ``W`` [COUT, K * CIN] tap-major, ``y`` [B, COUT, T] contiguous, all float32. ``w_scale``: a power
        of two the weights are multiplied by before their fp16 split ("fp16x3"; divided out after the sums)."""
        pid_t = tl.program_id(0)
        pid_c = tl.program_id(1)
        b = tl.program_id(2)
        t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        co = pid_c * BLOCK_CO + tl.arange(0, BLOCK_CO)
        in_t = t < T
        cout = co < COUT
        m_t = tl.load(mask_ptr + b * T + t, mask=in_t, other=0.0)
        acc = tl.zeros((BLOCK_CO, BLOCK_T), dtype=tl.float32)
        if tl.max(m_t, axis=0) != 0:
            # one loop over (tap, input-channel block): CIN_BLOCKS = CIN rounded up to BLOCK_K
            for kk in range(0, K * CIN_BLOCKS, BLOCK_K):
                i = kk // CIN_BLOCKS
                ci = kk - i * CIN_BLOCKS + tl.arange(0, BLOCK_K)
                s = t + (i - PAD)
                keep = tl.load(mask_ptr + b * T + s, mask=(s >= 0) & (s < T), other=0.0) != 0
                cin = ci < CIN
                v = tl.load(x_ptr + b * s_b + ci[:, None] * s_c + s[None, :] * s_t,
                            mask=cin[:, None] & keep[None, :], other=0.0)  # fmt: skip
                w = tl.load(w_ptr + co[:, None] * (K * CIN) + (i * CIN + ci)[None, :],
                            mask=cout[:, None] & cin[None, :], other=0.0)  # fmt: skip
                if PREC == "fp16x3":
                    w = w * w_scale
                    w_hi = w.to(tl.float16)
                    w_lo = (w - w_hi.to(tl.float32)).to(tl.float16)
                    v_hi = v.to(tl.float16)
                    v_lo = (v - v_hi.to(tl.float32)).to(tl.float16)
                    acc = tl.dot(w_lo, v_hi, acc)
                    acc = tl.dot(w_hi, v_lo, acc)
                    acc = tl.dot(w_hi, v_hi, acc)
                else:
                    acc = tl.dot(w, v, acc, input_precision=PREC)
            if PREC == "fp16x3":
                acc = acc / w_scale
            acc += tl.load(b_ptr + co, mask=cout, other=0.0)[:, None]
            if RELU:
                acc = tl.maximum(acc, 0.0)
            else:
                acc = acc * m_t[None, :]
        tl.store(y_ptr + b * (COUT * T) + co[:, None] * T + t[None, :], acc, mask=cout[:, None] & in_t[None, :])


def conv(x: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, kernel: int, pad: int,
         relu: bool, precision: str, weight_scale: float = 1.0) -> torch.Tensor:
    """The Triton convolution (``_conv``): ``x`` [B, C, T] float32 (any strides), ``mask`` [B, 1, T],
    ``weight`` [O, kernel * C] tap-major, ``bias`` [O] -> [B, O, T] contiguous float32:
    ``relu(conv(x * mask) + bias)`` or (``relu`` False) ``(conv(x * mask) + bias) * mask``.
    ``weight_scale``: "fp16x3"'s power of two for the weights (``fp16_weight_scale``)."""
    if precision not in PRODUCTS[1:]:
        raise ValueError(f"precision must be one of {PRODUCTS[1:]}, got {precision!r}")
    b, c, t = x.shape
    o = weight.shape[0]
    block_co, block_t, block_k, warps, stages = CONV_TILES[precision]
    y = torch.empty(b, o, t, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(t, block_t), triton.cdiv(o, block_co), b)
    _conv[grid](x, weight, bias, mask.contiguous(), y, t, *x.stride(), float(weight_scale), CIN=c,
                CIN_BLOCKS=triton.cdiv(c, block_k) * block_k, COUT=o, K=kernel, PAD=pad, RELU=relu, PREC=precision,
                BLOCK_CO=block_co, BLOCK_T=block_t, BLOCK_K=block_k, num_warps=warps, num_stages=stages)  # fmt: skip
    return y


def fp16_weight_scale(weight: torch.Tensor) -> float:
    """The power of two that puts ``weight``'s largest magnitude at ``FP16_WEIGHT_PEAK`` or just under
    (1.0 for an all-zero weight): multiplying by it is exact, and keeps the fp16 split's low parts normal."""
    peak = float(weight.detach().abs().max())
    return 1.0 if peak == 0 else 2.0 ** math.floor(math.log2(FP16_WEIGHT_PEAK / peak))


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


def tap_major(conv: nn.Module) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A ``GemmConv1d``'s or ``nn.Conv1d``'s weight as ``[out, kernel * in]`` (tap-major, as ``GemmConv1d``
    lays it out), its bias as ``[out, 1]`` (None without one) and its kernel size."""
    if isinstance(conv, GemmConv1d):
        if conv.depthwise or conv.dilation != 1 or conv.padding:
            raise ValueError(f"fused feed-forward: plain unpadded convolutions only, got {conv}")
        return conv.weight, conv.bias, conv.kernel
    if isinstance(conv, nn.Conv1d) and conv.groups == 1 and conv.dilation == (1,) and conv.padding == (0,):
        w = conv.weight.detach()
        bias = None if conv.bias is None else conv.bias.detach().view(-1, 1)
        return w.permute(0, 2, 1).reshape(w.shape[0], -1).contiguous(), bias, w.shape[2]
    raise ValueError(f"fused feed-forward: plain unpadded convolutions only, got {conv}")


class FusedFeedForward(nn.Module):
    """``FeedForward`` (same weights) with its taps stacked by ``stack_taps`` (``products`` "cublas", and
    batches under ``MIN_ROWS``), or each convolution as one ``conv`` kernel in that precision."""

    def __init__(self, ffn: nn.Module, products: str = "cublas") -> None:
        super().__init__()
        if products not in PRODUCTS:
            raise ValueError(f"products must be one of {PRODUCTS}, got {products!r}")
        self.products = products
        w1, b1, self.kernel = tap_major(ffn.conv_1)
        w2, b2, kernel_2 = tap_major(ffn.conv_2)
        if kernel_2 != self.kernel or ffn.pad[0] + ffn.pad[1] != self.kernel - 1:
            raise ValueError("fused feed-forward: both convolutions 'same'-padded with one kernel size")
        self.pad = ffn.pad[0]
        self.register_buffer("w1", w1)
        self.register_buffer("b1", b1.reshape(-1).contiguous())
        self.register_buffer("w2", w2)
        self.register_buffer("b2", b2)
        #: "fp16x3": each weight's power-of-two scale (a host number: no read-back inside a graph capture)
        self.scales = (fp16_weight_scale(w1), fp16_weight_scale(w2)) if products == "fp16x3" else (1.0, 1.0)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.products != "cublas" and x.shape[0] >= MIN_ROWS:
            h = conv(x, mask, self.w1, self.b1, self.kernel, self.pad, True, self.products, self.scales[0])
            return conv(h, mask, self.w2, self.b2.view(-1), self.kernel, self.pad, False, self.products, self.scales[1])
        y = torch.matmul(self.w1, stack_taps(x, mask, self.kernel, self.pad))
        z = torch.matmul(self.w2, stack_taps(y, mask, self.kernel, self.pad, self.b1))
        return (z + self.b2) * mask


def is_feed_forward(module: nn.Module) -> bool:
    """``module`` is a text encoder's feed-forward layer (``text_encoder.FeedForward``: two convolutions
    and their padding), known by its parts: the kernels do not import the model."""
    return all(hasattr(module, name) for name in ("conv_1", "conv_2", "pad")) and not isinstance(module, FusedFeedForward)


def use_fused_ffn(module: nn.Module, products: str = "cublas") -> int:
    """Swap every ``FeedForward`` inside ``module`` for ``FusedFeedForward`` with ``products``; returns how many."""
    swapped = 0
    for name, child in list(module.named_children()):
        if is_feed_forward(child):
            setattr(module, name, FusedFeedForward(child, products))
            swapped += 1
        else:
            swapped += use_fused_ffn(child, products)
    return swapped


__all__ = ["PRODUCTS", "FusedFeedForward", "available", "conv", "fp16_weight_scale", "stack_taps", "tap_major", "use_fused_ffn"]
