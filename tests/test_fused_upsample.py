"""The decoder's input, upsampling and output convolutions as fused Triton kernels
(``tts_engine/torch_vits/kernels/fused_upsample.py``) against PyTorch's.

On a machine without CUDA the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, read
when Triton compiles, hence a fresh process), float32, on small generators with a masked tail:
two and three taps per phase, strides 4 and 8, with and without the fused residual blocks,
with speaker conditioning. Skipped where Triton is not installed (PyTorch's CPU builds do not
bring it). The same kernels on a GPU, in fp16 inside the engine: ``tests/test_gpu_tts.py``.
"""

from __future__ import annotations

import pytest
from triton_interpreter import interpret, needs_triton

pytest.importorskip("torch")
pytestmark = needs_triton

SCRIPT = r"""
import json, sys
import torch
from tts_engine.torch_vits.kernels import fused_upsample
from tts_engine.torch_vits.decoder import Generator

kind = sys.argv[1]
torch.manual_seed(0)
gin = 0
if kind == "2":  # Piper "medium"-like: two taps per phase, strides 8, 8, 4
    g = Generator(48, "2", (3, 5, 7), ((1, 2), (2, 6), (3, 12)), (8, 8, 4), 256, (16, 16, 8)).eval()
elif kind == "1":  # three taps per phase (kernel 12, stride 4), 16 channels at the output
    g = Generator(48, "1", (3, 7), ((1, 3, 5), (1, 3, 5)), (4, 4), 64, (12, 8)).eval()
else:  # speaker conditioning, added after the fused input convolution
    gin = 8
    g = Generator(32, "2", (3, 5), ((1, 2), (2, 6)), (4, 2), 64, (8, 4), gin_channels=gin).eval()
for p in g.parameters():
    p.data.normal_(0, 0.05)
c_in = g.conv_pre.in_channels
z = torch.randn(2, c_in, 9)
mask = torch.ones(2, 1, 9)
mask[1, :, 6:] = 0
spk = torch.randn(2, gin, 1) if gin else None
with torch.inference_mode():
    want = g(z, mask, spk)
    want_unmasked = g(z, None, spk)
    on = g.use_fused_upsampling()
    got = g(z, mask, spk)
    unmasked = g(z, None, spk)
    g.use_fused_blocks()
    both = g(z, mask, spk)
    g.use_fused_blocks(False)
    g.use_fused_upsampling(False)
    again = g(z, mask, spk)
print(json.dumps({"available": fused_upsample.available(), "on": on, "shape": list(got.shape),
                  "want_shape": list(want.shape), "diff": float((got - want).abs().max()),
                  "diff_unmasked": float((unmasked - want_unmasked).abs().max()),
                  "diff_both": float((both - want).abs().max()), "off_again": float((again - want).abs().max()),
                  "peak": float(want.abs().max()), "masked_matters": float((want - want_unmasked).abs().max())}))
"""


@pytest.mark.parametrize("kind", ["2", "1", "speaker"])
def test_fused_upsampling_computes_what_pytorch_computes(kind):
    r = interpret(SCRIPT, kind, timeout=600)
    assert r["available"] and r["on"]
    assert r["shape"] == r["want_shape"]
    assert r["peak"] > 0.01 and r["masked_matters"] > 1e-3  # the check can see a wrong mask
    assert r["diff"] < 1e-5 and r["diff_unmasked"] < 1e-5 and r["diff_both"] < 1e-5, r
    assert r["off_again"] == 0.0


def test_fused_upsampling_refuses_what_it_cannot_run():
    import torch
    from torch import nn

    from tts_engine.torch_vits.decoder import Generator, PolyphaseUp
    from tts_engine.torch_vits.kernels.fused_upsample import FusedOut, FusedRows

    assert PolyphaseUp.supports(nn.ConvTranspose1d(64, 32, 8, 4, padding=2)) and FusedRows.takes_inputs(64)
    assert not PolyphaseUp.supports(nn.ConvTranspose1d(64, 32, 7, 4, padding=2))  # kernel not a multiple of the stride
    assert not FusedRows.takes_inputs(24)  # 24 input channels
    assert not FusedRows.supports(nn.ConvTranspose1d(64, 32, 8, 4, padding=2))  # upsampling: through PolyphaseUp
    # an upsampling layer whose input channels the kernel does not take keeps PyTorch's for all layers
    assert Generator(32, "2", (3,), ((1, 2),), (4,), 24, (8,)).use_fused_upsampling() is False
    assert not FusedRows.supports(nn.Conv1d(64, 64, 3, stride=2))
    assert not FusedRows.supports(nn.Conv1d(64, 64, 3, dilation=2))
    assert FusedOut.supports(nn.Conv1d(32, 1, 7, padding=3, bias=False))
    assert not FusedOut.supports(nn.Conv1d(24, 1, 7, padding=3))
    assert not FusedOut.supports(nn.Conv1d(32, 1, 7, padding=2))
    # a decoder with an input convolution the kernel does not take keeps PyTorch's for all layers
    g = Generator(20, "2", (3,), ((1, 2),), (4,), 32, (8,))
    assert g.use_fused_upsampling() is False and g.fused_convs is None
    assert torch.isfinite(g(torch.randn(1, 20, 3))).all()
