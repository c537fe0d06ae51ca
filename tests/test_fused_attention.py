"""The text encoder's fused relative-attention kernel (``tts_engine/torch_vits/fused_attention.py``)
against ``text_encoder.py``.

On a machine without CUDA the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, read
when Triton compiles, hence a fresh process), float32: a small random encoder with padded rows over
several query and key blocks (heads of 12 channels: padded inside the kernel), and the voice's own
encoder on bench sentences, whose frames per phoneme must not change. Skipped where Triton is not
installed (PyTorch's CPU builds do not bring it). The same kernel on a GPU, inside the engine:
``tests/test_gpu_tts.py``.
"""

from __future__ import annotations

import pytest
from triton_interpreter import interpret, needs_triton

pytest.importorskip("torch")

RANDOM = r"""
import copy, json, sys
import torch
from tts_engine.torch_vits import fused_attention
from tts_engine.torch_vits.gemm_conv import use_gemm_convs
from tts_engine.torch_vits.text_encoder import TextEncoder

torch.manual_seed(0)
enc = TextEncoder(40, 24, 24, 48, n_heads=2, n_layers=2, kernel_size=3, window_size=4).eval()
for p in enc.parameters():
    p.data.normal_(0, 0.3)
if sys.argv[1] == "gemm":
    use_gemm_convs(enc)
lengths = torch.tensor([150, 97, 5, 64])  # 150 ids: five query blocks, three key blocks
ids = torch.randint(1, 40, (4, 150))
with torch.inference_mode():
    x_a, m_a, logs_a, mask = enc(ids, lengths)
    fused = copy.deepcopy(enc)
    swapped = fused_attention.use_fused_attention(fused)
    x_b, m_b, logs_b, _ = fused(ids, lengths)
    no_band = copy.deepcopy(fused)  # the relative terms must matter, or the check could not see them wrong
    for layer in no_band.encoder.attn_layers:
        layer.emb_rel_k.zero_()
        layer.emb_rel_v.zero_()
    x_c = no_band(ids, lengths)[0]
valid = mask.bool().expand_as(x_a)
print(json.dumps({"available": fused_attention.available(), "swapped": swapped, "peak": float(x_a.abs().max()),
                  "diff": max(float((a - b)[valid].abs().max()) for a, b in ((x_a, x_b), (m_a, m_b), (logs_a, logs_b))),
                  "band_matters": float((x_a - x_c)[valid].abs().max()),
                  "padded_rows": float(x_b[~valid].abs().max())}))
"""

VOICE = r"""
import copy, json
import torch
from bench.harness import load_sentences
from tts_engine.torch_vits import fused_attention
from tts_engine.torch_vits.gemm_conv import use_gemm_convs
from tts_engine.torch_vits.model import pad_ids
from tts_engine.torch_vits.weights import load_vits
from voxloop import models
from voxloop.config import load_config

model = load_vits(models.resolve_voice(load_config(None, [], environ={})).path)
use_gemm_convs(model.enc_p)
ids = [s["ids"] for s in load_sentences()[:10]]
padded, lengths = pad_ids(ids, 256)  # the engine's bucket: a third of the ids are padding
noise = torch.randn(len(ids), 2, 256, generator=torch.Generator().manual_seed(3))
scales = torch.full((len(ids),), 0.8), torch.ones(len(ids))
fused = copy.deepcopy(model)
swapped = fused_attention.use_fused_attention(fused.enc_p)
with torch.inference_mode():
    outs = [m.encode(padded, lengths) for m in (model, fused)]
    (w_a, f_a), (w_b, f_b) = (m.durations(o[0], o[3], *scales, noise=noise) for m, o in zip((model, fused), outs))
mask = outs[0][3].bool()
print(json.dumps({"swapped": swapped, "phonemes": int(mask.sum()), "flips": int((w_a != w_b).sum()),
                  "frames_equal": bool(torch.equal(f_a, f_b)),
                  "diff": max(float(((a - b) * mask).abs().max()) for a, b in zip(outs[0][:3], outs[1][:3]))}))
"""


@needs_triton
@pytest.mark.parametrize("convs", ["conv1d", "gemm"])
def test_fused_attention_computes_what_pytorch_computes(convs):
    r = interpret(RANDOM, convs)
    assert r["available"] and r["swapped"] == 2
    assert r["band_matters"] > 1e-2 * r["peak"]  # the relative terms change the states: the check sees them
    assert r["diff"] < 1e-5 * max(r["peak"], 1.0), r
    assert r["padded_rows"] < 1e2  # finite (masked later): nothing reads them


@needs_triton
@pytest.mark.slow
def test_fused_attention_keeps_the_voices_durations():
    r = interpret(VOICE)
    assert r["swapped"] == 6 and r["phonemes"] > 1000
    assert r["flips"] == 0 and r["frames_equal"], r
    assert r["diff"] < 1e-4, r


def test_fused_attention_swaps_only_relative_attention():
    import torch

    from tts_engine.torch_vits import fused_attention
    from tts_engine.torch_vits.text_encoder import TextEncoder

    enc = TextEncoder(10, 8, 8, 16, n_heads=2, n_layers=3, kernel_size=3, window_size=2)
    assert fused_attention.use_fused_attention(enc.proj) == 0  # nothing to swap there
    if fused_attention.triton is None:
        pytest.skip("needs triton")
    assert fused_attention.use_fused_attention(enc) == 3
    assert all(isinstance(a, fused_attention.FusedRelativeAttention) for a in enc.encoder.attn_layers)
    layer = enc.encoder.attn_layers[0]
    assert tuple(layer.qkv_weight.shape) == (24, 8) and tuple(layer.emb_rel_k.shape) == (5, 4)  # q, k, v stacked; 2w+1 offsets
    assert isinstance(layer.conv_o, torch.nn.Conv1d)
