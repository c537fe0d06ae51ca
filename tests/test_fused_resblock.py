"""Fused Triton residual blocks (``tts_engine/torch_vits/kernels/fused_resblock.py``) against PyTorch's.

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
from tts_engine.torch_vits.kernels import fused_resblock
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
    stages_fused = [s is not None for s in g.fused]
    got = g(z, mask)
    unmasked = g(z, None)
    g.use_fused_blocks(False)
    want_unmasked = g(z, None)
print(json.dumps({"available": fused_resblock.available(), "diff": float((got - want).abs().max()),
                  "diff_unmasked": float((unmasked - want_unmasked).abs().max()), "peak": float(want.abs().max()),
                  "masked_matters": float((want - want_unmasked).abs().max()), "stages_fused": stages_fused}))
"""


@pytest.mark.parametrize("kind", ["2", "1", "mixed"])
def test_fused_blocks_compute_what_pytorch_computes(kind):
    r = interpret(SCRIPT, kind, timeout=600)
    assert r["available"]
    assert r["peak"] > 0.01 and r["masked_matters"] > 1e-3  # the check can see a wrong mask
    assert r["diff"] < 1e-5 and r["diff_unmasked"] < 1e-5, r
    assert r["stages_fused"] == ([True, True, False] if kind == "mixed" else [True] * (3 if kind == "2" else 2))


def test_fused_blocks_refuse_what_they_cannot_run():
    from tts_engine.torch_vits.kernels import fused_resblock

    assert fused_resblock.supports(32) and fused_resblock.supports(128)
    assert not fused_resblock.supports(8) and not fused_resblock.supports(96)


#: A float32 decoder of the bundled voice's shape (stages of 128, 64 and 32 channels), random weights,
#: two rows with the second's tail masked: ``g``, ``z``, ``mask``.
VOICE_SHAPED = r"""
import torch
from tts_engine.torch_vits.kernels import fused_resblock
from tts_engine.torch_vits.decoder import Generator

torch.manual_seed(0)
g = Generator(48, "2", (3, 5, 7), ((1, 2), (2, 6), (3, 12)), (8, 8, 4), 256, (16, 16, 8)).eval()
for p in g.parameters():
    p.data.normal_(0, 0.05)
z = torch.randn(2, 48, 6)
mask = torch.ones(2, 1, 6)
mask[1, :, 4:] = 0
"""

TIME_ROWS_SCRIPT = r"""
import json
""" + VOICE_SHAPED + r"""
out = {}
with torch.inference_mode():
    g.use_fused_blocks()
    fused_resblock.TILES = {c: t[:3] for c, t in fused_resblock.TILES.items()}
    channel_rows = g(z, mask)
    fused_resblock.TILES = {c: (*t[:3], True) for c, t in fused_resblock.TILES.items()}
    time_rows = g(z, mask)
    out["diff"] = float((time_rows - channel_rows).abs().max())
    out["peak"] = float(channel_rows.abs().max())
print(json.dumps(out))
"""


def test_time_rows_tiles_compute_what_channel_rows_tiles_compute():
    """``TILES`` entries with ``time_rows`` (the product as activations^T @ weights^T, so 32-channel
    stages fill 64-row tensor-core products): the voice-shaped decoder's output within float32
    rounding of the channel-rows kernel's."""
    r = interpret(TIME_ROWS_SCRIPT, timeout=600)
    assert r["peak"] > 0.01
    assert r["diff"] < 1e-5 * max(1.0, r["peak"]), r


def test_fused_block_kernels_compile_for_hopper():
    """Without a GPU, Triton (with its own ptxas) compiles the residual-step kernel for sm_90: the shipped
    channel-rows tiles in fp16 reach Hopper's ``wgmma`` at 64 and 128 channels and ``mma.sync`` at 32;
    with time rows the 32-channel stage's products become the 64-row ``wgmma`` too."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tts_engine.torch_vits.kernels import fused_resblock as fr

    def mma(channels: int, time_rows: bool) -> set[str]:
        block_co, block_t, warps = fr.TILES[channels]
        signature = {"x_ptr": "*fp16", "w_ptr": "*fp16", "b_ptr": "*fp16", "m_ptr": "*fp16", "r_ptr": "*fp16",
                     "y_ptr": "*fp16", "T": "i32", "scale": "fp32"}  # fmt: skip
        constants = {"C": channels, "K": 7, "DIL": 3, "SLOPE": 0.1, "BLOCK_CO": block_co, "BLOCK_T": block_t,
                     "HAS_MASK": True, "RESIDUAL": True, "ACCUM": True, "TIME_ROWS": time_rows}  # fmt: skip
        signature.update(dict.fromkeys(constants, "constexpr"))
        aligned = {(i,): [["tt.divisibility", 16]] for i in range(6)}  # the pointers, as a launch specializes them
        kernel = triton.compile(ASTSource(fn=fr._conv_step, signature=signature, constexprs=constants, attrs=aligned),
                                target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})  # fmt: skip
        found = set(re.findall(r"\b(wgmma\.mma_async\S*|mma\.sync\S*)", kernel.asm["ptx"]))
        assert found, "no tensor-core product in the PTX"
        return found

    def only(found: set[str], kind: str, operands: str) -> bool:
        return all(i.startswith(kind) and operands in i for i in found)

    assert only(mma(32, False), "mma.sync", ".f16.f16")
    assert only(mma(32, True), "wgmma", ".f16.f16")
    for channels in (64, 128):
        assert only(mma(channels, False), "wgmma", ".f16.f16")


def test_unrolled_taps_do_not_spill_on_hopper():
    """The taps unrolled (the shipped form, ``_conv_step``), compiled for sm_90 (Triton's own ptxas; its
    cuobjdump reads the registers) as the engine launches them (the pointers and the time length
    aligned): no spill stack in any shipped tile."""
    from tts_engine.torch_vits.kernels import fused_resblock as fr

    for channels in (32, 64, 128):
        block_co, block_t, warps = fr.TILES[channels]
        signature = {"x_ptr": "*fp16", "w_ptr": "*fp16", "b_ptr": "*fp16", "m_ptr": "*fp16", "r_ptr": "*fp16",
                     "y_ptr": "*fp16", "T": "i32", "scale": "fp32"}  # fmt: skip
        constants = {"C": channels, "K": 7, "DIL": 3, "SLOPE": 0.1, "BLOCK_CO": block_co, "BLOCK_T": block_t,
                     "HAS_MASK": True, "RESIDUAL": True, "ACCUM": True, "TIME_ROWS": False}  # fmt: skip
        registers, spill = hopper_usage(fr._conv_step, signature, constants, list(signature)[:7], warps)
        assert spill == 0 and registers <= 255, (channels, registers, spill)
