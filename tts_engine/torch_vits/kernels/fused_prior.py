"""The prior's expansion to frames written straight into the engine's slot latents, as one Triton
kernel (GPU; ``tts.triton_kernels``).

After the durations, the encoder step turns each sentence's per-phoneme prior (mean ``m_p``, log-std
``logs_p``, ``[B, C, T]``) into a per-frame sample over all ``max_frames`` (3072) frames
(``Vits.expand_prior``: frame ``f`` takes phoneme ``i`` with ``cum[i-1] <= f < cum[i]``; past the
sentence's end mean 0 and log-std 0) and copies it, transposed, into the slot buffer
``latents [slots, max_frames, C]``. In PyTorch that is two gathers, two masks, an exponential, three
products and sums and the transposing copy over ``[B, C, 3072]`` tensors: 1.2 ms of the 12.4 ms encoder
graph at 64 sentences on the H200 (``c7cf715:bench/results/tts_load-h200-2026-12-04-encoder.md``). Here one
pass reads the gathered rows and the noise and writes each slot's frames once.

The phoneme of each frame (``torch.searchsorted``) and the standard normal noise (``torch.randn``,
the same draw from the same generator as ``expand_prior``'s) stay PyTorch's; the kernel computes
``m * inside + noise * exp(logs * inside) * noise_scale`` in ``expand_prior``'s order with libdevice's
``exp`` (CUDA's ``expf``, as PyTorch's) and no fused multiply-add, so the latents are the same bit
for bit (tested on a GPU: ``tests/test_gpu_tts.py``; in Triton's interpreter: ``tests/test_fused_prior.py``).
"""

from __future__ import annotations

import os

import torch

from tts_engine.torch_vits.kernels import available, triton
from tts_engine.torch_vits.kernels.fused_prior_ref import frame_phonemes

#: Frames and channels per program.
BLOCK_F = 32
BLOCK_C = 64


if triton is not None:
    import triton.language as tl
    from triton.language.extra import libdevice

    @triton.jit
    def _expand(m_ptr, logs_ptr, idx_ptr, total_ptr, noise_ptr, scale_ptr, slot_ptr, out_ptr,
                C, T, F, s_out_slot, s_out_f,
                BLOCK_F: tl.constexpr, BLOCK_C: tl.constexpr, LIBDEVICE: tl.constexpr):  # fmt: skip
        """``out[slot[b], f, c] = m[b, c, idx[b, f]] * inside + noise[b, c, f] * exp(logs[b, c, idx] * inside) * scale[b]``
        with ``inside = f < total[b]``; ``m``/``logs`` ``[B, C, T]``, ``noise`` ``[B, C, F]`` contiguous."""
        pid_f = tl.program_id(0)
        pid_c = tl.program_id(1)
        b = tl.program_id(2)
        offs_f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
        offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        fin = offs_f < F
        cin = offs_c < C
        both = fin[:, None] & cin[None, :]
        idx = tl.load(idx_ptr + b * F + offs_f, mask=fin, other=0)
        inside = (offs_f < tl.load(total_ptr + b)).to(tl.float32)
        row = b * C * T + offs_c[None, :] * T + idx[:, None]  # [BLOCK_F, BLOCK_C]: frame-major, as written
        m = tl.load(m_ptr + row, mask=both, other=0.0) * inside[:, None]
        logs = tl.load(logs_ptr + row, mask=both, other=0.0) * inside[:, None]
        noise = tl.load(noise_ptr + b * C * F + offs_c[None, :] * F + offs_f[:, None], mask=both, other=0.0)
        if LIBDEVICE:  # CUDA's expf, as PyTorch's (tl.exp is a faster approximation)
            std = libdevice.exp(logs)
        else:  # Triton's interpreter has no libdevice
            std = tl.exp(logs)
        z = m + noise * std * tl.load(scale_ptr + b)
        slot = tl.load(slot_ptr + b)
        tl.store(out_ptr + slot * s_out_slot + offs_f[:, None] * s_out_f + offs_c[None, :], z, mask=both)


def expand_prior_into(latents: torch.Tensor, slots: torch.Tensor, m_p: torch.Tensor, logs_p: torch.Tensor,
                      w_ceil: torch.Tensor, noise_scale: torch.Tensor, noise: torch.Tensor | None = None) -> None:
    """``Vits.expand_prior(m_p, logs_p, w_ceil, F, noise_scale, noise)`` transposed into
    ``latents[slots]`` ([S, F, C] float32, channels contiguous). ``m_p``/``logs_p`` [B, C, T] float32,
    ``w_ceil`` [B, T], ``noise_scale`` [B], ``slots`` [B] int64; ``noise`` [B, C, F] (drawn here when None)."""
    b, c, t = m_p.shape
    f = latents.shape[1]
    if latents.stride(2) != 1:
        raise ValueError("latents must be channels-contiguous [slots, frames, channels]")
    idx, _, cum = frame_phonemes(w_ceil, f)  # as expand_prior
    if noise is None:
        noise = torch.randn(b, c, f, device=m_p.device, dtype=m_p.dtype)
    grid = (triton.cdiv(f, BLOCK_F), triton.cdiv(c, BLOCK_C), b)
    _expand[grid](m_p.contiguous(), logs_p.contiguous(), idx.contiguous(), cum[:, -1].contiguous(), noise.contiguous(),
                  noise_scale.contiguous(), slots.contiguous(), latents, c, t, f, latents.stride(0), latents.stride(1),
                  BLOCK_F=BLOCK_F, BLOCK_C=BLOCK_C, LIBDEVICE=os.environ.get("TRITON_INTERPRET") != "1",
                  num_warps=4, enable_fp_fusion=False)  # fmt: skip


__all__ = ["available", "expand_prior_into"]
