"""Fused Triton residual blocks (``tts_engine/torch_vits/fused_resblock.py``) against PyTorch's.

On a machine without CUDA the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, read
when Triton compiles, hence a fresh process), float32, on a small generator of each block kind
with a masked tail: every index, tap, mask, residual and the mean over blocks is checked.
Skipped where Triton is not installed (PyTorch's CPU builds do not bring it). The same kernels
on a GPU, in fp16 inside the engine: ``tests/test_gpu_tts.py``.
"""

from __future__ import annotations

import pytest
from triton_interpreter import hopper_usage, interpret, needs_triton

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


#: A float32 decoder of the bundled voice's shape (stages of 128, 64 and 32 channels), random weights,
#: two rows with the second's tail masked: ``g``, ``z``, ``mask``.
VOICE_SHAPED = r"""
import torch
from tts_engine.torch_vits import fused_resblock
from tts_engine.torch_vits.decoder import Generator

torch.manual_seed(0)
g = Generator(48, "2", (3, 5, 7), ((1, 2), (2, 6), (3, 12)), (8, 8, 4), 256, (16, 16, 8)).eval()
for p in g.parameters():
    p.data.normal_(0, 0.05)
z = torch.randn(2, 48, 6)
mask = torch.ones(2, 1, 6)
mask[1, :, 4:] = 0
"""

E4M3_SCRIPT = r"""
import json
import numpy as np
""" + VOICE_SHAPED + r"""
def snr(ref, x):
    return float(10 * np.log10((ref ** 2).sum() / max(((ref - x) ** 2).sum(), 1e-30)))

with torch.inference_mode():
    want = g(z, mask)
    g.use_fused_blocks(products="e4m3")
    e4m3 = g(z, mask)
    x = torch.randn(2, 32, 300)  # one step alone: 32 channels, 7 taps, dilation 3
    w = torch.randn(7, 32, 32) * 0.1
    b = torch.randn(32) * 0.1
    ref = fused_resblock.conv_step(x, w, b, 3, None, x, torch.empty_like(x))
    q, s = fused_resblock.quantize_e4m3(w)
    got = fused_resblock.conv_step(x, q, b, 3, None, x, torch.empty_like(x), weight_scale=s)
    snr_step = snr((ref - x).numpy(), (got - x).numpy())
    x[0, :, 100:164] *= 1000  # a loud stretch: each tile's own scale keeps the quiet ones
    loud_ref = fused_resblock.conv_step(x, w, b, 3, None, None, torch.empty_like(x))
    loud = fused_resblock.conv_step(x, q, b, 3, None, None, torch.empty_like(x), weight_scale=s)
    # "high" voices' ResBlock1 (pairs of convolutions); its 16-channel stage keeps PyTorch's
    g1 = Generator(48, "1", (3, 7), ((1, 3, 5), (1, 3, 5)), (4, 4), 64, (8, 8)).eval()
    for p in g1.parameters():
        p.data.normal_(0, 0.05)
    want1 = g1(z, mask)
    g1.use_fused_blocks(products="e4m3")
    e4m3_1 = g1(z, mask)
    stages1 = [st is not None for st in g1.fused]
refused = []
for kwargs in ({"weight": q}, {"weight": w, "weight_scale": s}):
    try:
        fused_resblock.conv_step(x, kwargs["weight"], b, 3, None, None, torch.empty_like(x),
                                 weight_scale=kwargs.get("weight_scale"))
    except ValueError:
        refused.append(True)
print(json.dumps({"snr_generator": snr(want.numpy(), e4m3.numpy()), "snr_step": snr_step,
                  "snr_quiet_after_loud": snr(loud_ref[..., 256:].numpy(), loud[..., 256:].numpy()),
                  "snr_resblock1": snr(want1.numpy(), e4m3_1.numpy()), "stages_resblock1": stages1,
                  "refused": refused, "q_dtype": str(q.dtype), "scale_shape": list(s.shape),
                  "dequant_err": float((q.float() * s[None, :, None] - w).abs().max() / w.abs().max())}))
"""


