"""The stochastic duration predictor's elementwise work as fused Triton kernels (GPU;
``tts.triton_kernels``).

The predictor runs in fp32 on every new request: four ``DDSConv`` stacks of three layers
(depthwise convolution, channel LayerNorm, GELU, 1x1 convolution, LayerNorm, GELU, residual)
and three rational-quadratic spline flows. In PyTorch that is ~400 small kernels per encoder
launch, which bound a lone request's latency (a few microseconds each). Here:

* ``_sep_ln_gelu``: ``gelu(LN(depthwise(mask * x) + bias))`` in one pass (the first half of a layer);
* the 1x1 convolution stays one cuBLAS product (``torch.matmul``, no bias);
* ``_bias_ln_gelu_add``: ``x + gelu(LN(z + bias))`` (times the mask after the last layer);
* ``_spline_inverse``: a whole coupling layer's spline (softmax knots, bin search, the
  quadratic's root) and its ``cat(x0, x1) * mask`` in one pass.

Every kernel computes in fp32 what ``duration.py`` computes, in the same order of operations
where one is defined (only reductions — LayerNorm's mean and variance, the softmax's sum, the
knots' cumulative sum — add up in another order), so durations (ceil'd) stay those of the
PyTorch predictor. Inputs are ``[B, C, T]`` float32; any channel count (padded to a power of two
inside a program). Tested against ``duration.py`` in Triton's interpreter on CPU
(``tests/test_fused_duration.py``) and inside the engine on a GPU (``tests/test_gpu_tts.py``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tts_engine.torch_vits.kernels.fused_duration_ref import EDGE_EPS, MIN_BIN_HEIGHT, MIN_BIN_WIDTH, MIN_DERIVATIVE
from tts_engine.torch_vits.kernels import available, triton

#: Time steps per program.
BLOCK_T = 32
SPLINE_BLOCK_T = 64


if triton is not None:
    import triton.language as tl

    @triton.jit
    def _layer_norm_gelu(v, gamma_ptr, beta_ptr, c, cin, C: tl.constexpr, eps):
        """GELU(LayerNorm over axis 0 of ``v`` [BLOCK_C, BLOCK_T]) with rows ``c`` (``cin``: real channels)."""
        mean = tl.sum(tl.where(cin[:, None], v, 0.0), axis=0) / C
        diff = tl.where(cin[:, None], v - mean[None, :], 0.0)
        var = tl.sum(diff * diff, axis=0) / C
        gamma = tl.load(gamma_ptr + c, mask=cin, other=0.0)
        beta = tl.load(beta_ptr + c, mask=cin, other=0.0)
        y = diff * (1.0 / tl.sqrt(var + eps))[None, :] * gamma[:, None] + beta[:, None]
        return 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))

    @triton.jit
    def _sep_ln_gelu(x_ptr, m_ptr, w_ptr, b_ptr, gamma_ptr, beta_ptr, y_ptr, T, eps,
                     C: tl.constexpr, BLOCK_C: tl.constexpr, K: tl.constexpr, DIL: tl.constexpr,
                     BLOCK: tl.constexpr):  # fmt: skip
        """y = gelu(LN(depthwise_conv(x * mask) + bias)); ``w`` [C, K], zero padding (K-1)*DIL/2."""
        pid_t, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
        t = pid_t * BLOCK + tl.arange(0, BLOCK)
        c = tl.arange(0, BLOCK_C)
        cin = c < C
        row = x_ptr + b * C * T
        acc = tl.zeros((BLOCK_C, BLOCK), dtype=tl.float32)
        for k in tl.static_range(K):
            ts = t + (k - (K - 1) // 2) * DIL
            inside = (ts >= 0) & (ts < T)
            xv = tl.load(row + c[:, None] * T + ts[None, :], mask=cin[:, None] & inside[None, :], other=0.0)
            xv = xv * tl.load(m_ptr + b * T + ts, mask=inside, other=0.0)[None, :]
            acc += tl.load(w_ptr + c * K + k, mask=cin, other=0.0)[:, None] * xv
        acc += tl.load(b_ptr + c, mask=cin, other=0.0)[:, None]
        y = _layer_norm_gelu(acc, gamma_ptr, beta_ptr, c, cin, C, eps)
        tl.store(y_ptr + b * C * T + c[:, None] * T + t[None, :], y, mask=cin[:, None] & (t < T)[None, :])

    @triton.jit
    def _bias_ln_gelu_add(z_ptr, b_ptr, gamma_ptr, beta_ptr, x_ptr, m_ptr, out_ptr, T, eps,
                          C: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK: tl.constexpr, MASK_OUT: tl.constexpr):  # fmt: skip
        """out = x + gelu(LN(z + bias)), times the mask when ``MASK_OUT``."""
        pid_t, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
        t = pid_t * BLOCK + tl.arange(0, BLOCK)
        c = tl.arange(0, BLOCK_C)
        cin = c < C
        keep = cin[:, None] & (t < T)[None, :]
        at = b * C * T + c[:, None] * T + t[None, :]
        v = tl.load(z_ptr + at, mask=keep, other=0.0) + tl.load(b_ptr + c, mask=cin, other=0.0)[:, None]
        out = tl.load(x_ptr + at, mask=keep, other=0.0) + _layer_norm_gelu(v, gamma_ptr, beta_ptr, c, cin, C, eps)
        if MASK_OUT:
            out = out * tl.load(m_ptr + b * T + t, mask=t < T, other=0.0)[None, :]
        tl.store(out_ptr + at, out, mask=keep)

    @triton.jit
    def _knots(logits, kin, min_size, spread, bound):
        """Right edges of the K bins [BLOCK, BLOCK_K] from unnormalized sizes (softmax over axis 1)."""
        top = tl.max(tl.where(kin[None, :], logits, -float("inf")), axis=1)
        e = tl.where(kin[None, :], tl.exp(logits - top[:, None]), 0.0)
        sizes = tl.where(kin[None, :], min_size + spread * (e / tl.sum(e, axis=1)[:, None]), 0.0)
        return 2.0 * bound * tl.cumsum(sizes, axis=1) - bound

    @triton.jit
    def _pick(values, kk, at):
        """``values[i, at[i]]`` (one column per row)."""
        return tl.sum(tl.where(kk[None, :] == at[:, None], values, 0.0), axis=1)

    @triton.jit
    def _spline_inverse(h_ptr, z_ptr, m_ptr, out_ptr, T, scale, bound, min_w, spread_w, min_h, spread_h,
                        min_d, tail, edge_eps, K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        """A coupling layer with one channel per half: out = cat(z0, spline^-1(z1 | h * mask)) * mask,
        where ``h`` [B, 3K-1, T] holds the unnormalized widths, heights and inner derivatives."""
        pid_t, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
        t = pid_t * BLOCK + tl.arange(0, BLOCK)
        tin = t < T
        kk = tl.arange(0, BLOCK_K)
        kin = kk < K
        hrow = h_ptr + b * (3 * K - 1) * T
        load2 = tin[:, None] & kin[None, :]
        m = tl.load(m_ptr + b * T + t, mask=tin, other=0.0)
        widths = tl.load(hrow + kk[None, :] * T + t[:, None], mask=load2, other=0.0) * m[:, None] / scale
        heights = tl.load(hrow + (K + kk[None, :]) * T + t[:, None], mask=load2, other=0.0) * m[:, None] / scale
        inner = (kk >= 1) & (kk <= K - 1)  # derivatives at the K+1 knots; the outer two are the tails'
        d_un = tl.load(hrow + (2 * K + kk[None, :] - 1) * T + t[:, None], mask=tin[:, None] & inner[None, :], other=0.0)
        d_un = tl.where(inner[None, :], d_un * m[:, None], tail)
        ex = tl.exp(d_un)  # softplus (PyTorch's: linear above 20), log1p to ~1 ulp
        one = 1.0 + ex
        log1p = tl.where(one == 1.0, ex, tl.log(one) * (ex / tl.where(one == 1.0, 1.0, one - 1.0)))
        deriv = min_d + tl.where(d_un > 20.0, d_un, log1p)
        right_w = tl.where(kk[None, :] == K - 1, bound, _knots(widths, kin, min_w, spread_w, bound))
        right_h = tl.where(kk[None, :] == K - 1, bound, _knots(heights, kin, min_h, spread_h, bound))
        z1 = tl.load(z_ptr + b * 2 * T + T + t, mask=tin, other=0.0)
        inside = (z1 >= -bound) & (z1 <= bound)
        yc = tl.minimum(tl.maximum(z1, -bound), bound)
        # bin: how many inner knots (right edges of bins 0..K-2) lie at or below yc; the top edge
        # (bound + edge_eps) never does
        idx = tl.sum(tl.where((kk[None, :] < K - 1) & (yc[:, None] >= right_h), 1, 0), axis=1)
        idx = idx + tl.where(yc >= bound + edge_eps, 1, 0)
        idx = tl.minimum(idx, K - 1)
        x0 = tl.where(idx == 0, -bound, _pick(right_w, kk, idx - 1))
        y0 = tl.where(idx == 0, -bound, _pick(right_h, kk, idx - 1))
        w = _pick(right_w, kk, idx) - x0
        h = _pick(right_h, kk, idx) - y0
        delta = h / w
        d0 = _pick(deriv, kk, idx)
        d1 = _pick(deriv, kk, idx + 1)
        dy = yc - y0
        slope_sum = d0 + d1 - 2 * delta
        qa = dy * slope_sum + h * (delta - d0)
        qb = h * d0 - dy * slope_sum
        qc = -delta * dy
        disc = tl.maximum(qb * qb - 4 * qa * qc, 0.0)
        theta = (2 * qc) / (-qb - tl.sqrt(disc))
        x1 = tl.where(inside, theta * w + x0, z1)
        tl.store(out_ptr + b * 2 * T + t, tl.load(z_ptr + b * 2 * T + t, mask=tin, other=0.0) * m, mask=tin)
        tl.store(out_ptr + b * 2 * T + T + t, x1 * m, mask=tin)


def _weight(module: nn.Module, rows: int, cols: int) -> torch.Tensor:
    """A convolution's weight (``nn.Conv1d`` or ``gemm_conv.GemmConv1d``) as a contiguous [rows, cols]."""
    return module.weight.detach().reshape(rows, cols).contiguous()


