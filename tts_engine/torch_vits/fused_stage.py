"""A decoder stage's residual blocks as one Triton kernel, strip by strip (GPU; ``tts.fused_stages``).

``fused_resblock`` runs each step of a Piper "medium"/"low" stage (``mean_j block_j(x)``, each
``ResBlock2`` two steps ``h = conv_d(mask * leaky_relu(h)) + h``) as its own launch: six launches
per stage of three blocks, each reading a whole ``[B, C, T]`` tensor from memory and writing one
back (the last steps also reading the stage's output to add onto it), fourteen passes over
tensors that at the last stage of a 64-row decode step are ~290 MB each, far beyond the L2 cache.

Here one launch does the whole stage. Each program owns a strip of one row's time tiles and walks
it in order: at tile ``j`` it computes every block's first step (from the stage's input, read from
memory) into a ring of four tiles per block in a scratch buffer of its own, then, after a barrier,
every block's second step at tile ``j - 1`` (its taps reach at most one tile either side, which the
ring holds) and the mean over blocks, written once. The ring is rewritten tile after tile, so it
stays in the cache: the stage reads its input and writes its output, two passes instead of
fourteen. A strip also computes the first steps of the tile on each side of it (its neighbours
compute them too): ``2 / tiles_per_strip`` more first-step work.

Same sums as ``fused_resblock`` (fp32 accumulation on the tensor cores, a first step's output
rounded to the model's dtype as there), except that the mean over blocks is summed in fp32 and
rounded once (``fused_resblock`` rounds after adding each block). Only ``ResBlock2`` stages of 1-3
blocks whose second steps reach at most one tile (``supports``); others keep ``fused_resblock``.
"""

from __future__ import annotations

import torch

