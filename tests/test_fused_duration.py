"""Fused Triton kernels of the duration predictor (``tts_engine/torch_vits/kernels/fused_duration.py``)
against ``duration.py``.

On a machine without CUDA the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, read
when Triton compiles, hence a fresh process), float32: a small random predictor with padded rows
(every tap, dilation, LayerNorm, GELU, mask and spline bin), and the voice's own predictor on
bench sentences, whose frames per phoneme must not change. Skipped where Triton is not installed
(PyTorch's CPU builds do not bring it). The same kernels on a GPU, inside the engine:
``tests/test_gpu_tts.py``.
"""

from __future__ import annotations

import pytest
from triton_interpreter import VOICE_MODEL, interpret, needs_triton

pytest.importorskip("torch")
pytestmark = needs_triton

RANDOM = r"""
import copy, json, sys
import torch
from tts_engine.torch_vits.kernels import fused_duration
from tts_engine.torch_vits.duration import StochasticDurationPredictor
from tts_engine.torch_vits.kernels.gemm_conv import use_gemm_convs

torch.manual_seed(0)
dp = StochasticDurationPredictor(24, 20, 3, n_flows=4).eval()  # 20 channels: not a power of two
for p in dp.parameters():
    p.data.normal_(0, 0.3)
if sys.argv[1] == "gemm":
    use_gemm_convs(dp)
x = torch.randn(3, 24, 37)
mask = torch.ones(3, 1, 37)
mask[1, :, 20:] = 0
mask[2, :, 5:] = 0
# wide enough that some values fall outside the spline's bound; laid out time-major (as noise drawn
# like a slice of the states can be): the kernels must not assume their inputs' layout
noise = torch.randn(3, 37, 2).transpose(1, 2) * 2.0
with torch.inference_mode():
    want = dp(x, mask, noise)
    unmasked = dp(x, torch.ones_like(mask), noise)
    fused = copy.deepcopy(dp)
    swapped = fused_duration.use_fused_duration_predictor(fused)
    got = fused(x, mask, noise)
print(json.dumps({"available": fused_duration.available(), "swapped": swapped,
                  "diff": float((got - want).abs().max()), "peak": float(want.abs().max()),
                  "masked_matters": float(((unmasked - want) * mask).abs().max()),
                  "outside": float((noise.abs() > 5.0).float().mean())}))
"""

VOICE = VOICE_MODEL + r"""
from tts_engine.torch_vits.kernels import fused_duration

ids = [s["ids"] for s in load_sentences()[:10]]
padded, lengths = pad_ids(ids)
noise = torch.randn(len(ids), 2, padded.shape[1], generator=torch.Generator().manual_seed(3))
scales = torch.full((len(ids),), 0.8), torch.ones(len(ids))
fused = copy.deepcopy(model)
fused_duration.use_fused_duration_predictor(fused.dp)
with torch.inference_mode():
    x, _, _, mask = model.encode(padded, lengths)
    (w_a, f_a), (w_b, f_b) = (m.durations(x, mask, *scales, noise=noise) for m in (model, fused))
    # one sentence alone, its noise drawn by the predictor (laid out like a slice of the states), as the engine runs it
    one = padded[:1]
    x1, _, _, mask1 = model.encode(one, lengths[:1])
    alone = [m.durations(x1, mask1, torch.zeros(1), torch.ones(1))[1] for m in (model, fused)]
print(json.dumps({"phonemes": int(mask.sum()), "flips": int((w_a != w_b).sum()),
                  "frames_equal": bool(torch.equal(f_a, f_b)), "alone_equal": bool(torch.equal(*alone))}))
"""


@pytest.mark.parametrize("convs", ["conv1d", "gemm"])
def test_fused_duration_predictor_computes_what_pytorch_computes(convs):
    r = interpret(RANDOM, convs)
    assert r["available"] and r["swapped"] == 4
    assert r["peak"] > 1.0 and r["masked_matters"] > 1e-3 and r["outside"] > 0  # the check can see a wrong mask / tail
    assert r["diff"] < 1e-4 * r["peak"], r


@pytest.mark.slow
def test_fused_duration_predictor_keeps_the_voices_durations():
    r = interpret(VOICE)
    assert r["phonemes"] > 1000
    assert r["flips"] == 0 and r["frames_equal"] and r["alone_equal"], r


def test_fused_duration_predictor_refuses_what_it_does_not_compute():
    from tts_engine.torch_vits.kernels import fused_duration
    from tts_engine.torch_vits.duration import StochasticDurationPredictor

    dp = StochasticDurationPredictor(8, 8, 3, n_flows=2)
    dp.flows[-2].half_channels = 2  # a coupling layer of two channels per half
    with pytest.raises(ValueError, match="one channel per half"):
        fused_duration.use_fused_duration_predictor(dp)