def _bias(module: nn.Module) -> torch.Tensor:
    return module.bias.detach().reshape(-1).contiguous()


class FusedDDSConv(nn.Module):
    """A ``DDSConv`` with fused kernels (same weights); forward as ``DDSConv.forward``."""

    def __init__(self, dds: nn.Module) -> None:
        super().__init__()
        if triton is None:
            raise RuntimeError("fused duration predictor kernels need triton (it comes with PyTorch's CUDA builds)")
        self.layers = []
        for sep, pointwise, norm_1, norm_2 in zip(dds.convs_sep, dds.convs_1x1, dds.norms_1, dds.norms_2):
            channels = norm_1.channels
            kernel = sep.weight.shape[-1]
            dilation = sep.dilation[0] if isinstance(sep.dilation, tuple) else sep.dilation
            self.layers.append((_weight(sep, channels, kernel), _bias(sep), kernel, dilation,
                                norm_1.gamma.detach(), norm_1.beta.detach(), norm_1.eps,
                                _weight(pointwise, channels, channels), _bias(pointwise),
                                norm_2.gamma.detach(), norm_2.beta.detach(), norm_2.eps))  # fmt: skip

    def forward(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        if g is not None:
            x = x + g
        x, mask = x.contiguous(), mask.contiguous()
        batch, channels, length = x.shape
        grid = (triton.cdiv(length, BLOCK_T), batch)
        block_c = triton.next_power_of_2(channels)
        for i, (w_sep, b_sep, kernel, dil, g1, be1, eps1, w_1x1, b_1x1, g2, be2, eps2) in enumerate(self.layers):
            y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
            _sep_ln_gelu[grid](x, mask, w_sep, b_sep, g1, be1, y, length, eps1, C=channels, BLOCK_C=block_c,
                               K=kernel, DIL=dil, BLOCK=BLOCK_T, num_warps=8)  # fmt: skip
            z = torch.matmul(w_1x1, y).contiguous()
            out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
            _bias_ln_gelu_add[grid](z, b_1x1, g2, be2, x, mask, out, length, eps2, C=channels, BLOCK_C=block_c,
                                    BLOCK=BLOCK_T, MASK_OUT=i == len(self.layers) - 1, num_warps=8)  # fmt: skip
            x = out
        return x


def spline_coupling(flow: nn.Module, x: torch.Tensor, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``ConvFlow.reverse``'s spline and output for ``x`` [B, 2, T] and its unmasked projection ``h``
    [B, 3K-1, T] (``num_bins`` K): ``cat(x0, spline^-1(x1)) * mask``."""
    x = x.contiguous()  # the flow's input may come in any layout (e.g. noise drawn like a slice of the states)
    batch, _, length = x.shape
    k = flow.num_bins
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous, whatever x's layout was
    tail = math.log(math.exp(1 - MIN_DERIVATIVE) - 1)
    _spline_inverse[(triton.cdiv(length, SPLINE_BLOCK_T), batch)](
        h.contiguous(), x, mask.contiguous(), out, length, math.sqrt(flow.filter_channels),
        float(flow.tail_bound), MIN_BIN_WIDTH, 1 - MIN_BIN_WIDTH * k, MIN_BIN_HEIGHT, 1 - MIN_BIN_HEIGHT * k,
        MIN_DERIVATIVE, tail, EDGE_EPS, K=k, BLOCK_K=triton.next_power_of_2(k + 1), BLOCK=SPLINE_BLOCK_T,
    )  # fmt: skip
    return out


def use_fused_duration_predictor(dp: nn.Module) -> int:
    """Swap a ``StochasticDurationPredictor``'s DDSConv stacks for ``FusedDDSConv`` and turn on its
    coupling layers' fused spline; returns the number of stacks swapped."""
    flows = [f for f in dp.flows if hasattr(f, "num_bins")]  # duration.ConvFlow: the spline's coupling layers
    for flow in flows:  # checked before anything is swapped
        if flow.half_channels != 1:
            raise ValueError(f"fused spline: one channel per half, got {flow.half_channels}")
    swapped = 0
    for parent in [dp, *flows]:
        if hasattr(parent.convs, "convs_sep"):  # duration.DDSConv
            parent.convs = FusedDDSConv(parent.convs)
            swapped += 1
    for flow in flows:
        flow.fused_spline = spline_coupling
    return swapped


__all__ = ["FusedDDSConv", "available", "spline_coupling", "use_fused_duration_predictor"]
