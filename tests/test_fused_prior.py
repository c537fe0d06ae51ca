"""The prior's expansion as one Triton kernel (``tts_engine/torch_vits/kernels/fused_prior.py``) against
``Vits.expand_prior`` and the transposed copy into the slot latents.

On a machine without CUDA the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, read when
Triton compiles, hence a fresh process), float32: sentences ending inside and past the frames
written, slots out of order, several frame and channel blocks (the last partial), a noise scale per
sentence. The interpreter's exponential is NumPy's, so values are compared to 1e-6 here; on a GPU
(libdevice's ``expf``, as PyTorch's) they must be equal bit for bit: ``tests/test_gpu_tts.py``.
"""

from __future__ import annotations

import pytest
from triton_interpreter import interpret, needs_triton

torch = pytest.importorskip("torch")

SCRIPT = r"""
import json
import torch
from tts_engine.torch_vits.kernels import fused_prior
from tts_engine.torch_vits.model import Vits

torch.manual_seed(0)
b, c, t, f = 3, 70, 20, 100  # 70 channels: two channel blocks, the second partial
m_p, logs_p = torch.randn(b, c, t), torch.randn(b, c, t) * 0.5
w_ceil = torch.randint(0, 4, (b, t)).float()
w_ceil[1] = torch.randint(6, 9, (t,)).float()  # the second sentence runs past the 100 frames written
w_ceil[2, 10:] = 0  # the third ends early: noise only after it
noise, scale = torch.randn(b, c, f), torch.tensor([0.667, 0.0, 1.0])
want = torch.zeros(5, f, c)
slots = torch.tensor([4, 0, 2])
want.index_copy_(0, slots, Vits.expand_prior(m_p, logs_p, w_ceil, f, scale, noise=noise).transpose(1, 2))
got = torch.zeros(5, f, c)
fused_prior.expand_prior_into(got, slots, m_p, logs_p, w_ceil, scale, noise=noise)
ends = w_ceil.sum(1).tolist()
print(json.dumps({"available": fused_prior.available(), "diff": float((got - want).abs().max()),
                  "peak": float(want.abs().max()), "untouched": float(got[[1, 3]].abs().max()),
                  "ends": ends, "tail_is_noise": bool(torch.allclose(got[2, int(ends[2]):], (noise[2] * 1.0).T[int(ends[2]):]))}))
"""


@needs_triton
def test_fused_prior_writes_what_expand_prior_computes():
    r = interpret(SCRIPT)
    assert r["available"]
    assert r["ends"][1] > 100 > r["ends"][0] and r["ends"][2] < 50  # inside, past and well before the frames written
    assert r["tail_is_noise"] and r["untouched"] == 0.0  # past the end: noise; other slots left alone
    assert r["diff"] < 1e-6 * r["peak"], r


def test_fused_prior_needs_channel_contiguous_latents():
    from tts_engine.torch_vits.kernels import fused_prior

    if fused_prior.triton is None:
        pytest.skip("needs triton")
    latents = torch.zeros(2, 8, 4).transpose(1, 2)  # [slots, frames, channels] but frames contiguous
    with pytest.raises(ValueError, match="channels-contiguous"):
        fused_prior.expand_prior_into(latents, torch.tensor([0]), torch.zeros(1, 8, 3), torch.zeros(1, 8, 3),
                                      torch.ones(1, 3), torch.ones(1))
