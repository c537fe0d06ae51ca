"""The flow's WaveNet layers as fused Triton kernels (``tts_engine/torch_vits/kernels/fused_flow.py``)
against ``flow.py``.

On a machine without CUDA the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, read
when Triton compiles, hence a fresh process), float32, on a small flow (hidden 128, kernel 5,
dilation rates 1 and 2, one to three WaveNet layers) with a masked tail: the gate, the residual
and skip rows, the first and last layers' special cases and the mask are all checked.
Skipped where Triton is not installed. The same kernels on a GPU, in fp16 inside the engine:
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
from tts_engine.torch_vits.kernels import fused_flow
from tts_engine.torch_vits.flow import ResidualCouplingBlock

layers, dilation_rate = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
flow = ResidualCouplingBlock(32, 128, 5, dilation_rate, layers, n_flows=2).eval()
for p in flow.parameters():
    p.data.normal_(0, 0.1)
z = torch.randn(2, 32, 37)
mask = torch.ones(2, 1, 37)
mask[1, :, 25:] = 0
z = z * mask
with torch.inference_mode():
    want = flow.reverse(z, mask)
    count = fused_flow.use_fused_flow(flow)
    got = flow.reverse(z, mask)
    fused_flow.use_fused_flow(flow, False)
    again = flow.reverse(z, mask)
print(json.dumps({"available": fused_flow.available(), "count": count, "diff": float((got - want).abs().max()),
                  "peak": float(want.abs().max()), "moved": float((want - z).abs().max()),
                  "off_again": float((again - want).abs().max()), "tail": float(got[1, :, 25:].abs().max())}))
"""


@pytest.mark.parametrize("layers, dilation_rate", [(4, 1), (3, 2), (1, 1)])
def test_fused_flow_computes_what_pytorch_computes(layers, dilation_rate):
    r = interpret(SCRIPT, str(layers), str(dilation_rate), timeout=600)
    assert r["available"] and r["count"] == 2
    assert r["moved"] > 0.1  # the flow changes its input: the check can see a wrong WaveNet
    assert r["diff"] < 1e-4 * max(1.0, r["peak"]), r
    assert r["off_again"] == 0.0 and r["tail"] == 0.0


def test_fused_flow_refuses_what_it_does_not_compute():
    from tts_engine.torch_vits.kernels import fused_flow
    from tts_engine.torch_vits.flow import WaveNet

    assert fused_flow.supports(WaveNet(192, 5, 1, 4))
    assert not fused_flow.supports(WaveNet(96, 5, 1, 4))  # not a multiple of 64 channels
    assert not fused_flow.supports(WaveNet(192, 5, 1, 4, gin_channels=16))  # speaker conditioning
