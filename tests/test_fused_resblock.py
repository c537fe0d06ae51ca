"""Fused Triton residual blocks (``tts_engine/torch_vits/fused_resblock.py``) against PyTorch's.

On a machine without CUDA the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, read
when Triton compiles, hence a fresh process), float32, on a small generator of each block kind
with a masked tail: every index, tap, mask, residual and the mean over blocks is checked.
Skipped where Triton is not installed (PyTorch's CPU builds do not bring it). The same kernels
on a GPU, in fp16 inside the engine: ``tests/test_gpu_tts.py``.
"""

from __future__ import annotations

import pytest
from triton_interpreter import interpret, needs_triton

pytest.importorskip("torch")
pytestmark = needs_triton

SCRIPT = r"""
import json, sys
import torch
from tts_engine.torch_vits import fused_resblock
from tts_engine.torch_vits.decoder import Generator

kind = sys.argv[1]
torch.manual_seed(0)
if kind == "2":
    g = Generator(48, "2", (3, 5, 7), ((1, 2), (2, 6), (3, 12)), (8, 8, 4), 256, (16, 16, 8)).eval()
elif kind == "mixed":  # stages of 32, 16 and 8 channels: the last keeps PyTorch's convolutions
    g = Generator(48, "2", (3, 5), ((1, 2), (2, 6)), (4, 4, 2), 64, (8, 8, 4)).eval()
else:
    g = Generator(48, "1", (3, 7), ((1, 3, 5), (1, 3, 5)), (4, 4), 64, (8, 8)).eval()
for p in g.parameters():
    p.data.normal_(0, 0.05)
z = torch.randn(2, 48, 9)
mask = torch.ones(2, 1, 9)
mask[1, :, 6:] = 0
with torch.inference_mode():
    want = g(z, mask)
    g.use_fused_blocks()
    fused_stages = [s is not None for s in g.fused]
    got = g(z, mask)
    unmasked = g(z, None)
    g.use_fused_blocks(False)
    want_unmasked = g(z, None)
print(json.dumps({"available": fused_resblock.available(), "diff": float((got - want).abs().max()),
                  "diff_unmasked": float((unmasked - want_unmasked).abs().max()), "peak": float(want.abs().max()),
                  "masked_matters": float((want - want_unmasked).abs().max()), "fused_stages": fused_stages}))
"""


@pytest.mark.parametrize("kind", ["2", "1", "mixed"])
def test_fused_blocks_compute_what_pytorch_computes(kind):
    r = interpret(SCRIPT, kind, timeout=600)
    assert r["available"]
    assert r["peak"] > 0.01 and r["masked_matters"] > 1e-3  # the check can see a wrong mask
    assert r["diff"] < 1e-5 and r["diff_unmasked"] < 1e-5, r
    assert r["fused_stages"] == ([True, True, False] if kind == "mixed" else [True] * (3 if kind == "2" else 2))


def test_fused_blocks_refuse_what_they_cannot_run():
    from tts_engine.torch_vits import fused_resblock

    assert fused_resblock.supports(32) and fused_resblock.supports(128)
    assert not fused_resblock.supports(8) and not fused_resblock.supports(96)
