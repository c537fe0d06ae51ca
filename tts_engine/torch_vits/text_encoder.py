"""VITS text encoder: phoneme embedding + transformer with windowed relative positions.

Tensors are channels-first: ``[batch, channels, time]``; ``mask`` is ``[batch, 1, time]``
float (1 inside the sequence, 0 in padding). Time here is phoneme ids.
Module and parameter names follow Piper's training code so state dicts load as is.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class ChannelLayerNorm(nn.Module):
    """LayerNorm over the channel axis of a ``[B, C, T]`` tensor."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.channels = channels
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x.transpose(1, 2), (self.channels,), self.gamma, self.beta, self.eps)
        return y.transpose(1, 2)


def _band_indices(length: int, window: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``[T, T]`` index into the ``2w+1`` relative offsets, and the mask of ``|j - i| <= w``."""
    pos = torch.arange(length, device=device)
    offset = pos[None, :] - pos[:, None]
    return (offset + window).clamp(0, 2 * window), (offset.abs() <= window)


def _offset_indices(length: int, window: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``[T, 2w+1]`` absolute key index ``i + r - w`` (clamped) and its validity."""
    pos = torch.arange(length, device=device)[:, None] + torch.arange(-window, window + 1, device=device)[None, :]
    return pos.clamp(0, length - 1), (pos >= 0) & (pos < length)


#: Relative-position index tensors per (length, window, device): constants of a shape, built once
#: instead of in every encoder launch (a dozen small kernels per layer).
_RELATIVE_INDICES: dict[tuple[int, int, str], tuple[torch.Tensor, ...]] = {}


def _relative_indices(length: int, window: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """``_band_indices`` and ``_offset_indices`` of one length, kept (not while exporting to ONNX or
    compiling, where the length is symbolic, nor while a CUDA graph is captured)."""
    if torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling():  # before the lookup: no guard on the length
        return (*_band_indices(length, window, device), *_offset_indices(length, window, device))
    key = (length, window, str(device))
    kept = _RELATIVE_INDICES.get(key)
    if kept is not None:
        return kept
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return (*_band_indices(length, window, device), *_offset_indices(length, window, device))
    with torch.inference_mode(False), torch.no_grad():  # plain tensors, usable in any mode
        kept = (*_band_indices(length, window, device), *_offset_indices(length, window, device))
    _RELATIVE_INDICES[key] = kept
    return kept


class RelativeSelfAttention(nn.Module):
    """Multi-head self-attention with relative key/value embeddings shared by the heads.

    Offsets beyond ``window_size`` get no relative term (Piper pads them with zeros).
    """

    def __init__(self, channels: int, n_heads: int, window_size: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.window_size = window_size
        self.k_channels = channels // n_heads
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, channels, 1)
        scale = self.k_channels**-0.5
        self.emb_rel_k = nn.Parameter(torch.randn(1, 2 * window_size + 1, self.k_channels) * scale)
        self.emb_rel_v = nn.Parameter(torch.randn(1, 2 * window_size + 1, self.k_channels) * scale)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, _, t = x.shape
        return x.view(b, self.n_heads, self.k_channels, t).transpose(2, 3)  # [B, H, T, D]

    def forward(self, x: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        """``x`` [B, C, T]; ``masked`` [B, 1, T, T] bool (True: no attention)."""
        b, c, t = x.shape
        w = self.window_size
        q = self._heads(self.conv_q(x)) / math.sqrt(self.k_channels)
        k, v = self._heads(self.conv_k(x)), self._heads(self.conv_v(x))
        scores = q @ k.transpose(-2, -1)
        rel_logits = q @ self.emb_rel_k[0].transpose(0, 1)  # [B, H, T, 2w+1]
        band_idx, band, key_idx, key_ok = _relative_indices(t, w, x.device)
        scores = scores + torch.gather(rel_logits, 3, band_idx.expand(b, self.n_heads, t, t)) * band
        scores = scores.masked_fill(masked, -1e4)
        p_attn = torch.softmax(scores, dim=-1)
        out = p_attn @ v
        rel_weights = torch.gather(p_attn, 3, key_idx.expand(b, self.n_heads, t, 2 * w + 1)) * key_ok
        out = out + rel_weights @ self.emb_rel_v[0]
        return self.conv_o(out.transpose(2, 3).reshape(b, c, t))


class FeedForward(nn.Module):
    """Two "same"-padded convolutions with ReLU between, masked at each input."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.pad = ((kernel_size - 1) // 2, kernel_size // 2)
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size)
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv_1(F.pad(x * mask, self.pad)))
        return self.conv_2(F.pad(x * mask, self.pad)) * mask


class Encoder(nn.Module):
    """Post-norm transformer stack."""

    def __init__(
        self, channels: int, filter_channels: int, n_heads: int, n_layers: int, kernel_size: int, window_size: int
    ) -> None:
        super().__init__()
        self.attn_layers = nn.ModuleList(RelativeSelfAttention(channels, n_heads, window_size) for _ in range(n_layers))
        self.norm_layers_1 = nn.ModuleList(ChannelLayerNorm(channels) for _ in range(n_layers))
        self.ffn_layers = nn.ModuleList(FeedForward(channels, filter_channels, kernel_size) for _ in range(n_layers))
        self.norm_layers_2 = nn.ModuleList(ChannelLayerNorm(channels) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        masked = (mask.unsqueeze(2) * mask.unsqueeze(-1)) == 0  # [B, 1, T, T]
        x = x * mask
        layers = zip(self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2)
        for attn, norm_1, ffn, norm_2 in layers:
            x = norm_1(x + attn(x, masked))
            x = norm_2(x + ffn(x, mask))
        return x * mask


class TextEncoder(nn.Module):
    """Phoneme ids -> hidden states and the prior's mean / log-std per phoneme."""

    def __init__(
        self,
        n_vocab: int,
        out_channels: int,
        hidden_channels: int,
        filter_channels: int,
        n_heads: int,
        n_layers: int,
        kernel_size: int,
        window_size: int,
    ) -> None:
        super().__init__()
        self.hidden_channels = hidden_channels
        self.out_channels = out_channels
        self.emb = nn.Embedding(n_vocab, hidden_channels)
        self.encoder = Encoder(hidden_channels, filter_channels, n_heads, n_layers, kernel_size, window_size)
        self.proj = nn.Conv1d(hidden_channels, out_channels * 2, 1)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``ids`` [B, T] int64, ``lengths`` [B] -> ``x`` [B, H, T], ``m``, ``logs`` [B, C, T], ``mask`` [B, 1, T]."""
        x = (self.emb(ids) * math.sqrt(self.hidden_channels)).transpose(1, 2)
        positions = torch.arange(ids.shape[1], device=ids.device)
        mask = (positions[None, :] < lengths[:, None]).unsqueeze(1).to(x.dtype)
        x = self.encoder(x * mask, mask)
        stats = self.proj(x) * mask
        m, logs = torch.split(stats, self.out_channels, dim=1)
        return x, m, logs, mask
