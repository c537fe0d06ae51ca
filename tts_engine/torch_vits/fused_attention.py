"""The text encoder's relative self-attention as one fused Triton kernel per layer (GPU;
``tts.fused_text_attention``).

The encoder runs in fp32 on every new request (durations are ceil'd). In PyTorch each of its six
attention layers materializes ``[B, heads, T, T]`` score tensors several times over — the
product ``q k^T``, the relative logits gathered onto the band, the mask, the softmax, the gather
of the band back out of the probabilities — and computes every padded query and key: on the H200
at 64 sentences of the 256-id bucket the encoder took 12.6 ms, as long as decoding all their audio
(``bench/results/tts_load-h200-2026-12-04-encoder.md``). Here one program takes ``BLOCK_M`` queries
of one (sentence, head) and walks its keys up to the sentence's length (no padded key is read,
no padded query computed), with the softmax kept online (running maximum and sum, as flash
attention does):

* scores ``q . k`` (``q`` already divided by ``sqrt(d)``, as in ``RelativeSelfAttention``), plus
  ``q . emb_rel_k[r]`` on the band ``j - i = r - window``;
* keys past the sentence's length get no weight (PyTorch fills them with -1e4, whose exponential
  is 0 in fp32: the same);
* the output ``softmax . v`` plus ``sum_r p[i, i + r - window] * emb_rel_v[r]``, written
  channels-first ``[B, C, T]`` (what the output convolution takes; no transpose copy).

Every product is fp32 (``input_precision="ieee"``: no TF32); only the order of the sums differs
from PyTorch's (the softmax's sum and maximum are taken block by block), so frames per phoneme
stay those of the PyTorch encoder (tested: ``tests/test_fused_attention.py`` in Triton's
interpreter, ``tests/test_gpu_tts.py`` on a GPU). Rows past a sentence's length come out 0
(PyTorch's are an average over every key, padding included): nothing reads them, since the
feed-forward layers mask their inputs, later attention layers give padded keys no weight and the
encoder's outputs are masked. Masks must be prefixes (``TextEncoder`` builds them from lengths).

``use_fused_attention(encoder)`` swaps every ``RelativeSelfAttention`` of a ``TextEncoder`` (or
its ``Encoder``) for ``FusedRelativeAttention`` (weights shared; q, k and v from one product).
"""

from __future__ import annotations

import math
import os

import torch
from torch import nn

from tts_engine.torch_vits.text_encoder import RelativeSelfAttention

try:  # triton ships with CUDA builds of PyTorch; CPU-only installs lack it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None

#: Queries per program, keys per inner step.
BLOCK_M = 32
BLOCK_N = 64


def available() -> bool:
    """Triton importable and a CUDA device present (or Triton's interpreter asked for)."""
    return triton is not None and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")


if triton is not None:

    @triton.jit
    def _band_logit(q, ek_ptr, r, offs_d, dmask, BLOCK_D: tl.constexpr):
        """``q . emb_rel_k[r]`` per query row of ``q`` [BLOCK_M, BLOCK_D]."""
        ek = tl.load(ek_ptr + r * BLOCK_D + offs_d, mask=dmask, other=0.0)
        return tl.sum(q * ek[None, :], axis=1)

    @triton.jit
    def _rel_attention(q_ptr, k_ptr, v_ptr, ek_ptr, ev_ptr, len_ptr, o_ptr,
                       s_b, s_h, s_t, s_d, o_b, o_h, o_t, o_d, T,
                       HEADS: tl.constexpr, D: tl.constexpr, W: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
        """One (query block, sentence x head). ``q``/``k``/``v`` share strides ``s_*`` (batch, head,
        time, channel); ``ek``/``ev`` are ``[2W+1, BLOCK_D]`` (zero-padded channels); output strides ``o_*``."""
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // HEADS
        h = bh % HEADS
        length = tl.load(len_ptr + b)
        offs_i = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        dmask = offs_d < D
        base = b * s_b + h * s_h
        out_ptrs = o_ptr + b * o_b + h * o_h + offs_i[:, None] * o_t + offs_d[None, :] * o_d
        out_mask = (offs_i < T)[:, None] & dmask[None, :]
        if pid_m * BLOCK_M >= length:  # padded queries only: nothing reads them
            tl.store(out_ptrs, tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32), mask=out_mask)
        else:
            rows = offs_i < length
            q = tl.load(q_ptr + base + offs_i[:, None] * s_t + offs_d[None, :] * s_d,
                        mask=rows[:, None] & dmask[None, :], other=0.0)  # fmt: skip
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
            i0 = pid_m * BLOCK_M
            for j0 in range(0, length, BLOCK_N):
                offs_j = j0 + tl.arange(0, BLOCK_N)
                keys = offs_j < length
                kt = tl.load(k_ptr + base + offs_j[None, :] * s_t + offs_d[:, None] * s_d,
                             mask=keys[None, :] & dmask[:, None], other=0.0)  # [BLOCK_D, BLOCK_N]
                s = tl.dot(q, kt, input_precision="ieee")
                if (j0 < i0 + BLOCK_M + W) & (j0 + BLOCK_N > i0 - W):  # the band crosses this block
                    diff = offs_j[None, :] - offs_i[:, None]
                    for r in tl.static_range(2 * W + 1):
                        rel = _band_logit(q, ek_ptr, r, offs_d, dmask, BLOCK_D)
                        s = s + tl.where(diff == r - W, rel[:, None], 0.0)
                s = tl.where(keys[None, :], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(s - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, axis=1)
                v = tl.load(v_ptr + base + offs_j[:, None] * s_t + offs_d[None, :] * s_d,
                            mask=keys[:, None] & dmask[None, :], other=0.0)  # fmt: skip
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
                m_i = m_new
            out = acc / l_i[:, None]
            # the relative values: each band probability (recomputed from its score) times emb_rel_v[r]
            for r in tl.static_range(2 * W + 1):
                j = offs_i + (r - W)
                ok = rows & (j >= 0) & (j < length)
                kj = tl.load(k_ptr + base + j[:, None] * s_t + offs_d[None, :] * s_d,
                             mask=ok[:, None] & dmask[None, :], other=0.0)  # fmt: skip
                score = tl.sum(q * kj, axis=1) + _band_logit(q, ek_ptr, r, offs_d, dmask, BLOCK_D)
                pj = tl.where(ok, tl.exp(score - m_i) / l_i, 0.0)
                ev = tl.load(ev_ptr + r * BLOCK_D + offs_d, mask=dmask, other=0.0)
                out += pj[:, None] * ev[None, :]
            tl.store(out_ptrs, tl.where(rows[:, None], out, 0.0), mask=out_mask)


def relative_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, emb_k: torch.Tensor,
                       emb_v: torch.Tensor, lengths: torch.Tensor, window: int) -> torch.Tensor:
    """``q``, ``k``, ``v`` [B, H, T, D] float32 of one layout (any strides; ``q`` scaled), ``emb_k``/``emb_v``
    [2*window+1, BLOCK_D] zero-padded, ``lengths`` [B] -> attention output [B, H*D, T] (channels-first)."""
    b, heads, t, d = q.shape
    if not (q.stride() == k.stride() == v.stride()):
        raise ValueError("q, k and v must share one layout")
    block_d = emb_k.shape[1]
    out = torch.empty(b, heads * d, t, device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(t, BLOCK_M), b * heads)
    _rel_attention[grid](q, k, v, emb_k, emb_v, lengths, out, *q.stride(),
                         heads * d * t, d * t, 1, t, t, HEADS=heads, D=d, W=window,
                         BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=block_d, num_warps=4)  # fmt: skip
    return out


