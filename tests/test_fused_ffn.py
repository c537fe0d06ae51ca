"""The text encoder's fused feed-forward tap stacking (``tts_engine/torch_vits/kernels/fused_ffn.py``) against
``text_encoder.py`` with ``gemm_conv`` convolutions.

On a machine without CUDA the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, read when
Triton compiles, hence a fresh process), float32: a small random encoder with padded rows (its filter
channels not a multiple of the kernel's channel block), whose outputs must be the same bit for bit as
with ``GemmConv1d`` (the same products on the same stacks; PyTorch's elementwise operations in
PyTorch's order), close with ``nn.Conv1d`` weights; and the voice's own encoder on bench sentences.
Skipped where Triton is not installed (PyTorch's CPU builds do not bring it). The same kernel on a
GPU, inside the engine: ``tests/test_gpu_tts.py``.
"""

from __future__ import annotations

import pytest
from triton_interpreter import GEMM_VOICE_PAIR, interpret, needs_triton

torch = pytest.importorskip("torch")

RANDOM = r"""
import copy, json, sys
import torch
from tts_engine.torch_vits.kernels import fused_ffn
from tts_engine.torch_vits.kernels.gemm_conv import use_gemm_convs
from tts_engine.torch_vits.text_encoder import TextEncoder

torch.manual_seed(0)
enc = TextEncoder(40, 24, 24, 40, n_heads=2, n_layers=2, kernel_size=3, window_size=4).eval()
for p in enc.parameters():
    p.data.normal_(0, 0.3)
if sys.argv[1] == "gemm":
    use_gemm_convs(enc)
lengths = torch.tensor([150, 97, 5, 64])  # 150 ids: three time blocks, the last partial
ids = torch.randint(1, 40, (4, 150))
fused = copy.deepcopy(enc)
swapped = fused_ffn.use_fused_ffn(fused)
unmasked = copy.deepcopy(fused)  # the kernel must apply the mask: without it the states change
with torch.inference_mode():
    want, got = enc(ids, lengths), fused(ids, lengths)
    x_u = unmasked.encoder(unmasked.emb(ids).transpose(1, 2) * 24**0.5, torch.ones(4, 1, 150))
valid = want[3].bool().expand_as(want[0])
print(json.dumps({"available": fused_ffn.available(), "swapped": swapped,
                  "equal": [bool(torch.equal(a, b)) for a, b in zip(want, got)],
                  "diff": max(float((a - b).abs().max()) for a, b in zip(want, got)), "peak": float(want[0].abs().max()),
                  "mask_matters": float((x_u - want[0])[valid].abs().max())}))
"""

VOICE = GEMM_VOICE_PAIR + r"""
from tts_engine.torch_vits.kernels import fused_ffn

swapped = fused_ffn.use_fused_ffn(fused.enc_p)
padded, lengths = pad_ids([s["ids"] for s in load_sentences()[:8]], 256)  # the engine's bucket
with torch.inference_mode():
    want, got = model.encode(padded, lengths), fused.encode(padded, lengths)
print(json.dumps({"swapped": swapped, "phonemes": int(want[3].sum()),
                  "equal": [bool(torch.equal(a, b)) for a, b in zip(want, got)]}))
"""


@needs_triton
@pytest.mark.parametrize("convs", ["conv1d", "gemm"])
def test_fused_ffn_computes_what_pytorch_computes(convs):
    r = interpret(RANDOM, convs)
    assert r["available"] and r["swapped"] == 2
    assert r["mask_matters"] > 1e-3 * r["peak"]  # padding and masking change the states: the check sees them
    if convs == "gemm":  # the shipped encoder: the same output, bit for bit
        assert all(r["equal"]), r
    else:  # cuDNN-style weights, now through cuBLAS: another order of the same sums
        assert r["diff"] < 1e-5 * r["peak"], r


@needs_triton
@pytest.mark.slow
def test_fused_ffn_keeps_the_voices_encoder_bit_for_bit():
    r = interpret(VOICE)
    assert r["swapped"] == 6 and r["phonemes"] > 1000
    assert all(r["equal"]), r  # states, prior and mask identical: durations cannot move


