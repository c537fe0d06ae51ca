"""A decoder stage's residual blocks as two Triton launches (GPU; ``tts.fused_stages``).

``fused_resblock`` runs each step of a Piper "medium"/"low" stage (``mean_j block_j(x)``, each
``ResBlock2`` two steps ``h = conv_d(mask * leaky_relu(h)) + h``) as its own launch: six launches
for a stage of three blocks, fourteen passes over ``[B, C, T]`` tensors (each step reads its
input and writes its output; the second and third blocks' last steps also read the stage's output
to add onto it). At the last stage of a 64-row decode step such a tensor is ~290 MB, far beyond the
L2 cache, and those steps are most of a decode step's GPU time.

Here a stage is two launches of ``_stage_steps`` over the same grid of (time tile, channel block, row)
programs: the first reads the stage's input tile (each block's taps from the same loads in cache) and
writes every block's first step; the second (``SECOND``) reads those and writes the mean of every
block's second step once. Eight passes instead of fourteen, two launches instead of six.

Same sums as ``fused_resblock`` (fp32 accumulation on the tensor cores, a first step's output
rounded to the model's dtype as there), except that the mean over blocks is summed in fp32 and
rounded once (``fused_resblock`` rounds after adding each block). Only stages of 1-3 ``ResBlock2``
blocks with "model" products (``supports``); others keep ``fused_resblock``.
"""

from __future__ import annotations

import torch

from tts_engine.torch_vits.fused_resblock import available, supports as block_supports, tap_major, triton

