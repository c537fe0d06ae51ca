"""HiFi-GAN residual blocks as fused Triton convolutions (GPU; ``tts.fused_blocks``).

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

Products (``PRODUCTS``, ``tts.fused_block_products``): "model", the model's dtype on the tensor
cores; or "e4m3", FP8 (Hopper and Ada tensor cores): each tap's weights ``[C_out, C_in]`` in
float8 e4m3 with one scale per output channel (``quantize_e4m3``), and each loaded input tile,
after the activation and the mask, scaled by its own largest magnitude into e4m3's range (448)
and multiplied in e4m3, the product rescaled into the fp32 accumulator. Needs ``C`` >= 32 (FP8's
products take 32 input channels at a time). Its error is that of 3 mantissa bits per operand:
reported against fp32 (SNR) by the GPU tests, not bit for bit anything.
"""

from __future__ import annotations

import os

import torch

try:  # triton ships with CUDA builds of PyTorch; CPU-only installs lack it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None


def available() -> bool:
    """Triton importable and a CUDA device present (or Triton's interpreter asked for)."""
    return triton is not None and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")


#: ``tts.fused_block_products``: the model's dtype, or FP8 e4m3 (see the module docstring).
PRODUCTS = ("model", "e4m3")
#: e4m3's largest finite magnitude.
E4M3_MAX = 448.0


def supports(channels: int, products: str = "model") -> bool:
    return channels >= (32 if products == "e4m3" else 16) and channels & (channels - 1) == 0


