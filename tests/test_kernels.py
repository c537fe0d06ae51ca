"""Each Triton kernel of ``tts_engine/torch_vits/kernels/`` against its plain PyTorch reference beside
it (``<kernel>_ref.py``), in Triton's interpreter on the CPU (float32, small random shapes with masked
tails): what the kernel computes is what its reference says, within float32 rounding.

The kernels inside the model (the decoder, flow, encoder and duration predictor against PyTorch's
modules, the voice's own weights) are ``tests/test_fused_*.py``; on a GPU, in the engine:
``tests/test_gpu_tts.py``.
"""

from __future__ import annotations

import pytest
from triton_interpreter import interpret, needs_triton

pytest.importorskip("torch")
pytestmark = needs_triton

SCRIPT = r"""
import json, sys
import torch
from torch import nn

torch.manual_seed(0)
name = sys.argv[1]
out = {}


def close(got, want):
    got, want = got.float(), want.float()
    return {"diff": float((got - want).abs().max()), "peak": float(want.abs().max())}


def masked(batch, length, cut):
    mask = torch.ones(batch, 1, length)
    mask[1:, :, cut:] = 0
    return mask


if name == "resblock":
    from tts_engine.torch_vits.kernels import fused_resblock, fused_resblock_ref

    x, mask = torch.randn(2, 32, 50), masked(2, 50, 37)
    w, b, prior = torch.randn(5, 32, 32) * 0.2, torch.randn(32) * 0.1, torch.randn(2, 32, 50)
    for residual, accumulate in ((x, True), (None, False)):
        got = fused_resblock.conv_step(x, w, b, 3, mask, residual, prior.clone(), 0.5, accumulate, slope=0.1)
        want = fused_resblock_ref.conv_step(x, w, b, 3, mask, residual, prior.clone(), 0.5, accumulate, slope=0.1)
        out[f"step_residual{residual is not None}"] = close(got, want)
elif name == "ffn":
    from tts_engine.torch_vits.kernels import fused_ffn, fused_ffn_ref

    x, mask = torch.randn(2, 24, 40), masked(2, 40, 29)
    w, b = torch.randn(40, 3 * 24) * 0.2, torch.randn(40) * 0.1
    for relu in (True, False):  # past a sentence's end nothing reads the output (the kernel may skip it)
        out[f"conv_relu{relu}"] = close(fused_ffn.conv(x, mask, w, b, 3, 1, relu, "ieee") * mask,
                                        fused_ffn_ref.conv(x, mask, w, b, 3, 1, relu) * mask)
    bias = torch.randn(24)
    out["stack_taps"] = close(fused_ffn.stack_taps(x, mask, 3, 1, bias), fused_ffn_ref.stack_taps(x, mask, 3, 1, bias))
elif name == "flow":
    from tts_engine.torch_vits.flow import WaveNet
    from tts_engine.torch_vits.kernels import fused_flow, fused_flow_ref

    net = WaveNet(64, 5, 2, 3).eval()
    for p in net.parameters():
        p.data.normal_(0, 0.1)
    x, mask = torch.randn(2, 64, 30), masked(2, 30, 21)
    fused = fused_flow.FusedWaveNet(net)
    out["wavenet"] = close(fused(x * mask, mask), fused_flow_ref.wavenet(x * mask, mask, fused.layers, 64))
elif name == "upsample":
    from tts_engine.torch_vits.decoder import PolyphaseUp
    from tts_engine.torch_vits.kernels import fused_upsample, fused_upsample_ref

    x, mask = torch.randn(2, 32, 12), masked(2, 12, 9)
    pre = nn.Conv1d(32, 32, 7, padding=3)
    out["conv"] = close(fused_upsample.FusedRows.from_conv(pre, 0.1)(x, mask),
                        fused_upsample_ref.conv(x, mask, pre.weight, pre.bias, 3, 0.1))
    up = nn.ConvTranspose1d(32, 16, 16, 8, padding=4)
    out["upsample"] = close(fused_upsample.FusedRows.from_polyphase(PolyphaseUp(up), 0.1)(x, mask),
                            fused_upsample_ref.upsample(x, mask, up.weight, up.bias, 8, 4, 0.1))
    post = nn.Conv1d(32, 1, 7, padding=3, bias=False)
    out["conv_out"] = close(fused_upsample.FusedOut(post, 0.01)(x, mask),
                            fused_upsample_ref.conv_out(x, mask, post.weight, None, 0.01))
elif name == "duration":
    from tts_engine.torch_vits.duration import ConvFlow, DDSConv
    from tts_engine.torch_vits.kernels import fused_duration, fused_duration_ref

    dds = DDSConv(24, 3, 3).eval()
    for p in dds.parameters():
        p.data.normal_(0, 0.3)
    x, mask = torch.randn(2, 24, 40), masked(2, 40, 26)
    fused = fused_duration.FusedDDSConv(dds)
    out["dds_conv"] = close(fused(x, mask), fused_duration_ref.dds_conv(x, mask, fused.layers))
    flow = ConvFlow(2, 24, 3, 3, num_bins=10, tail_bound=5.0).eval()
    z, h = torch.randn(2, 2, 40) * 3, torch.randn(2, 29, 40) * 2
    out["spline"] = close(fused_duration.spline_coupling(flow, z, h, mask),
                          fused_duration_ref.spline_coupling(z, h, mask, 10, 24, 5.0))
elif name == "prior":
    from tts_engine.torch_vits.kernels import fused_prior, fused_prior_ref

    m_p, logs_p = torch.randn(3, 16, 9), torch.randn(3, 16, 9) * 0.3
    w_ceil = torch.randint(0, 4, (3, 9)).float()
    noise, scale, slots = torch.randn(3, 16, 48), torch.tensor([0.667, 0.5, 1.0]), torch.tensor([4, 0, 2])
    got, want = torch.zeros(6, 48, 16), torch.zeros(6, 48, 16)
    fused_prior.expand_prior_into(got, slots, m_p, logs_p, w_ceil, scale, noise)
    fused_prior_ref.expand_prior_into(want, slots, m_p, logs_p, w_ceil, scale, noise)
    out["expand"] = close(got, want)
elif name == "attention":
    from tts_engine.torch_vits.kernels import fused_attention, fused_attention_ref

    b, heads, d, t, window = 3, 2, 12, 70, 4
    lengths = torch.tensor([70, 45, 3])
    keep = (torch.arange(t)[None, :] < lengths[:, None]).float()[:, None, :]  # [B, 1, T]
    masked_keys = (keep == 0).unsqueeze(2)  # [B, 1, 1, T]
    q, k, v = (torch.randn(b, heads * d, t) for _ in range(3))
    emb_k, emb_v, bias = torch.randn(2 * window + 1, d) * 0.3, torch.randn(2 * window + 1, d) * 0.3, torch.randn(3 * heads * d)
    for tile in (fused_attention.TILE, "64x64w4-unrolled"):
        got = fused_attention.attention(q, k, v, masked_keys, emb_k, emb_v, heads, window, "ieee", bias, tile)
        want = fused_attention_ref.attention(q, k, v, masked_keys, emb_k, emb_v, heads, window, bias)
        out[f"attention_{tile}"] = close(got, want)
    x, y, norm_bias = torch.randn(2, 40, 30), torch.randn(2, 40, 30), torch.randn(40)
    norm = type("Norm", (), {"channels": 40, "gamma": torch.rand(40) + 0.5, "beta": torch.randn(40), "eps": 1e-5})()
    out["add_norm"] = close(fused_attention.add_norm(x, y, norm_bias, norm),
                            fused_attention_ref.add_norm(x, y, norm_bias, norm.gamma, norm.beta, norm.eps))
print(json.dumps(out))
"""


@pytest.mark.parametrize("kernel", ["resblock", "ffn", "flow", "upsample", "duration", "prior", "attention"])
def test_each_kernel_computes_what_its_reference_computes(kernel):
    r = interpret(SCRIPT, kernel, timeout=600)
    assert r, kernel
    for what, d in r.items():
        assert d["peak"] > 0.01, (what, d)  # the comparison sees something
        assert d["diff"] <= 2e-5 * max(1.0, d["peak"]), (what, d)
