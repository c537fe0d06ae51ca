"""The flow's WaveNet layers as fused Triton kernels (GPU; ``tts.triton_kernels``).

Every chunk the engine decodes first runs the flow (``flow.ResidualCouplingBlock``) over its
window: four coupling layers of a four-layer WaveNet each. In PyTorch one WaveNet layer is
about a dozen kernels — the dilated convolution (cuDNN, with its NCHW <-> NHWC transposes and a
bias add), tanh and sigmoid of two channel slices and their product, the 1x1 convolution and
its bias add, the residual add and mask, the skip sum — on strided slices that PyTorch's
vectorized kernels do not take. Here a layer is two kernels:

* ``_wn_gate``: ``tanh(W_t * x + b_t) * sigmoid(W_s * x + b_s)`` — the dilated convolution's
  two halves as two tensor-core accumulators over the same input tiles, the gate in fp32;
* ``_wn_res_skip``: the 1x1 convolution, again two accumulators (residual and skip rows),
  then ``x = (x + res) * mask`` and ``out (+)= skip`` (the last layer: ``out = (out + rs) * mask``).

The residual stream ``x`` and the skip sum ``out`` stay fp32 between layers (PyTorch's fp16 path
rounds both to fp16 at every layer); the gate's output is rounded to the model's dtype, the
tensor cores' input. Inputs are ``[B, H, T]`` contiguous in the model's dtype; the hidden
channel count must be a multiple of 64 (``supports``). A WaveNet with speaker conditioning
(``cond_layer``) keeps PyTorch's path. Tested against ``flow.py`` in Triton's interpreter on CPU
(``tests/test_fused_flow.py``) and in the engine on a GPU (``tests/test_gpu_tts.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from tts_engine.torch_vits.kernels import available, triton
from tts_engine.torch_vits.kernels.fused_resblock import tap_major

#: Hidden channels per program (rows of each accumulator) and per ``tl.dot`` step.
BLOCK_C = 64
#: (time steps per program, num_warps); not tuned (H200 under load: ~37 us per gate launch).
GATE_TILES = (64, 4)
RES_SKIP_TILES = (64, 4)

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _wn_gate(x_ptr, w_ptr, b_ptr, y_ptr, T, H: tl.constexpr, K: tl.constexpr, DIL: tl.constexpr,
                 BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr):  # fmt: skip
        """y[b, c, t] = tanh(sum_k W[k, c] @ x[b, :, t + k*DIL - pad] + bias[c])
        * sigmoid(sum_k W[k, H + c] @ x[...] + bias[H + c]); W tap-major [K, 2H, H]."""
        pid_t, pid_c, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        x_row = x_ptr + b * H * T
        acc_t = tl.zeros((BLOCK_C, BLOCK_T), dtype=tl.float32)
        acc_s = tl.zeros((BLOCK_C, BLOCK_T), dtype=tl.float32)
        for k in tl.static_range(K):
            ts = t + (k * DIL - (K - 1) * DIL // 2)
            inside = (ts >= 0) & (ts < T)
            for c0 in tl.static_range(0, H, BLOCK_C):
                ci = c0 + tl.arange(0, BLOCK_C)
                xv = tl.load(x_row + ci[:, None] * T + ts[None, :], mask=inside[None, :], other=0.0)
                w_tap = w_ptr + k * 2 * H * H + ci[None, :]
                w_t = tl.load(w_tap + c[:, None] * H)
                w_s = tl.load(w_tap + (H + c)[:, None] * H)
                acc_t += tl.dot(w_t, xv.to(w_t.dtype))
                acc_s += tl.dot(w_s, xv.to(w_s.dtype))
        acc_t += tl.load(b_ptr + c).to(tl.float32)[:, None]
        acc_s += tl.load(b_ptr + H + c).to(tl.float32)[:, None]
        gate = (2.0 / (1.0 + tl.exp(-2.0 * acc_t)) - 1.0) * (1.0 / (1.0 + tl.exp(-acc_s)))
        out = y_ptr + b * H * T + c[:, None] * T + t[None, :]
        tl.store(out, gate.to(y_ptr.dtype.element_ty), mask=(t < T)[None, :])

    @triton.jit
    def _wn_res_skip(a_ptr, w_ptr, b_ptr, x_ptr, m_ptr, xo_ptr, out_ptr, fin_ptr, T, H: tl.constexpr,
                     FIRST: tl.constexpr, LAST: tl.constexpr, BLOCK_C: tl.constexpr,
                     BLOCK_T: tl.constexpr):  # fmt: skip
        """rs = W @ a + bias (W [2H or H, H]); not LAST: xo = (x + rs[:H]) * mask, out (+)= rs[H:];
        LAST: fin = (out + rs) * mask (FIRST: out starts at zero). ``xo`` and ``out`` are fp32."""
        pid_t, pid_c, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        keep = (t < T)[None, :]
        a_row = a_ptr + b * H * T
        acc_r = tl.zeros((BLOCK_C, BLOCK_T), dtype=tl.float32)
        acc_s = tl.zeros((BLOCK_C, BLOCK_T), dtype=tl.float32)
        for c0 in tl.static_range(0, H, BLOCK_C):
            ci = c0 + tl.arange(0, BLOCK_C)
            av = tl.load(a_row + ci[:, None] * T + t[None, :], mask=keep, other=0.0)
            w_r = tl.load(w_ptr + c[:, None] * H + ci[None, :])
            acc_r += tl.dot(w_r, av.to(w_r.dtype))
            if not LAST:
                w_s = tl.load(w_ptr + (H + c)[:, None] * H + ci[None, :])
                acc_s += tl.dot(w_s, av.to(w_s.dtype))
        mask = tl.load(m_ptr + b * T + t, mask=t < T, other=0.0).to(tl.float32)[None, :]
        at = b * H * T + c[:, None] * T + t[None, :]
        acc_r += tl.load(b_ptr + c).to(tl.float32)[:, None]
        if not FIRST:
            prev = tl.load(out_ptr + at, mask=keep, other=0.0).to(tl.float32)
        if LAST:
            total = acc_r if FIRST else prev + acc_r
            tl.store(fin_ptr + at, (total * mask).to(fin_ptr.dtype.element_ty), mask=keep)
        else:
            x = tl.load(x_ptr + at, mask=keep, other=0.0).to(tl.float32)
            tl.store(xo_ptr + at, ((x + acc_r) * mask).to(xo_ptr.dtype.element_ty), mask=keep)
            acc_s += tl.load(b_ptr + H + c).to(tl.float32)[:, None]
            skip = acc_s if FIRST else prev + acc_s
            tl.store(out_ptr + at, skip.to(out_ptr.dtype.element_ty), mask=keep)


def supports(wavenet: nn.Module) -> bool:
    """A ``flow.WaveNet`` these kernels compute: no speaker conditioning, hidden channels a multiple
    of ``BLOCK_C``, odd kernel."""
    layer = wavenet.in_layers[0]
    return (not hasattr(wavenet, "cond_layer") and wavenet.hidden_channels % BLOCK_C == 0
            and layer.kernel_size[0] % 2 == 1)  # fmt: skip


class FusedWaveNet:
    """A ``flow.WaveNet``'s layers as ``_wn_gate`` + ``_wn_res_skip`` launches; holds its own copy of
    the weights (take it after the last dtype or device change)."""

    def __init__(self, wavenet: nn.Module) -> None:
        if triton is None:
            raise RuntimeError("the fused flow needs triton (it comes with PyTorch's CUDA builds)")
        if not supports(wavenet):
            raise ValueError("fused flow: a WaveNet with speaker conditioning, or hidden channels not a multiple "
                             f"of {BLOCK_C}, keeps PyTorch's layers")  # fmt: skip
        self.hidden = wavenet.hidden_channels
        self.layers = [
            (tap_major(i), i.bias.detach().contiguous(), i.dilation[0], r.weight.detach()[:, :, 0].contiguous(),
             r.bias.detach().contiguous())
            for i, r in zip(wavenet.in_layers, wavenet.res_skip_layers)
        ]  # fmt: skip

    def __call__(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x`` [B, H, T] (masked) -> the WaveNet's masked skip sum [B, H, T]."""
        x = x.contiguous()
        m = mask.contiguous()
        batch, hidden, length = x.shape
        acts = torch.empty_like(x)
        # the residual stream and the skip sum stay fp32 between layers (PyTorch's fp16 path rounds both)
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        final = torch.empty_like(x)
        gate_t, gate_warps = GATE_TILES
        rs_t, rs_warps = RES_SKIP_TILES
        last = len(self.layers) - 1
        for i, (w_in, b_in, dil, w_rs, b_rs) in enumerate(self.layers):
            grid = (triton.cdiv(length, gate_t), hidden // BLOCK_C, batch)
            _wn_gate[grid](x, w_in, b_in, acts, length, H=hidden, K=w_in.shape[0], DIL=dil, BLOCK_C=BLOCK_C,
                           BLOCK_T=gate_t, num_warps=gate_warps)  # fmt: skip
            x_next = x if i == last else torch.empty(x.shape, dtype=torch.float32, device=x.device)
            grid = (triton.cdiv(length, rs_t), hidden // BLOCK_C, batch)
            _wn_res_skip[grid](acts, w_rs, b_rs, x, m, x_next, out, final, length, H=hidden, FIRST=i == 0,
                               LAST=i == last, BLOCK_C=BLOCK_C, BLOCK_T=rs_t, num_warps=rs_warps)  # fmt: skip
            x = x_next
        return final


def use_fused_flow(flow: nn.Module, on: bool = True) -> int:
    """Give each coupling layer's WaveNet of ``flow`` (a ``flow.ResidualCouplingBlock``) fused kernels
    (``WaveNet.fused``; off: None). Returns how many WaveNets run fused (a WaveNet ``supports`` refuses
    keeps PyTorch's layers)."""
    count = 0
    for module in flow.modules():
        if hasattr(module, "res_skip_layers"):
            module.fused = FusedWaveNet(module) if on and supports(module) else None
            count += module.fused is not None
    return count


__all__ = ["FusedWaveNet", "available", "supports", "use_fused_flow"]
