"""The text encoder's fused relative-position attention (``tts_engine/torch_vits/kernels/fused_attention.py``)
against ``text_encoder.RelativeSelfAttention``.

On a machine without CUDA the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, read when
Triton compiles, hence a fresh process), float32: a small random encoder whose sentences span
several query and key blocks, the last partial, one shorter than the band and one of length 0
(a padding row), and the voice's own encoder on bench sentences in the engine's bucket. Skipped
where Triton is not installed (PyTorch's CPU builds do not bring it). On a GPU, inside the engine:
``tests/test_gpu_tts.py``.
"""

from __future__ import annotations

import pytest
from triton_interpreter import GEMM_VOICE_PAIR, hopper_usage, interpret, needs_triton

torch = pytest.importorskip("torch")

#: A small random text encoder and a batch for it: sentences over several query and key blocks (150:
#: three query blocks, the last partial), one inside the band (3), a padding row (0).
RANDOM_ENCODER = r"""
import copy, json, sys
import torch
from tts_engine.torch_vits.kernels import fused_attention, fused_ffn
from tts_engine.torch_vits.text_encoder import TextEncoder

torch.manual_seed(0)
enc = TextEncoder(40, 24, 24, 40, n_heads=2, n_layers=2, kernel_size=3, window_size=4).eval()
for p in enc.parameters():
    p.data.normal_(0, 0.5)
lengths = torch.tensor([150, 97, 3, 64, 0])
ids = torch.randint(1, 40, (5, 150))
"""

RANDOM = RANDOM_ENCODER + r"""
tile = sys.argv[1]  # the kernel's program (RunnerOptions.fused_attention_tile)
fused = copy.deepcopy(enc)
swapped = fused_attention.use_fused_attention(fused, tile=tile)
with torch.inference_mode():
    want, got = enc(ids, lengths), fused(ids, lengths)
    # one layer alone, on the states where its inputs differ most: valid positions only
    x = torch.randn(5, 24, 150)
    mask = (torch.arange(150)[None, :] < lengths[:, None]).unsqueeze(1).float()
    masked = (mask.unsqueeze(2) * mask.unsqueeze(-1)) == 0
    layer, fused_layer = enc.encoder.attn_layers[0], fused.encoder.attn_layers[0]
    a, b = layer(x, masked), fused_layer(x, masked)
    # without the relative terms the layer's output changes: the check sees them
    plain = copy.deepcopy(fused_layer)
    plain.emb_k.zero_(); plain.emb_v.zero_()
    c = plain(x, masked)
valid = mask.bool().expand_as(a)
print(json.dumps({"available": fused_attention.available(), "swapped": swapped,
                  "diff": max(float((p - q).abs().max()) for p, q in zip(want, got)), "peak": float(want[0].abs().max()),
                  "layer_diff": float((a - b)[valid].abs().max()), "layer_peak": float(a[valid].abs().max()),
                  "relative_matters": float((a - c)[valid].abs().max()),
                  "past_end_zero": bool((b - layer.conv_o.bias.view(1, -1, 1))[~valid].abs().max() == 0)}))
"""

VOICE = GEMM_VOICE_PAIR + r"""
from tts_engine.torch_vits.kernels import fused_attention

swapped = fused_attention.use_fused_attention(fused.enc_p)
padded, lengths = pad_ids([s["ids"] for s in load_sentences()[:6]], 256)  # the engine's bucket
with torch.inference_mode():
    want, got = model.encode(padded, lengths), fused.encode(padded, lengths)
    # durations without noise: the ceil'd frames per phoneme
    w_want = model.durations(want[0], want[3], torch.zeros(6), torch.ones(6), noise=torch.zeros(6, 2, 256))[0]
    w_got = model.durations(got[0], got[3], torch.zeros(6), torch.ones(6), noise=torch.zeros(6, 2, 256))[0]
    # the first layer on its real input, against float64: the kernel's error next to PyTorch's own fp32 error
    enc = model.enc_p
    mask = want[3]
    x = (enc.emb(padded) * enc.hidden_channels ** 0.5).transpose(1, 2) * mask
    masked = (mask.unsqueeze(2) * mask.unsqueeze(-1)) == 0
    layer = enc.encoder.attn_layers[0]
    ref = copy.deepcopy(layer).double()(x.double(), masked).float()
    valid = mask.bool().expand_as(ref)
    eager_err = float((layer(x, masked) - ref)[valid].abs().max())
    fused_err = float((fused.enc_p.encoder.attn_layers[0](x, masked) - ref)[valid].abs().max())
print(json.dumps({"swapped": swapped, "phonemes": int(want[3].sum()),
                  "diff": max(float((a - b).abs().max()) for a, b in zip(want, got)), "peak": float(want[0].abs().max()),
                  "moved": int((w_want != w_got).sum()), "eager_err": eager_err, "fused_err": fused_err}))
"""

