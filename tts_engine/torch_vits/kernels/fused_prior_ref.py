"""``fused_prior`` in plain PyTorch: the prior's expansion from phonemes to frames (mean plus noise times
the standard deviation of each frame's phoneme). The model's own (``model.Vits.expand_prior`` is this), and
what ``tests/test_kernels.py`` holds ``fused_prior.expand_prior_into`` to, bit for bit."""

from __future__ import annotations

import torch


def frame_phonemes(w_ceil: torch.Tensor, n_frames: int | torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The phoneme of each of ``n_frames`` frames, ``idx`` [B, n_frames] (``cum[i-1] <= f < cum[i]``,
    the last phoneme past the end), the frame numbers ``frame`` [B, n_frames] and ``cum``, the
    cumulative ``w_ceil`` [B, T], all in ``w_ceil``'s float type but ``idx`` (int64)."""
    cum = torch.cumsum(w_ceil, dim=1)
    frame = torch.arange(n_frames, device=w_ceil.device).to(cum.dtype)[None, :] + torch.zeros_like(cum[:, :1])
    if torch.onnx.is_in_onnx_export():  # no searchsorted in ONNX: count the edges passed
        idx = (cum[:, None, :] <= frame[:, :, None]).sum(dim=2)
    else:
        idx = torch.searchsorted(cum, frame, right=True)
    return idx.clamp_max(w_ceil.shape[1] - 1), frame, cum


def expand_prior(m_p: torch.Tensor, logs_p: torch.Tensor, w_ceil: torch.Tensor, n_frames: int | torch.Tensor,
                 noise_scale: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """Per-frame prior sample ``z_p`` [B, C, n_frames] (frames past the utterance: noise only).

    Frame ``f`` takes phoneme ``i`` with ``cum[i-1] <= f < cum[i]`` (``cum`` = cumulative
    ``w_ceil``) — the same alignment as Piper's ``generate_path``. ``noise``: standard
    normal [B, C, n_frames] (drawn here when None); ``noise_scale`` [B].
    """
    idx, frame, cum = frame_phonemes(w_ceil, n_frames)
    inside = (frame < cum[:, -1:]).unsqueeze(1).to(m_p.dtype)
    idx = idx.unsqueeze(1).expand(-1, m_p.shape[1], -1)
    m = torch.gather(m_p, 2, idx) * inside
    logs = torch.gather(logs_p, 2, idx) * inside
    if noise is None:
        noise = torch.randn_like(m)
    return m + noise * torch.exp(logs) * noise_scale.view(-1, 1, 1)


def expand_prior_into(latents: torch.Tensor, slots: torch.Tensor, m_p: torch.Tensor, logs_p: torch.Tensor,
                      w_ceil: torch.Tensor, noise_scale: torch.Tensor, noise: torch.Tensor) -> None:  # fmt: skip
    """``fused_prior.expand_prior_into``: ``expand_prior`` over ``latents``' frames, transposed into
    ``latents[slots]`` ([S, F, C])."""
    z = expand_prior(m_p, logs_p, w_ceil, latents.shape[1], noise_scale, noise)
    latents[slots] = z.transpose(1, 2)