def test_fused_blocks_e4m3_products_stay_close_to_float32():
    """FP8 products (``tts.fused_block_products = "e4m3"``) in Triton's interpreter, float32 model: the
    voice-shaped decoder's output and one 7-tap step within the SNR an e4m3 operand allows (3
    mantissa bits: ~22-23 dB here, where the interpreter converts to e4m3 more coarsely than the
    round-to-nearest of PyTorch and the GPU), a ResBlock1 decoder's paired convolutions too (its
    16-channel stage left to PyTorch), quiet tiles after a 1000x louder stretch as close as the rest, weights within half an e4m3 step of their largest, and unscaled e4m3 or scaled float weights refused."""
    r = interpret(E4M3_SCRIPT, timeout=600)
    assert r["q_dtype"] == "torch.float8_e4m3fn" and r["scale_shape"] == [32]
    assert r["dequant_err"] <= 16 / 448 + 1e-6  # half an e4m3 step at the top of the range
    assert r["snr_generator"] >= 18.0 and r["snr_step"] >= 18.0, r
    assert r["snr_quiet_after_loud"] >= 18.0, r
    assert r["stages_resblock1"] == [True, False] and r["snr_resblock1"] >= 18.0, r
    assert r["refused"] == [True, True]


def test_fused_blocks_e4m3_need_32_channels():
    from tts_engine.torch_vits import fused_resblock
    from base.config import FUSED_BLOCK_PRODUCTS, FUSED_BLOCK_TAPS

    assert fused_resblock.PRODUCTS == FUSED_BLOCK_PRODUCTS  # the config's copy (it loads no torch)
    assert fused_resblock.TAPS == FUSED_BLOCK_TAPS

    assert fused_resblock.supports(16) and not fused_resblock.supports(16, "e4m3")
    assert fused_resblock.supports(32, "e4m3") and not fused_resblock.supports(96, "e4m3")


TIME_ROWS_SCRIPT = r"""
import json
""" + VOICE_SHAPED + r"""
out = {}
with torch.inference_mode():
    for products in ("model", "e4m3"):
        g.use_fused_blocks(products=products)
        fused_resblock.TILES = {c: t[:3] for c, t in fused_resblock.TILES.items()}
        channel_rows = g(z, mask)
        fused_resblock.TILES = {c: (*t[:3], True) for c, t in fused_resblock.TILES.items()}
        time_rows = g(z, mask)
        out[products] = float((time_rows - channel_rows).abs().max())
    out["peak"] = float(channel_rows.abs().max())
print(json.dumps(out))
"""


def test_time_rows_tiles_compute_what_channel_rows_tiles_compute():
    """``TILES`` entries with ``time_rows`` (the product as activations^T @ weights^T, so 32-channel
    stages fill 64-row tensor-core products): the voice-shaped decoder's output within float32
    rounding of the channel-rows kernel's, with model and with e4m3 products (a tile's e4m3 scale is
    the same either way)."""
    r = interpret(TIME_ROWS_SCRIPT, timeout=600)
    assert r["peak"] > 0.01
    assert r["model"] < 1e-5 * max(1.0, r["peak"]) and r["e4m3"] < 1e-4 * max(1.0, r["peak"]), r


CHANNELS_LAST_SCRIPT = r"""
import json
""" + VOICE_SHAPED + r"""
out = {}
with torch.inference_mode():
    for products in ("model", "e4m3"):
        g.use_fused_blocks(products=products)
        channel_major = g(z, mask)
        g.use_fused_blocks(products=products, channels_last=True)
        time_major = g(z, mask)
        out[products] = float((time_major - channel_major).abs().max())
        out[products + "_stages"] = [s.channels_last for s in g.fused]
    out["peak"] = float(channel_major.abs().max())
    g.use_fused_blocks(False)
    out["masked"] = float((g(z, mask) - time_major).abs().max())  # e4m3 against PyTorch: the mask still applies
print(json.dumps(out))
"""


def test_channels_last_steps_compute_what_channel_major_steps_compute():
    """``FusedStage(channels_last=True)``: the stage's input transposed to ``[B, T, C]`` once, every step
    reading and writing time-major rows, the output transposed back: the voice-shaped decoder's
    output (a masked tail, all three stages) within float32 rounding of the channel-major kernels',
    with model and with e4m3 products."""
    r = interpret(CHANNELS_LAST_SCRIPT, timeout=600)
    assert r["peak"] > 0.01
    assert r["model_stages"] == [True] * 3 and r["e4m3_stages"] == [True] * 3
    assert r["model"] < 1e-5 * max(1.0, r["peak"]) and r["e4m3"] < 1e-4 * max(1.0, r["peak"]), r