NORM = r"""
import json, torch
from tts_engine.torch_vits.kernels import fused_attention
from tts_engine.torch_vits.text_encoder import ChannelLayerNorm

torch.manual_seed(0)
norm = ChannelLayerNorm(192)  # the voices' channels: not a power of two
norm.gamma.data.normal_(1, 0.3)
norm.beta.data.normal_(0, 0.3)
x, y, b = torch.randn(3, 192, 100) * 3, torch.randn(3, 192, 100) * 2, torch.randn(192)
n64 = ChannelLayerNorm(192).double()
n64.load_state_dict(norm.state_dict())
with torch.inference_mode():
    ref = n64(x.double() + (y.double() + b.double()[:, None])).float()
    eager, fused = norm(x + (y + b[:, None])), fused_attention.add_norm(x, y, b, norm)
    no_bias = fused_attention.add_norm(x, y, None, norm) - norm(x + y)
print(json.dumps({"eager_err": float((eager - ref).abs().max()), "fused_err": float((fused - ref).abs().max()),
                  "no_bias": float(no_bias.abs().max())}))
"""


@needs_triton
def test_add_norm_is_the_residual_and_layer_norm_within_fp32():
    """``add_norm`` (bias, residual and the channel LayerNorm in one kernel) against float64, next to
    PyTorch's fp32: as close, with and without a bias."""
    r = interpret(NORM)
    assert 0 < r["fused_err"] <= 2 * r["eager_err"] + 1e-6, r
    assert r["no_bias"] < 1e-5, r


@needs_triton
@pytest.mark.parametrize("form", ["32x32w4-loop", "64x64w4-unrolled", "16x32w4-loop", "32x64w8-loop"])
def test_fused_attention_computes_what_pytorch_computes(form):
    """The encoder with the fused attention gives PyTorch's states within fp32 rounding (another order
    of the softmax's sums), with the relative key and value terms (zeroing them changes the output),
    and positions past a sentence's end left at 0 (the output convolution's bias alone): in the
    default program (``TILE``: 32 x 32, the band's keys as a loop), in the first
    one (64 x 64, the band unrolled) and in others (``bench.encoder_attention`` times them)."""
    r = interpret(RANDOM, form)
    assert r["available"] and r["swapped"] == 2
    assert r["diff"] < 2e-5 * r["peak"], r
    assert r["layer_diff"] < 2e-5 * r["layer_peak"], r
    assert r["relative_matters"] > 1e-2 * r["layer_peak"], r
    assert r["past_end_zero"], r


@needs_triton
@pytest.mark.slow
def test_fused_attention_keeps_the_voices_encoder_and_durations():
    """The voice's encoder on 6 bench sentences in the 256-id bucket: states within 1e-5 of the peak,
    no phoneme's frames moved without noise, and its first layer as close to float64 as PyTorch's fp32."""
    r = interpret(VOICE)
    assert r["swapped"] == 6 and r["phonemes"] > 800
    assert r["diff"] < 1e-5 * r["peak"], r
    assert r["moved"] == 0, r  # no phoneme's frame count moved on these sentences
    # one layer against float64: the kernel is as close as PyTorch's own fp32 (both ~1e-6 of the peak)
    assert 0 < r["fused_err"] <= 2 * r["eager_err"], r