from tts_engine.torch_vits.fused_resblock import available, tap_major, triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _taps(acc, src, c_stride, w_ptr, t, T, ci, co, m_row, C: tl.constexpr, K: tl.constexpr, DIL: tl.constexpr,
              SLOPE: tl.constexpr, HAS_MASK: tl.constexpr, RING: tl.constexpr):  # fmt: skip
        """acc += sum_k W[k] @ (mask * leaky_relu(src))[:, t + k*DIL - pad], zero outside [0, T);
        ``RING`` > 0: ``src`` holds position ``p`` at column ``p % RING`` (a power of two)."""
        for k in tl.static_range(K):
            ts = t + (k * DIL - (K - 1) * DIL // 2)
            inside = (ts >= 0) & (ts < T)
            if RING > 0:
                col = ts & (RING - 1)
            else:
                col = ts
            xv = tl.load(src + ci[:, None] * c_stride + col[None, :], mask=inside[None, :], other=0.0).to(tl.float32)
            xv = tl.where(xv >= 0, xv, xv * SLOPE)
            if HAS_MASK:
                xv = xv * tl.load(m_row + ts, mask=inside, other=0.0).to(tl.float32)[None, :]
            w = tl.load(w_ptr + k * C * C + co[:, None] * C + ci[None, :])
            acc += tl.dot(w, xv.to(w.dtype))
        return acc

    @triton.jit
    def _first(x_row, ring, w_ptr, b_ptr, m_row, t, T, ci, C: tl.constexpr, K: tl.constexpr, DIL: tl.constexpr,
               SLOPE: tl.constexpr, HAS_MASK: tl.constexpr, RW: tl.constexpr, BT: tl.constexpr):  # fmt: skip
        """A block's first step at the tile of positions ``t``, into its ring."""
        acc = tl.zeros((C, BT), dtype=tl.float32)
        acc = _taps(acc, x_row, T, w_ptr, t, T, ci, ci, m_row, C, K, DIL, SLOPE, HAS_MASK, 0)
        keep = (t >= 0) & (t < T)
        acc += tl.load(b_ptr + ci).to(tl.float32)[:, None]
        acc += tl.load(x_row + ci[:, None] * T + t[None, :], mask=keep[None, :], other=0.0).to(tl.float32)
        cols = t & (RW - 1)
        tl.store(ring + ci[:, None] * RW + cols[None, :], acc.to(ring.dtype.element_ty), mask=keep[None, :])

    @triton.jit
    def _second(total, ring, w_ptr, b_ptr, m_row, t, T, ci, C: tl.constexpr, K: tl.constexpr, DIL: tl.constexpr,
                SLOPE: tl.constexpr, HAS_MASK: tl.constexpr, RW: tl.constexpr):  # fmt: skip
        """``total`` + a block's second step at the tile of positions ``t``, from its ring."""
        total = _taps(total, ring, RW, w_ptr, t, T, ci, ci, m_row, C, K, DIL, SLOPE, HAS_MASK, RW)
        keep = (t >= 0) & (t < T)
        total += tl.load(b_ptr + ci).to(tl.float32)[:, None]
        cols = t & (RW - 1)
        total += tl.load(ring + ci[:, None] * RW + cols[None, :], mask=keep[None, :], other=0.0).to(tl.float32)
        return total

    @triton.jit
    def _stage(x_ptr, m_ptr, y_ptr, s_ptr, w_ptr, b_ptr, T, TILES, STRIPS,
               C: tl.constexpr, NB: tl.constexpr, KMAX: tl.constexpr,
               K0: tl.constexpr, D00: tl.constexpr, D01: tl.constexpr,
               K1: tl.constexpr, D10: tl.constexpr, D11: tl.constexpr,
               K2: tl.constexpr, D20: tl.constexpr, D21: tl.constexpr,
               SLOPE: tl.constexpr, HAS_MASK: tl.constexpr, BT: tl.constexpr):  # fmt: skip
        """y[b, :, strip] = mean over the NB blocks of step 2(step 1(x)); W [NB, 2, KMAX, C, C], bias [NB, 2, C];
        scratch [B * STRIPS, NB, C, 4 * BT]."""
        RW: tl.constexpr = 4 * BT
        strip, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
        n_tiles = tl.cdiv(T, BT)
        j0 = strip * TILES
        j1 = tl.minimum(j0 + TILES, n_tiles)
        ci = tl.arange(0, C)
        tt = tl.arange(0, BT)
        x_row = x_ptr + b * C * T
        y_row = y_ptr + b * C * T
        m_row = m_ptr + b * T
        ring = s_ptr + (b * STRIPS + strip) * NB * C * RW
        WS: tl.constexpr = KMAX * C * C  # one step's weights
        for j in range(j0 - 1, j1 + 1):
            if (j >= 0) & (j < n_tiles):
                t = j * BT + tt
                _first(x_row, ring, w_ptr, b_ptr, m_row, t, T, ci, C, K0, D00, SLOPE, HAS_MASK, RW, BT)
                if NB > 1:
                    _first(x_row, ring + C * RW, w_ptr + 2 * WS, b_ptr + 2 * C, m_row, t, T, ci, C, K1, D10, SLOPE,
                           HAS_MASK, RW, BT)  # fmt: skip
                if NB > 2:
                    _first(x_row, ring + 2 * C * RW, w_ptr + 4 * WS, b_ptr + 4 * C, m_row, t, T, ci, C, K2, D20, SLOPE,
                           HAS_MASK, RW, BT)  # fmt: skip
            tl.debug_barrier()  # the tile's first steps are in the rings before any second step reads them
            if j - 1 >= j0:
                t = (j - 1) * BT + tt
                total = tl.zeros((C, BT), dtype=tl.float32)
                total = _second(total, ring, w_ptr + WS, b_ptr + C, m_row, t, T, ci, C, K0, D01, SLOPE, HAS_MASK, RW)
                if NB > 1:
                    total = _second(total, ring + C * RW, w_ptr + 3 * WS, b_ptr + 3 * C, m_row, t, T, ci, C, K1, D11,
                                    SLOPE, HAS_MASK, RW)  # fmt: skip
                if NB > 2:
                    total = _second(total, ring + 2 * C * RW, w_ptr + 5 * WS, b_ptr + 5 * C, m_row, t, T, ci, C, K2,
                                    D21, SLOPE, HAS_MASK, RW)  # fmt: skip
                out = y_row + ci[:, None] * T + t[None, :]
                tl.store(out, (total * (1.0 / NB)).to(y_ptr.dtype.element_ty), mask=(t < T)[None, :])


#: (time steps per tile, num_warps) per channel count (not tuned on a GPU yet).
TILES = {128: (64, 8), 64: (128, 8), 32: (128, 4), 16: (128, 4)}
#: Programs to aim for per launch (strips x rows): enough to fill a large GPU a few times over.
TARGET_PROGRAMS = 1024
#: The fewest tiles a strip walks (each strip computes the first steps of 2 tiles beyond its own).
MIN_STRIP_TILES = 4


class FusedStageStrips:
    """One decoder stage's ``ResBlock2`` blocks (1-3 of them, two steps each; ``supports``) as one
    ``_stage`` launch; holds its own copy of the weights (take it after the last dtype or device
    change). ``slope``: their leaky ReLU's."""

    def __init__(self, blocks: list[torch.nn.Module], slope: float) -> None:
        if triton is None:
            raise RuntimeError("fused stages need triton (it comes with PyTorch's CUDA builds)")
        if not self.supports(blocks):
            raise ValueError("fused stages take 1-3 ResBlock2 blocks of two steps, a power-of-two channel count "
                             "(16-128) and second steps reaching at most one tile")  # fmt: skip
        self.slope = slope
        self.channels = blocks[0].convs[0].in_channels
        self.kernels = [b.convs[0].kernel_size[0] for b in blocks]
        self.dilations = [(b.convs[0].dilation[0], b.convs[1].dilation[0]) for b in blocks]
        kmax = max(self.kernels)
        first = blocks[0].convs[0].weight
        w = first.new_zeros(len(blocks), 2, kmax, self.channels, self.channels)
        for i, block in enumerate(blocks):
            for s, conv in enumerate(block.convs):
                w[i, s, : conv.kernel_size[0]] = tap_major(conv)
        self.weight = w.contiguous()
        self.bias = torch.stack([torch.stack([c.bias.detach() for c in b.convs]) for b in blocks]).contiguous()
        self.kmax = kmax

    @staticmethod
    def supports(blocks: list[torch.nn.Module]) -> bool:
        if not 1 <= len(blocks) <= 3 or not all(hasattr(b, "convs") and len(b.convs) == 2 for b in blocks):
            return False
        c = blocks[0].convs[0].in_channels
        if c not in TILES or any(conv.in_channels != c or conv.out_channels != c for b in blocks for conv in b.convs):
            return False
        bt = TILES[c][0]
        return all((conv.kernel_size[0] - 1) * conv.dilation[0] // 2 <= bt for b in blocks for conv in b.convs)

    def strips(self, batch: int, length: int) -> tuple[int, int]:
        """(tiles per strip, strips per row) for a launch of ``batch`` rows of ``length`` samples."""
        n_tiles = triton.cdiv(length, TILES[self.channels][0])
        per_row = max(1, min(n_tiles // MIN_STRIP_TILES, triton.cdiv(TARGET_PROGRAMS, batch)))
        tiles = triton.cdiv(n_tiles, per_row)
        return tiles, triton.cdiv(n_tiles, tiles)

    def __call__(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x.contiguous()
        batch, channels, length = x.shape
        bt, warps = TILES[channels]
        tiles, strips = self.strips(batch, length)
        n = len(self.kernels)
        scratch = torch.empty(batch * strips, n, channels, 4 * bt, dtype=x.dtype, device=x.device)
        out = torch.empty_like(x)
        k = self.kernels + [1] * (3 - n)
        d = self.dilations + [(1, 1)] * (3 - n)
        _stage[(strips, batch)](x, mask.contiguous() if mask is not None else x, out, scratch, self.weight, self.bias,
                                length, tiles, strips, C=channels, NB=n, KMAX=self.kmax,
                                K0=k[0], D00=d[0][0], D01=d[0][1], K1=k[1], D10=d[1][0], D11=d[1][1],
                                K2=k[2], D20=d[2][0], D21=d[2][1], SLOPE=self.slope, HAS_MASK=mask is not None,
                                BT=bt, num_warps=warps)  # fmt: skip
        return out


__all__ = ["FusedStageStrips", "available"]
