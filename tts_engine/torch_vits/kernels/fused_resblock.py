"""HiFi-GAN residual blocks as fused Triton convolutions (GPU; ``tts.triton_kernels``).

A Piper decoder stage is ``x -> mean_j block_j(x)`` where each "medium" block
(``ResBlock2``) is two steps ``x = conv_d(mask * leaky_relu(x)) + x`` with small channel
counts (128, 64, 32) and dilations up to 12. With cuDNN each step is a pointwise pass
(activation, mask), a convolution, and an add; the mean is more passes. Here one kernel
does a whole step: it loads the input tile once per tap, applies the activation and
the mask on load, multiplies by the tap's ``[C_out, C_in]`` weights on the tensor cores,
adds bias and residual, and writes the result scaled into (or added onto) the stage's
output, so the mean costs nothing extra. ``ResBlock1`` ("high" voices) uses the same kernel
for its plain convolutions.

Inputs are ``[B, C, T]`` contiguous (fp16 or bf16 as the model); accumulation is fp32.
``C`` must be a power of two >= 16 (``supports``); a stage with other channel counts keeps
PyTorch's convolutions (``Generator.use_fused_blocks``).
"""

from __future__ import annotations

import torch

from tts_engine.torch_vits.kernels import available, triton  # noqa: F401 - available: this kernel's, as its siblings'


def supports(channels: int) -> bool:
    """The kernel takes stages of ``channels`` channels: a power of two >= 16."""
    return channels >= 16 and channels & (channels - 1) == 0


if triton is not None:
    import triton.language as tl

    @triton.jit
    def _tap(acc, k, x_row, w_ptr, m_ptr, b, t, ci, co, T, C: tl.constexpr, K: tl.constexpr, DIL: tl.constexpr,
             SLOPE: tl.constexpr, HAS_MASK: tl.constexpr, TIME_ROWS: tl.constexpr):  # fmt: skip
        """``acc`` plus tap ``k``'s product (``_conv_step``'s loop body)."""
        ts = t + (k * DIL - (K - 1) * DIL // 2)
        inside = (ts >= 0) & (ts < T)
        if TIME_ROWS:
            xv = tl.load(x_row + ci[None, :] * T + ts[:, None], mask=inside[:, None], other=0.0).to(tl.float32)
        else:
            xv = tl.load(x_row + ci[:, None] * T + ts[None, :], mask=inside[None, :], other=0.0).to(tl.float32)
        xv = tl.where(xv >= 0, xv, xv * SLOPE)
        if HAS_MASK:
            mv = tl.load(m_ptr + b * T + ts, mask=inside, other=0.0).to(tl.float32)
            if TIME_ROWS:
                xv = xv * mv[:, None]
            else:
                xv = xv * mv[None, :]
        if TIME_ROWS:
            w = tl.load(w_ptr + k * C * C + co[None, :] * C + ci[:, None])  # W[k]^T: [C_in, BLOCK_CO]
        else:
            w = tl.load(w_ptr + k * C * C + co[:, None] * C + ci[None, :])  # W[k]: [BLOCK_CO, C_in]
        if TIME_ROWS:
            acc += tl.dot(xv.to(w.dtype), w)
        else:
            acc += tl.dot(w, xv.to(w.dtype))
        return acc

    @triton.jit
    def _conv_step(x_ptr, w_ptr, b_ptr, m_ptr, r_ptr, y_ptr, T, scale,
                   C: tl.constexpr, K: tl.constexpr, DIL: tl.constexpr, SLOPE: tl.constexpr,
                   BLOCK_CO: tl.constexpr, BLOCK_T: tl.constexpr, HAS_MASK: tl.constexpr, RESIDUAL: tl.constexpr,
                   ACCUM: tl.constexpr, TIME_ROWS: tl.constexpr):  # fmt: skip
        """y[b, co, t] (+)= scale * (sum_k W[k] @ act(x)[b, :, t + k*DIL - pad] + bias + r[b, co, t]).
        The taps unrolled: every tap's loads can be in flight at once (148 / 212 / 148 registers a thread
        at 128 / 64 / 32 channels compiled for sm_90 as the engine launches them, no spill; a loop over the
        taps in smaller tiles was slower on an H100, 2026-12-06: docs/benchmarks.md, the decoder's step forms).
        TIME_ROWS: the tile's product as ``act(x)^T @ W[k]^T`` ([time, channels]: the time steps are
        the product's rows, so a stage of 32 channels still fills Hopper's 64-row products)."""
        pid_t, pid_c, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        ci = tl.arange(0, C)
        co = pid_c * BLOCK_CO + tl.arange(0, BLOCK_CO)
        x_row = x_ptr + b * C * T
        if TIME_ROWS:
            acc = tl.zeros((BLOCK_T, BLOCK_CO), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_CO, BLOCK_T), dtype=tl.float32)
        for k in tl.static_range(K):
            acc = _tap(acc, k, x_row, w_ptr, m_ptr, b, t, ci, co, T, C, K, DIL, SLOPE, HAS_MASK, TIME_ROWS)
        bias = tl.load(b_ptr + co).to(tl.float32)
        if TIME_ROWS:
            acc += bias[None, :]
            out = co[None, :] * T + t[:, None]
            keep = (t < T)[:, None]
        else:
            acc += bias[:, None]
            out = co[:, None] * T + t[None, :]
            keep = (t < T)[None, :]
        if RESIDUAL:
            acc += tl.load(r_ptr + b * C * T + out, mask=keep, other=0.0).to(tl.float32)
        acc = acc * scale
        if ACCUM:
            acc += tl.load(y_ptr + b * C * T + out, mask=keep, other=0.0).to(tl.float32)
        tl.store(y_ptr + b * C * T + out, acc.to(y_ptr.dtype.element_ty), mask=keep)