def test_fused_attention_takes_the_text_encoders_products_and_refuses_others():
    """Its products follow ``tts.text_encoder_products`` (fp16x3's scaled split is the feed-forward's:
    the attention takes tf32x3's precision), one entry per setting; unknown ones are refused."""
    from tts_engine.torch_vits.kernels import fused_attention
    from tts_engine.torch_vits.text_encoder import RelativeSelfAttention, TextEncoder
    from base.config import TEXT_ENCODER_PRODUCTS

    assert set(fused_attention.PRECISIONS) == set(TEXT_ENCODER_PRODUCTS)
    assert fused_attention.PRECISIONS["cublas"] == "ieee" and fused_attention.PRECISIONS["fp16x3"] == "tf32x3"
    enc = TextEncoder(40, 24, 24, 40, n_heads=2, n_layers=2, kernel_size=3, window_size=4)
    assert fused_attention.use_fused_attention(enc, "tf32x3") == 2
    assert {m.precision for m in enc.modules() if isinstance(m, fused_attention.FusedRelativeSelfAttention)} == {"tf32x3"}
    with pytest.raises(ValueError, match="products must be one of"):
        fused_attention.FusedRelativeSelfAttention(RelativeSelfAttention(24, 2, 4), "bf16")
    # with the fused feed-forward, in either order (the runner swaps the feed-forward first): both kept
    from tts_engine.torch_vits.kernels import fused_ffn

    for order in ("ffn first", "attention first"):
        enc = TextEncoder(40, 24, 24, 40, n_heads=2, n_layers=2, kernel_size=3, window_size=4)
        steps = [lambda: fused_ffn.use_fused_ffn(enc, "tf32x3"), lambda: fused_attention.use_fused_attention(enc, "tf32x3")]
        for step in steps if order == "ffn first" else steps[::-1]:
            assert step() == 2
        assert isinstance(enc.encoder, fused_attention.FusedEncoder), order
        assert all(isinstance(f, fused_ffn.FusedFeedForward) for f in enc.encoder.ffn_layers), order
    with pytest.raises(ValueError, match="precision must be one of"):
        fused_attention.attention(*[torch.zeros(1, 24, 8)] * 3, torch.zeros(1, 1, 8, 8, dtype=torch.bool),
                                  torch.zeros(9, 12), torch.zeros(9, 12), 2, 4, "bf16")  # fmt: skip


def test_attention_tiles_are_parsed_and_refused_by_the_engine_options():
    """``fused_attention.parse_tile`` takes the kernel's programs and refuses other names, and so does
    ``RunnerOptions.fused_attention_tile``; the engine built from a configuration runs ``TILE``."""
    from tts_engine.torch_vits.kernels.fused_attention import TILE, parse_tile
    from tts_engine.torch_vits.runner import RunnerOptions

    from base.config import load_config

    assert parse_tile(TILE) == (32, 32, 4, False) and parse_tile("64x64w4-unrolled") == (64, 64, 4, True)
    assert RunnerOptions.from_config(load_config("configs/gpu.toml", environ={})).fused_attention_tile == TILE
    assert RunnerOptions(fused_attention_tile="64x64w4-unrolled").fused_attention_tile == "64x64w4-unrolled"
    for bad in ("64x64w4", "64x64w3-loop", "8x64w4-loop", "64x64w4-rolled", "x64w4-loop", "64x64w4-loop-x"):
        with pytest.raises(ValueError, match="an attention tile is"):
            parse_tile(bad)
        with pytest.raises(ValueError, match="an attention tile is"):
            RunnerOptions(fused_attention_tile=bad)


@needs_triton
def test_default_attention_program_spills_less_on_hopper():
    """Why ``TILE`` is 32 x 32 with the band as a loop: compiled for sm_90 (Triton's own ptxas; its
    cuobjdump reads the registers) for the medium voice's layer as the engine launches it (tf32x3, 96
    channels a head, unit time strides, lengths a multiple of 16), the first program (64 x 64, the band's
    nine keys unrolled) spills a stack of kilobytes, the default a few hundred bytes (2824 and 296 with
    Triton 3.9; on an H100 the default took 41-55 % less time, ``bench.encoder_attention``)."""
    from tts_engine.torch_vits.kernels import fused_attention as fa

    def stack(tile: str) -> int:
        block_m, block_n, warps, unroll = fa.parse_tile(tile)
        ints = ("T", "s_b", "s_c", "o_b", "o_c", "m_b")  # multiples of 16 at the engine's phoneme buckets
        pointers = {"q_ptr": "*fp32", "k_ptr": "*fp32", "v_ptr": "*fp32", "bias_ptr": "*fp32", "masked_ptr": "*u8",
                    "ek_ptr": "*fp32", "ev_ptr": "*fp32", "out_ptr": "*fp32"}  # fmt: skip
        constants = {"s_t": 1, "o_t": 1, "m_j": 1, "C": 192, "D": 96, "W": 4, "SCALE": 96**0.5, "PREC": "tf32x3",
                     "HAS_BIAS": True, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_D": 128, "BAND_UNROLL": unroll}  # fmt: skip
        signature = {**pointers, **dict.fromkeys(ints, "i32")}
        return hopper_usage(fa._attention, signature, constants, [*pointers, *ints], warps,
                            num_stages=fa.NUM_STAGES)[1]  # fmt: skip

    first, default = stack("64x64w4-unrolled"), stack(fa.TILE)
    assert first > 1000 and default < first / 4, (first, default)