class FusedRelativeAttention(nn.Module):
    """``RelativeSelfAttention`` (same weights) with q, k, v from one product and the rest in
    ``_rel_attention``. Takes the same ``masked`` [B, 1, T, T] (True: no attention) and reads the
    sentences' lengths from its first row."""

    def __init__(self, attn: RelativeSelfAttention) -> None:
        super().__init__()
        self.n_heads, self.window_size, self.k_channels = attn.n_heads, attn.window_size, attn.k_channels
        channels = self.n_heads * self.k_channels
        convs = (attn.conv_q, attn.conv_k, attn.conv_v)
        weights = [c.weight.detach().reshape(channels, channels) for c in convs]  # Conv1d [C, C, 1] or GemmConv1d [C, C]
        self.register_buffer("qkv_weight", torch.cat(weights).contiguous())
        self.register_buffer("qkv_bias", torch.cat([c.bias.detach().reshape(-1) for c in convs]).view(-1, 1).contiguous())
        self.conv_o = attn.conv_o
        block_d = triton.next_power_of_2(self.k_channels) if triton is not None else self.k_channels
        pad = block_d - self.k_channels
        for name in ("emb_rel_k", "emb_rel_v"):
            emb = getattr(attn, name).detach()[0]  # [2w+1, D]
            self.register_buffer(name, nn.functional.pad(emb, (0, pad)).contiguous())

    def forward(self, x: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        b, c, t = x.shape
        qkv = torch.matmul(self.qkv_weight, x) + self.qkv_bias  # [B, 3C, T]
        qkv[:, :c].div_(math.sqrt(self.k_channels))  # q scaled in place, as RelativeSelfAttention scales it
        q, k, v = qkv.view(b, 3, self.n_heads, self.k_channels, t).transpose(3, 4).unbind(1)  # [B, H, T, D] each
        lengths = (~masked[:, 0, 0, :]).sum(dim=-1, dtype=torch.int32)  # prefix masks: valid keys of query 0
        out = relative_attention(q, k, v, self.emb_rel_k, self.emb_rel_v, lengths, self.window_size)
        return self.conv_o(out)


def use_fused_attention(module: nn.Module) -> int:
    """Swap every ``RelativeSelfAttention`` inside ``module`` for ``FusedRelativeAttention``; returns how many."""
    swapped = 0
    for name, child in list(module.named_children()):
        if isinstance(child, RelativeSelfAttention):
            setattr(module, name, FusedRelativeAttention(child))
            swapped += 1
        elif isinstance(child, nn.ModuleList):
            for i, item in enumerate(child):
                if isinstance(item, RelativeSelfAttention):
                    child[i] = FusedRelativeAttention(item)
                    swapped += 1
                else:
                    swapped += use_fused_attention(item)
        else:
            swapped += use_fused_attention(child)
    return swapped