def quantize_e4m3(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tap-major weights ``[K, C_out, C_in]`` as float8 e4m3 and one float32 scale per output channel:
    ``weight ~= q * scale[None, :, None]``, each channel's largest magnitude at e4m3's largest."""
    w = weight.float()
    scale = w.abs().amax(dim=(0, 2)).clamp_min(1e-12) / E4M3_MAX
    return (w / scale[None, :, None]).to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


if triton is not None:

    @triton.jit
    def _tap(acc, k, x_row, w_ptr, m_ptr, b, t, ci, co, T, C: tl.constexpr, K: tl.constexpr, DIL: tl.constexpr,
             SLOPE: tl.constexpr, HAS_MASK: tl.constexpr, FP8: tl.constexpr, TIME_ROWS: tl.constexpr,
             CL: tl.constexpr):  # fmt: skip
        """``acc`` plus tap ``k``'s product (``_conv_step``'s loop body)."""
        ts = t + (k * DIL - (K - 1) * DIL // 2)
        inside = (ts >= 0) & (ts < T)
        if CL:
            xv = tl.load(x_row + ts[:, None] * C + ci[None, :], mask=inside[:, None], other=0.0).to(tl.float32)
        elif TIME_ROWS:
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
        if FP8:  # the tile into e4m3 by its own peak; the product back by the same factor
            x_scale = tl.maximum(tl.max(tl.abs(xv)), 1e-12) / 448.0  # E4M3_MAX
            xq = (xv / x_scale).to(tl.float8e4nv)
            if TIME_ROWS:
                acc += tl.dot(xq, w) * x_scale
            else:
                acc += tl.dot(w, xq) * x_scale
        elif TIME_ROWS:
            acc += tl.dot(xv.to(w.dtype), w)
        else:
            acc += tl.dot(w, xv.to(w.dtype))
        return acc

    @triton.jit
    def _conv_step(x_ptr, w_ptr, ws_ptr, b_ptr, m_ptr, r_ptr, y_ptr, T, scale,
                   C: tl.constexpr, K: tl.constexpr, DIL: tl.constexpr, SLOPE: tl.constexpr,
                   BLOCK_CO: tl.constexpr, BLOCK_T: tl.constexpr, HAS_MASK: tl.constexpr, RESIDUAL: tl.constexpr,
                   ACCUM: tl.constexpr, FP8: tl.constexpr, TIME_ROWS: tl.constexpr, CL: tl.constexpr,
                   TAP_LOOP: tl.constexpr):  # fmt: skip
        """y[b, co, t] (+)= scale * (sum_k W[k] @ act(x)[b, :, t + k*DIL - pad] + bias + r[b, co, t]).
        FP8: W in e4m3 with per-output-channel scales ``ws``; each tap's input tile scaled into e4m3.
        TIME_ROWS: the tile's product as ``act(x)^T @ W[k]^T`` ([time, channels]: the time steps are
        the product's rows, so a stage of 32 channels still fills Hopper's 64-row products).
        CL (with TIME_ROWS): x, r and y time-major ``[B, T, C]``: a tap's tile is BLOCK_T whole rows of C
        contiguous channels, aligned whatever the tap's shift (channel-major, a shift of DIL samples
        misaligns every row of the tile)."""
        pid_t, pid_c, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        ci = tl.arange(0, C)
        co = pid_c * BLOCK_CO + tl.arange(0, BLOCK_CO)
        x_row = x_ptr + b * C * T
        if TIME_ROWS:
            acc = tl.zeros((BLOCK_T, BLOCK_CO), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_CO, BLOCK_T), dtype=tl.float32)
        if TAP_LOOP:  # a loop: one tap's tile live at a time (fewer registers)
            for k in range(K):
                acc = _tap(acc, k, x_row, w_ptr, m_ptr, b, t, ci, co, T, C, K, DIL, SLOPE, HAS_MASK, FP8, TIME_ROWS, CL)
        else:  # unrolled: every tap's loads can be in flight at once (more registers)
            for k in tl.static_range(K):
                acc = _tap(acc, k, x_row, w_ptr, m_ptr, b, t, ci, co, T, C, K, DIL, SLOPE, HAS_MASK, FP8, TIME_ROWS, CL)
        bias = tl.load(b_ptr + co).to(tl.float32)
        if TIME_ROWS:
            if FP8:
                acc = acc * tl.load(ws_ptr + co)[None, :]
            acc += bias[None, :]
            if CL:
                out = t[:, None] * C + co[None, :]
            else:
                out = co[None, :] * T + t[:, None]
            keep = (t < T)[:, None]
        else:
            if FP8:
                acc = acc * tl.load(ws_ptr + co)[:, None]
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
#: The same for ``channels_last`` steps (not yet chosen on a GPU: the channel-major tiles).
CL_TILES = dict(TILES)
#: The taps as a loop instead of unrolled (``tts.fused_block_taps = "loop"``): one tap's tile in
#: registers at a time. Compiled for sm_90 (Triton 3.9) as the engine launches them (the time length a
#: multiple of 16), in the shipped tiles unrolled takes 148 / 212 / 148 registers a thread at 128 / 64 /
#: 32 channels (no spill; 255 with a spill stack where T's alignment is unknown), the loop 107 / 168 /
#: 95; which is faster is for ``bench.decoder_stages``. The default of a ``conv_step`` that is not told.
TAP_LOOP = False
#: (BLOCK_CO, BLOCK_T, num_warps) of the loop form in a ``FusedStage(taps="loop")``: tiles of 48-61
#: registers a thread at sm_90 (as launched). On an H100 slower than the unrolled steps except for
#: one sentence (configs/gpu.toml, ``fused_block_taps``).
LOOP_TILES = {128: (128, 32, 8), 64: (64, 64, 8), 32: (32, 64, 4), 16: (16, 128, 4)}
#: ``tts.fused_block_taps`` values.
TAPS = ("unrolled", "loop")


def conv_step(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dilation: int, mask: torch.Tensor | None,
              residual: torch.Tensor | None, out: torch.Tensor, scale: float = 1.0, accumulate: bool = False,
              tiles: tuple[int, int, int] | None = None, slope: float = 0.1,
              weight_scale: torch.Tensor | None = None, channels_last: bool = False,
              tap_loop: bool | None = None) -> torch.Tensor:  # fmt: skip
    """``out (+)= scale * (conv(mask * leaky_relu(x, slope)) + bias + residual)``; ``weight`` [K, C, C]
    (tap-major; float8 e4m3 with ``weight_scale`` [C] from ``quantize_e4m3``: FP8 products);
    ``tiles``: (BLOCK_CO, BLOCK_T, num_warps[, time_rows]), default ``TILES`` (``CL_TILES`` channels-last);
    ``channels_last``: x, residual and out are time-major ``[B, T, C]`` contiguous (the product then
    always has time as its rows); ``mask`` is ``[B, 1, T]`` either way; ``tap_loop``: the taps as a loop
    (None: ``TAP_LOOP``)."""
    if channels_last:
        batch, length, channels = x.shape
    else:
        batch, channels, length = x.shape
    fp8 = weight.dtype == torch.float8_e4m3fn
    if fp8 != (weight_scale is not None):
        raise ValueError("e4m3 weights need their weight_scale, and only they take one")
    default = (CL_TILES if channels_last else TILES).get(channels, (min(channels, 64), 128, 4))
    block_co, block_t, warps, *rest = tiles or default
    grid = (triton.cdiv(length, block_t), channels // block_co, batch)
    _conv_step[grid](x, weight, weight_scale if fp8 else bias, bias, mask if mask is not None else x,
                     residual if residual is not None else x, out, length, scale,
                     C=channels, K=weight.shape[0], DIL=dilation, SLOPE=slope, BLOCK_CO=block_co, BLOCK_T=block_t,
                     HAS_MASK=mask is not None, RESIDUAL=residual is not None, ACCUM=accumulate, FP8=fp8,
                     TIME_ROWS=channels_last or bool(rest and rest[0]), CL=channels_last,
                     TAP_LOOP=TAP_LOOP if tap_loop is None else tap_loop,
                     num_warps=warps)  # fmt: skip
    return out


def tap_major(conv: torch.nn.Conv1d) -> torch.Tensor:
    """A convolution's weight [C_out, C_in, K] as [K, C_out, C_in], contiguous."""
    return conv.weight.detach().permute(2, 0, 1).contiguous()