def test_fused_block_kernels_compile_for_hopper():
    """Without a GPU, Triton (with its own ptxas) compiles the residual-step kernel for sm_90 in every
    form: the shipped channel-rows tiles in fp16; with time rows the 32-channel stage's products become
    Hopper's 64-row ``wgmma`` (channel rows leave it on ``mma.sync``, where e4m3 is widened to fp16);
    e4m3 products are ``wgmma`` e4m3 wherever they reach it."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tts_engine.torch_vits import fused_resblock as fr

    def ptx(channels: int, fp8: bool, time_rows: bool, channels_last: bool = False) -> str:
        block_co, block_t, warps = fr.TILES[channels]
        signature = {"x_ptr": "*fp16", "w_ptr": "*fp8e4nv" if fp8 else "*fp16", "ws_ptr": "*fp32", "b_ptr": "*fp16",
                     "m_ptr": "*fp16", "r_ptr": "*fp16", "y_ptr": "*fp16", "T": "i32", "scale": "fp32"}  # fmt: skip
        constants = {"C": channels, "K": 7, "DIL": 3, "SLOPE": 0.1, "BLOCK_CO": block_co, "BLOCK_T": block_t,
                     "HAS_MASK": True, "RESIDUAL": True, "ACCUM": True, "FP8": fp8, "TIME_ROWS": time_rows or channels_last,
                     "CL": channels_last, "TAP_LOOP": False}  # fmt: skip
        signature.update(dict.fromkeys(constants, "constexpr"))
        aligned = {(i,): [["tt.divisibility", 16]] for i in range(7)}  # the pointers, as a launch specializes them
        kernel = triton.compile(ASTSource(fn=fr._conv_step, signature=signature, constexprs=constants, attrs=aligned),
                                target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})  # fmt: skip
        return kernel.asm["ptx"]

    def mma(channels: int, fp8: bool, time_rows: bool) -> set[str]:
        found = set(re.findall(r"\b(wgmma\.mma_async\S*|mma\.sync\S*)", ptx(channels, fp8, time_rows)))
        assert found, "no tensor-core product in the PTX"
        return found

    def only(found: set[str], kind: str, operands: str) -> bool:
        return all(i.startswith(kind) and operands in i for i in found)

    assert only(mma(32, False, False), "mma.sync", ".f16.f16")
    assert only(mma(32, False, True), "wgmma", ".f16.f16")
    assert only(mma(32, True, False), "mma.sync", ".f16.f16")  # e4m3 widened to fp16
    assert only(mma(32, True, True), "wgmma", ".e4m3.e4m3")
    for channels in (64, 128):
        assert only(mma(channels, False, False), "wgmma", ".f16.f16")
        assert only(mma(channels, True, False), "wgmma", ".e4m3.e4m3")
    # channel-major, a tap shifted by its dilation misaligns the tile's rows: most of its loads are
    # 16-bit; time-major (channels_last) every tap's rows are whole aligned channel vectors
    for channels in (32, 64, 128):
        loads = {layout: re.findall(r"\bld\.global\.(\S+)", ptx(channels, False, True, layout == "cl"))
                 for layout in ("cm", "cl")}  # fmt: skip
        narrow = {layout: sum(op == "b16" for op in ops) / len(ops) for layout, ops in loads.items()}
        assert narrow["cm"] > 0.5 and narrow["cl"] < 0.3, (channels, narrow)  # cl: the mask and bias
        assert len(loads["cl"]) < len(loads["cm"]) / 2, channels


STAGES_SCRIPT = r"""
import json
""" + VOICE_SHAPED + r"""
z = torch.randn(2, 48, 7)
mask = torch.ones(2, 1, 7)
mask[1, :, 5:] = 0
out = {}
with torch.inference_mode():
    want = g(z, mask)
    want_unmasked = g(z, None)
    g.use_fused_blocks(stages=True)
    out["kinds"] = [type(s).__name__ for s in g.fused]
    got = g(z, mask)
    out["unmasked"] = float((g(z, None) - want_unmasked).abs().max())
    # a channel block of half the stage's channels: each program its block's rows of every step
    x = torch.randn(2, 128, 40)
    out["half_blocks"] = float((g.fused[0](x, mask.repeat_interleave(8, 2)[..., :40], tiles=(64, 16, 4))
                                - g.fused[0](x, mask.repeat_interleave(8, 2)[..., :40])).abs().max())
    g.use_fused_blocks(stages=True, products="e4m3")
    out["e4m3_kinds"] = [type(s).__name__ for s in g.fused]
    g1 = Generator(48, "1", (3, 7), ((1, 3, 5), (1, 3, 5)), (4, 4), 64, (8, 8)).eval()
    g1.use_fused_blocks(stages=True)
    out["resblock1_kinds"] = [type(s).__name__ for s in g1.fused]