PRODUCTS = r"""
import copy, json, sys
import torch
from tts_engine.torch_vits.kernels import fused_ffn
from tts_engine.torch_vits.kernels.gemm_conv import use_gemm_convs
from tts_engine.torch_vits.text_encoder import TextEncoder

products = sys.argv[1]
torch.manual_seed(0)
enc = TextEncoder(40, 24, 24, 40, n_heads=2, n_layers=2, kernel_size=3, window_size=4).eval()
for p in enc.parameters():
    p.data.normal_(0, 0.3)
use_gemm_convs(enc)
lengths = torch.tensor([150, 97, 5, 64, 0])  # three time blocks, the last partial; a padding row
ids = torch.randint(1, 40, (5, 150))
fused = copy.deepcopy(enc)
swapped = fused_ffn.use_fused_ffn(fused, products)
with torch.inference_mode():
    small = fused(ids, lengths)  # 5 rows < MIN_ROWS: cuBLAS's products, bit for bit
    fused_ffn.MIN_ROWS = 1
    want, got = enc(ids, lengths), fused(ids, lengths)

# one convolution alone: NaN where the mask is 0 must not reach the output (read as 0, not multiplied);
# a block of 64 steps all past a row's end stores 0 even where relu(bias) would not be
x = torch.randn(3, 24, 150)
mask = (torch.arange(150)[None, None, :] < torch.tensor([150, 70, 10])[:, None, None]).float()
w, b = torch.randn(40, 72) * 0.2, torch.rand(40) + 0.5
clean = x * mask
poisoned = torch.where(mask.bool(), x, torch.full_like(x, float("nan")))
y = fused_ffn.conv(poisoned, mask, w, b, 3, 1, True, products, fused_ffn.fp16_weight_scale(w))
taps = torch.cat([torch.nn.functional.pad(clean, (1, 1))[:, :, i:i + 150] for i in range(3)], dim=1)
ref = torch.relu(torch.matmul(w, taps) + b[:, None])
computed = mask.clone()
computed[1, :, :128] = 1  # row 1 (70 steps): blocks 0 and 1 computed (relu(bias) past its end), block 2 not
computed[2, :, :64] = 1
print(json.dumps({"swapped": swapped, "products": [m.products for m in fused.modules() if hasattr(m, "products")],
                  "diff": max(float((a - b).abs().max()) for a, b in zip(want, got)), "peak": float(want[0].abs().max()),
                  "small_equal": all(bool(torch.equal(a, b)) for a, b in zip(want, small)), "min_rows": fused_ffn.MIN_ROWS,
                  "finite": bool(torch.isfinite(y).all()),
                  "conv_diff": float(((y - ref) * computed).abs().max()), "conv_peak": float(ref.abs().max()),
                  "skipped_zero": bool((y[computed.expand_as(y) == 0] == 0).all()),
                  "skipped": int((computed == 0).sum())}))
"""


@needs_triton
@pytest.mark.parametrize("products", ["ieee", "tf32x3", "fp16x3"])
def test_triton_products_compute_the_feed_forward_and_skip_padding(products):
    """The Triton convolution (``tts.text_encoder_products``) gives the encoder's states within fp32
    rounding of cuBLAS's (Triton's interpreter multiplies in fp32 whatever ``input_precision`` names,
    but "fp16x3"'s fp16 operands as fp16: one fp16 product alone is off by ~1e-3), reads
    masked inputs as 0 (NaN there does not reach the output) and leaves blocks past a row's end at 0;
    batches under ``MIN_ROWS`` keep cuBLAS's products."""
    r = interpret(PRODUCTS, products)
    assert r["swapped"] == 2 and r["products"] == [products] * 2
    assert r["small_equal"] and r["min_rows"] == 1, r
    assert 0 < r["diff"] < 1e-5 * r["peak"], r  # not cuBLAS's sums (another order), but within fp32 rounding
    assert r["finite"] and r["conv_diff"] < 1e-5 * r["conv_peak"], r
    assert r["skipped"] > 0 and r["skipped_zero"], r


def test_fp16_weight_scale_is_the_power_of_two_that_puts_the_peak_at_1024():
    from tts_engine.torch_vits.kernels import fused_ffn
    from tts_engine.torch_vits.text_encoder import FeedForward

    assert fused_ffn.fp16_weight_scale(torch.tensor([0.3, -0.7])) == 1024.0  # 0.7 x 1024 = 717 <= 1024 < 0.7 x 2048
    assert fused_ffn.fp16_weight_scale(torch.tensor([[2.0, 1.0]])) == 512.0  # exactly the peak
    assert fused_ffn.fp16_weight_scale(torch.tensor([3000.0])) == 0.25
    assert fused_ffn.fp16_weight_scale(torch.zeros(3)) == 1.0
    layer = fused_ffn.FusedFeedForward(FeedForward(8, 16, 3), "fp16x3")
    assert layer.scales == (fused_ffn.fp16_weight_scale(layer.w1), fused_ffn.fp16_weight_scale(layer.w2))


def test_fused_ffn_refuses_what_it_does_not_compute():
    from torch import nn

    from tts_engine.torch_vits.kernels import fused_ffn
    from tts_engine.torch_vits.kernels.gemm_conv import GemmConv1d
    from tts_engine.torch_vits.text_encoder import FeedForward, TextEncoder

    enc = TextEncoder(10, 8, 8, 16, n_heads=2, n_layers=3, kernel_size=3, window_size=2)
    assert fused_ffn.use_fused_ffn(enc.proj) == 0  # nothing to swap there
    assert fused_ffn.use_fused_ffn(enc) == 3
    layer = enc.encoder.ffn_layers[0]
    assert isinstance(layer, fused_ffn.FusedFeedForward) and tuple(layer.w1.shape) == (16, 24)  # tap-major [out, 3 x in]
    ffn = FeedForward(8, 16, 3)
    ffn.conv_1 = GemmConv1d(nn.Conv1d(8, 16, 3, dilation=2))
    with pytest.raises(ValueError, match="plain unpadded"):
        fused_ffn.FusedFeedForward(ffn)
    with pytest.raises(ValueError, match="products must be one of"):
        fused_ffn.FusedFeedForward(FeedForward(8, 16, 3), "fp16")