class FusedStage:
    """One decoder stage's blocks (``mean_j block_j(x)``) with fused kernels; weights taken from the modules:
    ``decoder.ResBlock2`` (``convs``) or ``decoder.ResBlock1`` (``convs1``, ``convs2``); ``slope``: their
    leaky ReLU's; ``products``: one of ``PRODUCTS``; ``channels_last``: the steps run time-major (the
    stage's input transposed to ``[B, T, C]`` once, its output back to ``[B, C, T]`` once); ``taps``: one
    of ``TAPS`` ("loop": the taps as a loop in ``LOOP_TILES``; "unrolled": ``TAP_LOOP``'s form in ``TILES``)."""

    def __init__(self, blocks: list[torch.nn.Module], slope: float, products: str = "model",
                 channels_last: bool = False, taps: str = "unrolled") -> None:  # fmt: skip
        self.slope = slope
        self.channels_last = channels_last
        if taps not in TAPS:
            raise ValueError(f"fused block taps must be one of {TAPS}, got {taps!r}")
        self.taps = taps
        if triton is None:
            raise RuntimeError("fused residual blocks need triton (it comes with PyTorch's CUDA builds)")
        if products not in PRODUCTS:
            raise ValueError(f"fused block products must be one of {PRODUCTS}, got {products!r}")

        def weights(conv: torch.nn.Conv1d) -> tuple[torch.Tensor, torch.Tensor | None]:
            w = tap_major(conv)
            return quantize_e4m3(w) if products == "e4m3" else (w, None)

        self.blocks = []
        for block in blocks:
            if hasattr(block, "convs"):  # ResBlock2
                steps = [(*weights(c), c.bias.detach(), c.dilation[0], None) for c in block.convs]
            elif hasattr(block, "convs1"):  # ResBlock1
                steps = [(*weights(c1), c1.bias.detach(), c1.dilation[0], (*weights(c2), c2.bias.detach()))
                         for c1, c2 in zip(block.convs1, block.convs2)]  # fmt: skip
            else:
                raise TypeError(f"no fused kernel for {type(block).__name__}")
            channels = steps[0][0].shape[1]
            if not supports(channels, products):
                raise ValueError(f"fused residual blocks with {products!r} products need a power-of-two channel count "
                                 f">= {32 if products == 'e4m3' else 16}, got {channels}")  # fmt: skip
            self.blocks.append(steps)

    def __call__(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        cl = self.channels_last
        x = x.transpose(1, 2).contiguous() if cl else x.contiguous()
        form = self._form(x)
        m = None if mask is None else mask.contiguous()
        out = torch.empty_like(x)
        scale = 1.0 / len(self.blocks)
        for j, steps in enumerate(self.blocks):
            h = x
            for i, (w, ws, b, d, pair) in enumerate(steps):
                last = i == len(steps) - 1
                src = h  # ResBlock2: h = conv(act(h)) + h
                if pair is not None:  # ResBlock1: h = conv2(act(conv1(act(h)))) + h
                    src = conv_step(h, w, b, d, m, None, torch.empty_like(x), slope=self.slope, weight_scale=ws,
                                    channels_last=cl, **form)  # fmt: skip
                    (w, ws, b), d = pair, 1
                dst = out if last else torch.empty_like(x)
                conv_step(src, w, b, d, m, h, dst, scale if last else 1.0, last and j > 0, slope=self.slope,
                          weight_scale=ws, channels_last=cl, **form)  # fmt: skip
                h = dst
        return out.transpose(1, 2).contiguous() if cl else out

    def _form(self, x: torch.Tensor) -> dict:
        """``conv_step``'s tap form and tiles for this stage's ``taps`` (``x`` in the steps' layout)."""
        if self.taps != "loop":
            return {}
        channels = x.shape[2] if self.channels_last else x.shape[1]
        return {"tap_loop": True, "tiles": LOOP_TILES.get(channels)}
