"""The text encoder's windowed relative-position self-attention as one Triton kernel per layer, and
its residual sums and LayerNorms as one kernel each (``FusedEncoder``, ``add_norm``).

``text_encoder.RelativeSelfAttention`` takes ~14 kernels per layer between its 1x1 convolutions:
the query scaling, the two score products (keys and relative keys), the gather of the relative
logits onto the band ``|j - i| <= window``, the mask, the softmax, the value product, the gather of
the band's weights, the relative-value product, the sums and the head transpose. At the batches the
engine's fast lanes launch (a dozen sentences) the encoder's graph is bound by its kernels' count,
not by their arithmetic; ``FusedRelativeSelfAttention`` stacks the query, key and value convolutions
into one matrix product, keeps the output one as a product (its bias goes to ``add_norm``) and
computes everything between them in ``_attention``: per (query block, head, sentence) an online
softmax over the sentence's keys outside the band (``tl.dot`` in ``PRECISIONS[products]``: with the
text encoder's "cublas" or "ieee" products fp32 on the CUDA cores, like cuBLAS's fp32 products with
TF32 off; with "tf32x3" or "fp16x3" three TF32 tensor-core products, close to fp32; with "tf32"
one), then the ``2 window + 1`` band keys one by one, each with its relative key logit, adding its
relative value embedding to the value it weighs. Keys past a sentence's end are not read (PyTorch gives them ``-1e4`` before the softmax:
weight ``exp(-1e4 - max)``, exactly 0 in fp32), and query blocks past its end are not computed:
padding rows and the phoneme bucket's padding cost nothing. The positions past a sentence's end get
0 where PyTorch gives them an average over all keys; nothing reads them (the feed-forward masks its
input, the encoder's output is masked).

The query/key/value and output products stay cuBLAS's fp32 products (as Triton products in the
tensor-core precision they made the engine no faster on an H100: docs/benchmarks.md,
22b5aea:bench/results/tts_load-h100-2026-12-05-s53-pairs.json).

Not PyTorch's sums in PyTorch's order (the softmax's maximum and sum run block by block): the states
differ within fp32 rounding, and a phoneme's duration (ceil'd) can move where its length lies within
rounding of a whole frame; ``bench.tts_gpu_experiments --encoder-products`` counts the phonemes that
move over the bench sentences and noise draws (none of 84 636 on an H100 with "tf32x3", the
products ``configs/gpu.toml`` ships it with). The engine and the configuration take it only with
tensor-core products (``base.config.ATTENTION_PRODUCTS``): with IEEE fp32 ``tl.dot`` the kernel is
~10x the encoder it replaces.

Layouts: ``q``, ``k``, ``v`` and the output ``[B, H * D, T]`` (the convolutions' layout; head ``h``
is channels ``h D .. h D + D - 1``), any strides; the sentence's length is read from the attention
mask ``masked`` ``[B, 1, T, T]`` (True: no attention) as built by ``text_encoder.Encoder``, or its
row 0 alone ``[B, 1, 1, T]`` (what ``FusedEncoder`` builds: no ``T x T`` tensor): its row 0 holds each
key's mask (position 0 lies inside every sentence of length >= 1; a sentence of length 0
gets 0 everywhere).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tts_engine.torch_vits.kernels import available, triton
from tts_engine.torch_vits.kernels.fused_ffn import tap_major

#: The text encoder's products (``tts.text_encoder_products``) the attention kernel takes its precision
#: from: tensor-core products only (fp32 ``tl.dot`` on the CUDA cores made its kernel ~10x the encoder
#: it replaces: H100, 30 instead of 2.6 ms at 16 sentences).
ATTENTION_PRODUCTS = ("tf32x3", "fp16x3", "tf32")


def parse_tile(tile: str) -> tuple[int, int, int, bool]:
    """A kernel program, ``"<queries>x<keys>w<warps>-unrolled|loop"`` (queries and keys per block, 16-128
    in powers of two; 1-8 warps; the band's keys unrolled or as a loop) -> (queries, keys, warps, band
    unrolled); ValueError for anything else."""
    try:
        block, band = tile.split("-")
        m, rest = block.split("x")
        n, warps = rest.split("w")
        m, n, warps = int(m), int(n), int(warps)
        if m not in (16, 32, 64, 128) or n not in (16, 32, 64, 128) or warps not in (1, 2, 4, 8) or \
                band not in ("unrolled", "loop"):  # fmt: skip
            raise ValueError(tile)
    except ValueError:
        raise ValueError("an attention tile is <queries>x<keys>w<warps>-unrolled|loop (queries and keys 16-128, "
                         f"1-8 warps), got {tile!r}") from None  # fmt: skip
    return m, n, warps, band == "unrolled"


#: The kernel's program (a constant of the engine): 32 queries, keys 32 per step of its
#: key loop, 4 warps, the band's ``2 window + 1`` keys as a loop. Compiled for sm_90 (Triton 3.9) the
#: medium voice's layer (96 channels a head, in 128 lanes) takes 255 registers a thread and a stack of
#: 2824 bytes in the first program, "64x64w4-unrolled" (64 x 64, the band unrolled), 296 bytes so,
#: none at 16 x 32 (227 registers). On an H100 (2026-12-06, ``python -m bench.encoder_attention``)
#: 32 x 32 with the band as a loop was the fastest at 32-64 sentences, 41-55 % less time than
#: "64x64w4-unrolled" (0.173 vs 0.295 ms at 64 sentences x 192 phonemes), and the engine +3 % at 50
#: clients (``dbb0759:bench/results/encoder_attention-h100-2026-12-05-s54-attn.json``, ``tts_load-h100-2026-12-05-s54-pairs.json``).
TILE = "32x32w4-loop"
#: Software pipelining of the key loop: a sentence has at most a few key blocks, and Triton's default
#: (3 stages of 64 keys x 128 channels of keys and values in fp32) needs 256 KiB of shared memory,
#: more than a Hopper SM has (227 KiB).
NUM_STAGES = 1
#: ``tl.dot``'s precision per ``tts.text_encoder_products`` (the feed-forward's products; fp16x3's
#: split needs scaled operands, the attention takes tf32x3's precision instead).
PRECISIONS = {"cublas": "ieee", "ieee": "ieee", "tf32x3": "tf32x3", "tf32": "tf32", "fp16x3": "tf32x3"}


if triton is not None:
    import triton.language as tl

    @triton.jit
    def _band_key(r, acc, total, m, q, i, i_in, length, chan, d, dok, bk, bv, k_ptr, v_ptr, ek_ptr, ev_ptr, base, s_t,
                  D: tl.constexpr, W: tl.constexpr):  # fmt: skip
        """The band's key ``r`` (offset ``r - W`` from each query) with its relative key logit and value
        embedding, folded into the online softmax's ``acc``, ``total`` and maximum ``m``."""
        j = i + (r - W)
        ok = i_in & (j >= 0) & (j < length)
        kj = tl.load(k_ptr + base + chan[None, :] + j[:, None] * s_t, mask=ok[:, None] & dok[None, :], other=0.0)
        ek = tl.load(ek_ptr + r * D + d, mask=dok, other=0.0)
        s = tl.sum(q * (kj + bk[None, :]), 1) + tl.sum(q * ek[None, :], 1)
        s = tl.where(ok, s, -1.0e30)
        m_new = tl.maximum(m, s)
        p = tl.where(ok, tl.exp(s - m_new), 0.0)
        alpha = tl.exp(m - m_new)
        vj = tl.load(v_ptr + base + chan[None, :] + j[:, None] * s_t, mask=ok[:, None] & dok[None, :], other=0.0)
        ev = tl.load(ev_ptr + r * D + d, mask=dok, other=0.0)
        return acc * alpha[:, None] + p[:, None] * (vj + bv[None, :] + ev[None, :]), total * alpha + p, m_new

    @triton.jit
    def _attention(q_ptr, k_ptr, v_ptr, bias_ptr, masked_ptr, ek_ptr, ev_ptr, out_ptr, T, s_b, s_c, s_t, o_b, o_c,
                   o_t, m_b, m_j, C: tl.constexpr, D: tl.constexpr, W: tl.constexpr, SCALE: tl.constexpr,
                   PREC: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, BAND_UNROLL: tl.constexpr):  # fmt: skip
        mb, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        # the sentence's length: keys whose mask (row 0 of ``masked``) is False form a prefix
        length = tl.sum(tl.zeros([BLOCK_N], tl.int32), 0)  # an int32 scalar, the type the loop adds
        for start in range(0, T, BLOCK_N):
            j = start + tl.arange(0, BLOCK_N)
            free = tl.load(masked_ptr + b * m_b + j * m_j, mask=j < T, other=1) == 0
            length += tl.sum(free.to(tl.int32), 0)
        i = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        d = tl.arange(0, BLOCK_D)
        dok = d < D
        i_in = i < length
        chan = (h * D + d) * s_c
        q = tl.load(q_ptr + b * s_b + chan[None, :] + i[:, None] * s_t, mask=i_in[:, None] & dok[None, :], other=0.0)
        bq = tl.zeros([BLOCK_D], tl.float32)
        bk = tl.zeros([BLOCK_D], tl.float32)
        bv = tl.zeros([BLOCK_D], tl.float32)
        if HAS_BIAS:  # the convolutions' biases, added as their outputs are read (PyTorch adds them the same way)
            bq = tl.load(bias_ptr + h * D + d, mask=dok, other=0.0)
            bk = tl.load(bias_ptr + C + h * D + d, mask=dok, other=0.0)
            bv = tl.load(bias_ptr + 2 * C + h * D + d, mask=dok, other=0.0)
        q = (q + bq[None, :]) / SCALE
        big = -1.0e30  # a finite "minus infinity": rows with no key yet stay free of NaN
        m = tl.full([BLOCK_M], big, tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        keys = tl.where(mb * BLOCK_M < length, length, 0)  # a block of queries past the end reads no key
        for start in range(0, keys, BLOCK_N):
            j = start + tl.arange(0, BLOCK_N)
            j_in = j < length
            kt = tl.load(k_ptr + b * s_b + chan[:, None] + j[None, :] * s_t, mask=dok[:, None] & j_in[None, :], other=0.0)
            s = tl.dot(q, kt + bk[:, None], input_precision=PREC)
            offset = j[None, :] - i[:, None]
            outside = (offset > W) | (offset < -W)  # the band's keys come after the loop, with their relative terms
            s = tl.where(outside & j_in[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m - m_new)
            vt = tl.load(v_ptr + b * s_b + chan[None, :] + j[:, None] * s_t, mask=j_in[:, None] & dok[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p, vt + bv[None, :], input_precision=PREC)
            total = total * alpha + tl.sum(p, 1)
            m = m_new
        if BAND_UNROLL:
            for r in tl.static_range(2 * W + 1):
                acc, total, m = _band_key(r, acc, total, m, q, i, i_in, length, chan, d, dok, bk, bv, k_ptr, v_ptr,
                                          ek_ptr, ev_ptr, b * s_b, s_t, D, W)  # fmt: skip
        else:
            for r in range(2 * W + 1):
                acc, total, m = _band_key(r, acc, total, m, q, i, i_in, length, chan, d, dok, bk, bv, k_ptr, v_ptr,
                                          ek_ptr, ev_ptr, b * s_b, s_t, D, W)  # fmt: skip
        out = tl.where(i_in[:, None], acc / tl.where(i_in, total, 1.0)[:, None], 0.0)
        tl.store(out_ptr + b * o_b + ((h * D + d) * o_c)[None, :] + i[:, None] * o_t, out,
                 mask=(i < T)[:, None] & dok[None, :])  # fmt: skip


    @triton.jit
    def _add_norm(x_ptr, y_ptr, bias_ptr, gamma_ptr, beta_ptr, out_ptr, C, T, eps, HAS_BIAS: tl.constexpr,
                  BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr):  # fmt: skip
        tb, b = tl.program_id(0), tl.program_id(1)
        c = tl.arange(0, BLOCK_C)
        t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
        cok = c < C
        inside = cok[:, None] & (t < T)[None, :]
        offs = b * C * T + c[:, None] * T + t[None, :]
        y = tl.load(y_ptr + offs, mask=inside, other=0.0)
        if HAS_BIAS:  # the convolution's bias first, then the residual: PyTorch's order
            y = y + tl.load(bias_ptr + c, mask=cok, other=0.0)[:, None]
        z = tl.load(x_ptr + offs, mask=inside, other=0.0) + y
        mean = tl.sum(z, 0) / C
        diff = tl.where(cok[:, None], z - mean[None, :], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, 0) / C + eps)
        gamma = tl.load(gamma_ptr + c, mask=cok, other=0.0)
        beta = tl.load(beta_ptr + c, mask=cok, other=0.0)
        tl.store(out_ptr + offs, diff * rstd[None, :] * gamma[:, None] + beta[:, None], mask=inside)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: torch.Tensor, emb_rel_k: torch.Tensor,
              emb_rel_v: torch.Tensor, n_heads: int, window: int, precision: str = "ieee",
              qkv_bias: torch.Tensor | None = None, tile: str = TILE) -> torch.Tensor:  # fmt: skip
    """``_attention``: ``q``, ``k``, ``v`` [B, H * D, T] float32 (the 1x1 convolutions' outputs, one
    layout and strides; with ``qkv_bias`` [3 H D], the q, k and v biases stacked, before their bias,
    which is added as they are read), ``masked`` [B, 1, T, T] or [B, 1, 1, T] bool (row 0 is read),
    ``emb_rel_k`` / ``emb_rel_v`` [2 window + 1, D] -> [B, H * D, T] contiguous: what
    ``RelativeSelfAttention`` computes before ``conv_o``. ``precision``: ``tl.dot``'s ("ieee", "tf32x3"
    or "tf32"); ``tile``: the program's (``parse_tile``)."""
    block_m, block_n, warps, band_unroll = parse_tile(tile)
    if precision not in set(PRECISIONS.values()):
        raise ValueError(f"precision must be one of {sorted(set(PRECISIONS.values()))}, got {precision!r}")
    b, c, t = q.shape
    if k.shape != q.shape or v.shape != q.shape or k.stride() != q.stride() or v.stride() != q.stride():
        raise ValueError(f"q, k, v must share shape and strides, got {q.shape}/{q.stride()}, "
                         f"{k.shape}/{k.stride()}, {v.shape}/{v.stride()}")  # fmt: skip
    d = c // n_heads
    if d * n_heads != c or emb_rel_k.shape != (2 * window + 1, d) or emb_rel_v.shape != emb_rel_k.shape:
        raise ValueError(f"{c} channels in {n_heads} heads with relative embeddings [{2 * window + 1}, {d}], "
                         f"got {tuple(emb_rel_k.shape)}, {tuple(emb_rel_v.shape)}")  # fmt: skip
    if qkv_bias is not None and qkv_bias.shape != (3 * c,):
        raise ValueError(f"qkv_bias must be [{3 * c}], got {tuple(qkv_bias.shape)}")
    if masked.shape not in ((b, 1, t, t), (b, 1, 1, t)) or masked.dtype != torch.bool:
        raise ValueError(f"masked must be bool [{b}, 1, {t}, {t}] or [{b}, 1, 1, {t}], got {masked.dtype} "
                         f"{tuple(masked.shape)}")  # fmt: skip
    out = torch.empty(b, c, t, device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(t, block_m), n_heads, b)
    bias = q if qkv_bias is None else qkv_bias.contiguous()
    _attention[grid](q, k, v, bias, masked.view(torch.uint8), emb_rel_k.contiguous(), emb_rel_v.contiguous(), out,
                     t, *q.stride(), *out.stride(), masked.stride(0), masked.stride(3), C=c, D=d, W=window,
                     SCALE=math.sqrt(d), PREC=precision, HAS_BIAS=qkv_bias is not None, BLOCK_M=block_m, BLOCK_N=block_n,
                     BLOCK_D=max(16, triton.next_power_of_2(d)), BAND_UNROLL=band_unroll, num_warps=warps,
                     num_stages=NUM_STAGES)  # fmt: skip
    return out


class FusedRelativeSelfAttention(nn.Module):
    """``RelativeSelfAttention`` (same weights) with its query, key and value convolutions as one
    matrix product of their stacked weights (their biases added inside ``attention``), everything
    between them and ``conv_o`` in ``attention``, its products in ``PRECISIONS[products]``."""

    def __init__(self, attn: nn.Module, products: str = "cublas", tile: str = TILE) -> None:
        super().__init__()
        parse_tile(tile)
        self.tile = tile
        if products not in PRECISIONS:
            raise ValueError(f"products must be one of {sorted(PRECISIONS)}, got {products!r}")
        self.precision = PRECISIONS[products]
        self.n_heads, self.window_size = attn.n_heads, attn.window_size
        w_o, b_o = _pointwise(attn.conv_o)
        self.register_buffer("w_o", w_o.contiguous())
        self.register_buffer("b_o", b_o.contiguous())  # [C]: add_norm adds it
        weights, biases = zip(*(_pointwise(conv) for conv in (attn.conv_q, attn.conv_k, attn.conv_v)))
        self.register_buffer("w_qkv", torch.cat(weights).contiguous())  # [3C, C]
        self.register_buffer("b_qkv", torch.cat(biases).contiguous())  # [3C]
        self.register_buffer("emb_k", attn.emb_rel_k.detach()[0].float().contiguous())
        self.register_buffer("emb_v", attn.emb_rel_v.detach()[0].float().contiguous())

    def unbiased(self, x: torch.Tensor, masked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's output before its output convolution's bias, and that bias [C] (``add_norm`` adds it)."""
        q, k, v = torch.matmul(self.w_qkv, x).chunk(3, dim=1)  # [B, 3C, T] in three views of one layout
        out = attention(q, k, v, masked, self.emb_k, self.emb_v, self.n_heads, self.window_size, self.precision,
                        self.b_qkv, self.tile)  # fmt: skip
        return torch.matmul(self.w_o, out), self.b_o

    def forward(self, x: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        y, bias = self.unbiased(x, masked)
        return y + bias[:, None]


def _pointwise(conv: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """A 1x1 convolution's weight [out, in] and bias [out] (``fused_ffn.tap_major``'s layout, kernel 1)."""
    weight, bias, kernel = tap_major(conv)
    if kernel != 1 or bias is None:
        raise ValueError(f"fused attention: 1x1 convolutions with a bias only, got {conv}")
    return weight, bias.view(-1)


#: Time steps per program of ``_add_norm`` (all channels in one program).
NORM_BLOCK_T = 32


def add_norm(x: torch.Tensor, y: torch.Tensor, bias: torch.Tensor | None, norm: nn.Module) -> torch.Tensor:
    """``norm(x + (y + bias))`` in one kernel (``_add_norm``): ``x``, ``y`` [B, C, T] float32, ``bias`` [C]
    or None, ``norm`` a ``ChannelLayerNorm`` of C channels -> [B, C, T] contiguous."""
    x, y = x.contiguous(), y.contiguous()
    b, c, t = x.shape
    if y.shape != x.shape or norm.channels != c:
        raise ValueError(f"add_norm: x {tuple(x.shape)}, y {tuple(y.shape)}, a norm of {norm.channels} channels")
    out = torch.empty_like(x)
    grid = (triton.cdiv(t, NORM_BLOCK_T), b)
    _add_norm[grid](x, y, x if bias is None else bias, norm.gamma, norm.beta, out, c, t, float(norm.eps),
                    HAS_BIAS=bias is not None, BLOCK_C=triton.next_power_of_2(c), BLOCK_T=NORM_BLOCK_T,
                    num_warps=4)  # fmt: skip
    return out


class FusedEncoder(nn.Module):
    """``text_encoder.Encoder`` (same weights and submodules) whose layers run as: the stacked query,
    key and value product, ``attention``, the output product, then its bias, the residual and the
    first LayerNorm in one kernel (``add_norm``); the feed-forward (whichever it is), then the
    residual and the second LayerNorm in one kernel."""

    def __init__(self, encoder: nn.Module, products: str = "cublas", tile: str = TILE) -> None:
        super().__init__()
        self.attn_layers = nn.ModuleList(FusedRelativeSelfAttention(a, products, tile)
                                         for a in encoder.attn_layers)  # fmt: skip
        self.norm_layers_1, self.ffn_layers, self.norm_layers_2 = (encoder.norm_layers_1, encoder.ffn_layers,
                                                                   encoder.norm_layers_2)  # fmt: skip

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        masked = (mask == 0).unsqueeze(2)  # [B, 1, 1, T]: the row of Encoder's [B, 1, T, T] attention reads
        x = x * mask
        layers = zip(self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2)
        for attn, norm_1, ffn, norm_2 in layers:
            y, bias = attn.unbiased(x, masked)
            x = add_norm(x, y, bias, norm_1)
            x = add_norm(x, ffn(x, mask), None, norm_2)
        return x * mask


def is_encoder(module: nn.Module) -> bool:
    """``module`` is a text encoder's layer stack (``text_encoder.Encoder``: its attention, LayerNorm
    and feed-forward layers), known by its parts: the kernels do not import the model."""
    return all(hasattr(module, name) for name in ("attn_layers", "norm_layers_1", "ffn_layers", "norm_layers_2"))


def use_fused_attention(module: nn.Module, products: str = "cublas", tile: str = TILE) -> int:
    """Swap every text ``Encoder`` inside ``module`` for a ``FusedEncoder`` (its attention products after
    the text encoder's ``products``; its kernel's program ``tile``); returns how many attention layers
    were fused."""
    swapped = 0
    for name, child in list(module.named_children()):
        if is_encoder(child):
            fused = FusedEncoder(child, products, tile)
            setattr(module, name, fused)
            swapped += len(fused.attn_layers)
        else:
            swapped += use_fused_attention(child, products, tile)
    return swapped


__all__ = ["PRECISIONS", "TILE", "parse_tile", "FusedEncoder", "FusedRelativeSelfAttention", "add_norm", "attention", "available", "use_fused_attention"]