#: (BLOCK_CO, BLOCK_T, num_warps[, time_rows]) per channel count, chosen on the H200
#: (``bench/tts_gpu_experiments.py --tiles``); ``time_rows`` (default False): see ``_conv_step``.
TILES = {128: (128, 64, 8), 64: (64, 128, 4), 32: (32, 128, 4), 16: (16, 128, 4)}


def conv_step(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dilation: int, mask: torch.Tensor | None,
              residual: torch.Tensor | None, out: torch.Tensor, scale: float = 1.0, accumulate: bool = False,
              tiles: tuple[int, int, int] | None = None, slope: float = 0.1) -> torch.Tensor:  # fmt: skip
    """``out (+)= scale * (conv(mask * leaky_relu(x, slope)) + bias + residual)``; ``x``, ``residual`` and
    ``out`` ``[B, C, T]`` contiguous, ``weight`` [K, C, C] (tap-major), ``mask`` ``[B, 1, T]``;
    ``tiles``: (BLOCK_CO, BLOCK_T, num_warps[, time_rows]), default ``TILES``."""
    batch, channels, length = x.shape
    block_co, block_t, warps, *rest = tiles or TILES.get(channels, (min(channels, 64), 128, 4))
    grid = (triton.cdiv(length, block_t), channels // block_co, batch)
    _conv_step[grid](x, weight, bias, mask if mask is not None else x, residual if residual is not None else x, out,
                     length, scale, C=channels, K=weight.shape[0], DIL=dilation, SLOPE=slope, BLOCK_CO=block_co,
                     BLOCK_T=block_t, HAS_MASK=mask is not None, RESIDUAL=residual is not None, ACCUM=accumulate,
                     TIME_ROWS=bool(rest and rest[0]), num_warps=warps)  # fmt: skip
    return out


def tap_major(conv: torch.nn.Conv1d) -> torch.Tensor:
    """A convolution's weight [C_out, C_in, K] as [K, C_out, C_in], contiguous."""
    return conv.weight.detach().permute(2, 0, 1).contiguous()


class FusedStage:
    """One decoder stage's blocks (``mean_j block_j(x)``) with fused kernels; weights taken from the modules:
    ``decoder.ResBlock2`` (``convs``) or ``decoder.ResBlock1`` (``convs1``, ``convs2``); ``slope``: their
    leaky ReLU's."""

    def __init__(self, blocks: list[torch.nn.Module], slope: float) -> None:
        self.slope = slope
        if triton is None:
            raise RuntimeError("fused residual blocks need triton (it comes with PyTorch's CUDA builds)")
        self.blocks = []
        for block in blocks:
            if hasattr(block, "convs"):  # ResBlock2
                steps = [(tap_major(c), c.bias.detach(), c.dilation[0], None) for c in block.convs]
            elif hasattr(block, "convs1"):  # ResBlock1
                steps = [(tap_major(c1), c1.bias.detach(), c1.dilation[0], (tap_major(c2), c2.bias.detach()))
                         for c1, c2 in zip(block.convs1, block.convs2)]  # fmt: skip
            else:
                raise TypeError(f"no fused kernel for {type(block).__name__}")
            channels = steps[0][0].shape[1]
            if not supports(channels):
                raise ValueError(f"fused residual blocks need a power-of-two channel count >= 16, got {channels}")
            self.blocks.append(steps)

    def __call__(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x.contiguous()
        m = None if mask is None else mask.contiguous()
        out = torch.empty_like(x)
        scale = 1.0 / len(self.blocks)
        for j, steps in enumerate(self.blocks):
            h = x
            for i, (w, b, d, pair) in enumerate(steps):
                last = i == len(steps) - 1
                src = h  # ResBlock2: h = conv(act(h)) + h
                if pair is not None:  # ResBlock1: h = conv2(act(conv1(act(h)))) + h
                    src = conv_step(h, w, b, d, m, None, torch.empty_like(x), slope=self.slope)
                    (w, b), d = pair, 1
                dst = out if last else torch.empty_like(x)
                conv_step(src, w, b, d, m, h, dst, scale if last else 1.0, last and j > 0, slope=self.slope)
                h = dst
        return out