out.update(diff=float((got - want).abs().max()), peak=float(want.abs().max()),
           masked_matters=float((want - want_unmasked).abs().max()))
print(json.dumps(out))
"""


def test_two_launch_stages_compute_what_pytorch_computes():
    """``Generator.use_fused_blocks(stages=True)`` (``fused_stage``): each stage of the voice-shaped
    decoder as two launches (every block's first step, then every second step and the mean): the
    output within float32 rounding of PyTorch's, masked and not, and the same in channel blocks of
    half the stage; FP8 products and ``ResBlock1`` stages keep the per-step kernels."""
    r = interpret(STAGES_SCRIPT, timeout=900)
    assert r["kinds"] == ["FusedStageSteps"] * 3, r
    assert r["e4m3_kinds"] == ["FusedStage"] * 3 and r["resblock1_kinds"] == ["FusedStage"] * 2
    assert r["peak"] > 0.01 and r["masked_matters"] > 1e-3
    assert r["diff"] < 1e-5 and r["unmasked"] < 1e-5 and r["half_blocks"] < 1e-5, r


TAP_LOOP_SCRIPT = r"""
import json
""" + VOICE_SHAPED + r"""
out = {}
with torch.inference_mode():
    g.use_fused_blocks()
    unrolled = g(z, mask)
    g.use_fused_blocks(taps="loop")  # the loop in LOOP_TILES
    looped = g(z, mask)
    out["taps"] = [s.taps for s in g.fused]
    fused_resblock.TAP_LOOP = True  # the loop in the shipped tiles
    g.use_fused_blocks()
    looped_shipped_tiles = g(z, mask)
out.update(diff=float((looped - unrolled).abs().max()), peak=float(unrolled.abs().max()),
           diff_shipped_tiles=float((looped_shipped_tiles - unrolled).abs().max()))
print(json.dumps(out))
"""


def test_tap_loop_computes_what_the_unrolled_taps_compute():
    """The taps as a loop, one tile in registers at a time (``tts.fused_block_taps = "loop"``, in
    ``LOOP_TILES``; ``fused_resblock.TAP_LOOP`` in the shipped tiles): the voice-shaped decoder's output
    within float32 rounding of the unrolled kernel's (the same products in the same order)."""
    r = interpret(TAP_LOOP_SCRIPT, timeout=600)
    assert r["taps"] == ["loop"] * 3
    assert r["peak"] > 0.01 and r["diff"] < 1e-6 and r["diff_shipped_tiles"] < 1e-6, r


def test_tap_loop_takes_fewer_registers_on_hopper():
    """Why ``TAP_LOOP`` exists: compiled for sm_90 (Triton's own ptxas; its cuobjdump reads the
    registers) as the engine launches it (the time length a multiple of 16: 64 or 256 samples a frame),
    the unrolled 32-channel step in the shipped tile takes more registers a thread than the loop (148
    against 95 with Triton 3.9; neither spills), so fewer of its blocks fit an SM."""
    from tts_engine.torch_vits import fused_resblock as fr

    def usage(loop: bool) -> tuple[int, int]:
        block_co, block_t, warps = fr.TILES[32]
        signature = {"x_ptr": "*fp16", "w_ptr": "*fp16", "ws_ptr": "*fp32", "b_ptr": "*fp16", "m_ptr": "*fp16",
                     "r_ptr": "*fp16", "y_ptr": "*fp16", "T": "i32", "scale": "fp32"}  # fmt: skip
        constants = {"C": 32, "K": 7, "DIL": 3, "SLOPE": 0.1, "BLOCK_CO": block_co, "BLOCK_T": block_t,
                     "HAS_MASK": True, "RESIDUAL": True, "ACCUM": True, "FP8": False, "TIME_ROWS": False, "CL": False,
                     "TAP_LOOP": loop}  # fmt: skip
        # the pointers and T aligned, as the engine's launches
        return hopper_usage(fr._conv_step, signature, constants, list(signature)[:8], warps)

    unrolled, looped = usage(False), usage(True)
    assert looped[1] == 0 and looped[0] <= 200, looped
    assert unrolled[0] > looped[0] + 32, (unrolled, looped)