#: (BLOCK_CO, BLOCK_T, num_warps) per channel count: tiles whose two kernels, compiled for sm_90 as the
#: engine launches them, need no spill stack (72-134 registers a thread; the second holds the sum over
#: blocks beside a block's product). On an H100 slower than the per-step kernels except for one
#: sentence (configs/gpu.toml, ``fused_stages``).
TILES = {128: (128, 32, 8), 64: (64, 64, 8), 32: (32, 64, 4), 16: (16, 128, 4)}

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _taps(acc, src, w_ptr, t, T, ci, co, m_row, C: tl.constexpr, K: tl.constexpr, DIL: tl.constexpr,
              SLOPE: tl.constexpr, HAS_MASK: tl.constexpr):  # fmt: skip
        """acc += sum_k W[k][co] @ (mask * leaky_relu(src))[:, t + k*DIL - pad], zero outside [0, T); the taps
        a loop, one tile in registers at a time (``fused_resblock.TAP_LOOP``)."""
        for k in range(K):
            ts = t + (k * DIL - (K - 1) * DIL // 2)
            inside = (ts >= 0) & (ts < T)
            xv = tl.load(src + ci[:, None] * T + ts[None, :], mask=inside[None, :], other=0.0).to(tl.float32)
            xv = tl.where(xv >= 0, xv, xv * SLOPE)
            if HAS_MASK:
                xv = xv * tl.load(m_row + ts, mask=inside, other=0.0).to(tl.float32)[None, :]
            w = tl.load(w_ptr + k * C * C + co[:, None] * C + ci[None, :])
            acc += tl.dot(w, xv.to(w.dtype))
        return acc

    @triton.jit
    def _step(src, w_ptr, b_ptr, m_row, t, T, ci, co, C: tl.constexpr, K: tl.constexpr, DIL: tl.constexpr,
              SLOPE: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_T: tl.constexpr):  # fmt: skip
        """One step at the tile (co, t), fp32: conv(mask * act(src)) + bias + src."""
        acc = tl.zeros((BLOCK_CO, BLOCK_T), dtype=tl.float32)
        acc = _taps(acc, src, w_ptr, t, T, ci, co, m_row, C, K, DIL, SLOPE, HAS_MASK)
        acc += tl.load(b_ptr + co).to(tl.float32)[:, None]
        acc += tl.load(src + co[:, None] * T + t[None, :], mask=(t < T)[None, :], other=0.0).to(tl.float32)
        return acc

    @triton.jit
    def _stage_steps(x_ptr, m_ptr, y_ptr, w_ptr, b_ptr, T, scale,
                     C: tl.constexpr, NB: tl.constexpr, SECOND: tl.constexpr, KMAX: tl.constexpr,
                     K0: tl.constexpr, D0: tl.constexpr, K1: tl.constexpr, D1: tl.constexpr,
                     K2: tl.constexpr, D2: tl.constexpr, SLOPE: tl.constexpr, HAS_MASK: tl.constexpr,
                     BLOCK_CO: tl.constexpr, BLOCK_T: tl.constexpr):  # fmt: skip
        """First steps (SECOND False): y[j] = step_j(x) for each block j, x [B, C, T], y [NB, B, C, T].
        Second steps: y = scale * sum_j step_j(x[j]), x [NB, B, C, T], y [B, C, T].
        W [NB, KMAX, C, C] (tap-major, this launch's step of each block), bias [NB, C]."""
        pid_t, pid_c, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        n_rows = tl.num_programs(2).to(tl.int64)
        t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        ci = tl.arange(0, C)
        co = pid_c * BLOCK_CO + tl.arange(0, BLOCK_CO)
        m_row = m_ptr + b * T
        plane = n_rows * C * T  # one block's [B, C, T]
        row = b * C * T
        out = co[:, None] * T + t[None, :]
        keep = (t < T)[None, :]
        WS: tl.constexpr = KMAX * C * C
        if SECOND:
            total = _step(x_ptr + row, w_ptr, b_ptr, m_row, t, T, ci, co, C, K0, D0, SLOPE, HAS_MASK, BLOCK_CO, BLOCK_T)
            if NB > 1:
                total += _step(x_ptr + plane + row, w_ptr + WS, b_ptr + C, m_row, t, T, ci, co, C, K1, D1, SLOPE,
                               HAS_MASK, BLOCK_CO, BLOCK_T)  # fmt: skip
            if NB > 2:
                total += _step(x_ptr + 2 * plane + row, w_ptr + 2 * WS, b_ptr + 2 * C, m_row, t, T, ci, co, C, K2, D2,
                               SLOPE, HAS_MASK, BLOCK_CO, BLOCK_T)  # fmt: skip
            tl.store(y_ptr + row + out, (total * scale).to(y_ptr.dtype.element_ty), mask=keep)
        else:
            h = _step(x_ptr + row, w_ptr, b_ptr, m_row, t, T, ci, co, C, K0, D0, SLOPE, HAS_MASK, BLOCK_CO, BLOCK_T)
            tl.store(y_ptr + row + out, h.to(y_ptr.dtype.element_ty), mask=keep)
            if NB > 1:
                h = _step(x_ptr + row, w_ptr + WS, b_ptr + C, m_row, t, T, ci, co, C, K1, D1, SLOPE, HAS_MASK,
                          BLOCK_CO, BLOCK_T)  # fmt: skip
                tl.store(y_ptr + plane + row + out, h.to(y_ptr.dtype.element_ty), mask=keep)
            if NB > 2:
                h = _step(x_ptr + row, w_ptr + 2 * WS, b_ptr + 2 * C, m_row, t, T, ci, co, C, K2, D2, SLOPE, HAS_MASK,
                          BLOCK_CO, BLOCK_T)  # fmt: skip
                tl.store(y_ptr + 2 * plane + row + out, h.to(y_ptr.dtype.element_ty), mask=keep)


class FusedStageSteps:
    """One decoder stage's ``ResBlock2`` blocks (1-3 of them, two steps each; ``supports``) as two
    ``_stage_steps`` launches; holds its own copy of the weights (take it after the last dtype or
    device change). ``slope``: their leaky ReLU's; a call's ``tiles``: (BLOCK_CO, BLOCK_T, num_warps),
    default ``TILES``."""

    def __init__(self, blocks: list[torch.nn.Module], slope: float) -> None:
        if triton is None:
            raise RuntimeError("fused stages need triton (it comes with PyTorch's CUDA builds)")
        if not self.supports(blocks):
            raise ValueError("fused stages take 1-3 ResBlock2 blocks of two steps and a power-of-two channel count >= 16")
        self.slope = slope
        self.channels = blocks[0].convs[0].in_channels
        self.kernels = [b.convs[0].kernel_size[0] for b in blocks]
        self.dilations = [(b.convs[0].dilation[0], b.convs[1].dilation[0]) for b in blocks]
        self.kmax = max(self.kernels)
        self.weights, self.biases = [], []
        for step in (0, 1):  # [NB, KMAX, C, C] and [NB, C] per step
            w = blocks[0].convs[0].weight.new_zeros(len(blocks), self.kmax, self.channels, self.channels)
            for i, block in enumerate(blocks):
                w[i, : self.kernels[i]] = tap_major(block.convs[step])
            self.weights.append(w.contiguous())
            self.biases.append(torch.stack([b.convs[step].bias.detach() for b in blocks]).contiguous())

    @staticmethod
    def supports(blocks: list[torch.nn.Module]) -> bool:
        if not 1 <= len(blocks) <= 3 or not all(hasattr(b, "convs") and len(b.convs) == 2 for b in blocks):
            return False
        c = blocks[0].convs[0].in_channels
        return block_supports(c) and all(conv.in_channels == c == conv.out_channels and
                                         conv.kernel_size[0] == b.convs[0].kernel_size[0]
                                         for b in blocks for conv in b.convs)  # fmt: skip

    def __call__(self, x: torch.Tensor, mask: torch.Tensor | None, tiles: tuple[int, int, int] | None = None) -> torch.Tensor:
        x = x.contiguous()
        batch, channels, length = x.shape
        block_co, block_t, warps = (tiles or TILES.get(channels, (min(channels, 64), 128, 4)))[:3]
        n = len(self.kernels)
        grid = (triton.cdiv(length, block_t), channels // block_co, batch)
        m = mask.contiguous() if mask is not None else x
        k = self.kernels + [1] * (3 - n)
        h = torch.empty(n, *x.shape, dtype=x.dtype, device=x.device)
        out = torch.empty_like(x)
        for step, src, dst in ((0, x, h), (1, h, out)):
            d = [dl[step] for dl in self.dilations] + [1] * (3 - n)
            _stage_steps[grid](src, m, dst, self.weights[step], self.biases[step], length, 1.0 / n,
                               C=channels, NB=n, SECOND=step == 1, KMAX=self.kmax, K0=k[0], D0=d[0], K1=k[1], D1=d[1],
                               K2=k[2], D2=d[2], SLOPE=self.slope, HAS_MASK=mask is not None, BLOCK_CO=block_co,
                               BLOCK_T=block_t, num_warps=warps)  # fmt: skip
        return out


__all__ = ["FusedStageSteps", "available"]
