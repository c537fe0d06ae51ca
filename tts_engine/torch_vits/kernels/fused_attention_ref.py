"""``fused_attention`` in plain PyTorch: the relative-position self-attention between the text encoder's
1x1 convolutions, and the residual sum with its LayerNorm, as the kernels compute them
(``tests/test_kernels.py`` holds them to it; ``text_encoder.RelativeSelfAttention`` is the model's own)."""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: torch.Tensor, emb_rel_k: torch.Tensor,
              emb_rel_v: torch.Tensor, n_heads: int, window: int, qkv_bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """``fused_attention.attention``'s arguments -> [B, H * D, T] float32: per head, softmax over the
    sentence's keys (``masked``'s row 0) of ``q k^T / sqrt(D)`` plus each key's relative logit within
    ``window``, times the values plus each weight's relative value embedding; 0 past the sentence's end."""
    b, c, t = q.shape
    d = c // n_heads
    if qkv_bias is not None:
        q, k, v = (x + bias.view(1, -1, 1) for x, bias in zip((q, k, v), qkv_bias.chunk(3)))

    def heads(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(b, n_heads, d, t).transpose(2, 3)  # [B, H, T, D]

    qh, kh, vh = heads(q) / math.sqrt(d), heads(k), heads(v)
    pos = torch.arange(t, device=q.device)
    offset = pos[None, :] - pos[:, None]  # key - query
    band = (offset.abs() <= window).to(q.dtype)
    index = (offset + window).clamp(0, 2 * window)
    rel_logits = qh @ emb_rel_k.transpose(0, 1)  # [B, H, T, 2w+1]
    scores = qh @ kh.transpose(-2, -1) + torch.gather(rel_logits, 3, index.expand(b, n_heads, t, t)) * band
    keys_out = masked[:, :, :1, :]  # [B, 1, 1, T]: row 0 holds each key's mask
    p = torch.softmax(scores.masked_fill(keys_out, -1e4), dim=-1)
    out = p @ vh + torch.einsum("bhij,ijd->bhid", p * band, emb_rel_v[index])
    inside = (~keys_out[:, :, 0, :]).to(q.dtype)  # [B, 1, T]: the sentence's positions
    return out.transpose(2, 3).reshape(b, c, t) * inside


def add_norm(x: torch.Tensor, y: torch.Tensor, bias: torch.Tensor | None, gamma: torch.Tensor, beta: torch.Tensor,
             eps: float) -> torch.Tensor:  # fmt: skip
    """``fused_attention.add_norm``: the channel LayerNorm of ``x + (y + bias)``, [B, C, T]."""
    s = x + (y if bias is None else y + bias.view(1, -1, 1))
    return F.layer_norm(s.transpose(1, 2), (s.shape[1],), gamma, beta, eps).transpose(1, 2)
