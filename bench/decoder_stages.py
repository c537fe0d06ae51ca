"""GPU: one decoder stage's residual blocks per kernel form, at the shapes of the engine's decode steps.

A Piper "medium"-shaped generator (stages of 128, 64 and 32 channels at 8, 64 and 256 samples per
frame, ``ResBlock2`` blocks of kernels 3, 5, 7) with random fp16 weights (no voice needed: the
kernels' time does not depend on the weights' values), each stage's input at a decode window of
``frames`` x ``batch`` rows with the last fifth masked. Per stage and form, the CUDA graph's replay
ms (median of 20) and the largest difference from the per-step kernels:

* ``per_step``: ``fused_resblock.FusedStage`` (``tts.fused_blocks``: one launch per step, taps unrolled);
* ``per_step_loop``: the same with the taps as a loop (``tts.fused_block_taps = "loop"``: in
  ``fused_resblock.LOOP_TILES``), and in the ``--step-tiles`` given (``per_step_loop_<CO>x<T>w<W>``);
* ``per_step_cl``: the steps time-major (``tts.fused_blocks_channels_last``, with its two transposes);
* ``two_launch``: ``fused_stage.FusedStageSteps`` (``tts.fused_stages``), and in the ``--tiles`` given.

    python -m bench.decoder_stages --hardware h100 --out /tmp/res [--windows 278x64 86x32 76x1] \
        [--step-tiles 32x64x4 64x64x8] [--tiles 32x128x4]
"""

from __future__ import annotations

import argparse
import math

import torch

from bench.gpu_steps import dims, form_bench, time_forms


def voice_shaped_generator():
    from tts_engine.torch_vits.decoder import Generator

    torch.manual_seed(0)
    g = Generator(192, "2", (3, 5, 7), ((1, 2), (2, 6), (3, 12)), (8, 8, 4), 256, (16, 16, 8)).eval()
    for p in g.parameters():
        p.data.normal_(0, 0.05)
    return g.half().cuda()


def per_step_loop(stage, channels: int, tiles: tuple[int, int, int] | None = None):
    """``stage(x, mask)`` with ``fused_resblock.TAP_LOOP`` on (and ``tiles`` for its channel count) while it
    runs (so while a CUDA graph captures it)."""
    from tts_engine.torch_vits import fused_resblock as fr

    def run(x, mask):
        saved = fr.TAP_LOOP, fr.TILES
        fr.TAP_LOOP, fr.TILES = True, {**fr.TILES, **({channels: tiles} if tiles else {})}
        try:
            return stage(x, mask)
        finally:
            fr.TAP_LOOP, fr.TILES = saved

    return run


def label(row: dict) -> str:
    """A row's place on the plot: channels, decode window (frames x rows)."""
    return f"{row['channels']} ch\n{row['frames']} x {row['batch']}"


def stage_rows(windows: list[tuple[int, int]], tiles: list[tuple[int, int, int]],
               step_tiles: list[tuple[int, int, int]]) -> list[dict]:  # fmt: skip
    from tts_engine.torch_vits.decoder import LRELU_SLOPE
    from tts_engine.torch_vits.fused_resblock import FusedStage
    from tts_engine.torch_vits.fused_stage import FusedStageSteps

    g = voice_shaped_generator()
    rows = []
    with torch.inference_mode():
        for frames, batch in windows:
            for i, up in enumerate(g.ups):
                c, length = up.out_channels, frames * math.prod(g.upsample_rates[: i + 1])
                blocks = list(g.resblocks[i * g.num_kernels : (i + 1) * g.num_kernels])
                x = torch.randn(batch, c, length, device="cuda", dtype=torch.half)
                mask = torch.ones(batch, 1, length, device="cuda", dtype=torch.half)
                mask[..., length - length // 5 :] = 0
                row = {"frames": frames, "batch": batch, "channels": c, "samples": length,
                       "tensor_mb": round(x.numel() * 2 / 2**20, 1)}  # fmt: skip
                per_step = FusedStage(blocks, LRELU_SLOPE)
                forms = {"per_step": per_step, "per_step_loop": FusedStage(blocks, LRELU_SLOPE, taps="loop"),
                         "per_step_cl": FusedStage(blocks, LRELU_SLOPE, channels_last=True)}  # fmt: skip
                for co, bt, nw in step_tiles:
                    if co <= c:
                        forms[f"per_step_loop_{co}x{bt}w{nw}"] = per_step_loop(per_step, c, (co, bt, nw))
                steps = FusedStageSteps(blocks, LRELU_SLOPE)
                forms["two_launch"] = steps
                for co, bt, nw in tiles:
                    if co <= c:
                        forms[f"two_launch_{co}x{bt}w{nw}"] = lambda x, m, t=(co, bt, nw): steps(x, m, t)
                time_forms(row, {name: (lambda form=form: form(x, mask)) for name, form in forms.items()})
                rows.append(row)
                print(row, flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", nargs="+", default=["278x64", "86x32", "76x1"], metavar="FRAMESxBATCH",
                   help="decode windows: frames (chunk + context) x rows (default: %(default)s)")
    p.add_argument("--step-tiles", nargs="+", default=[], metavar="COxTxW",
                   help="also the per-step kernels with the taps as a loop in these (channel block, time steps, warps)")
    p.add_argument("--tiles", nargs="+", default=[], metavar="COxTxW",
                   help="also the two-launch kernels in these (channel block, time steps, warps)")

    def measure(args: argparse.Namespace) -> tuple[list[dict], dict]:
        windows, tiles, step_tiles = ([dims(s) for s in specs] for specs in (args.windows, args.tiles, args.step_tiles))
        return stage_rows(windows, tiles, step_tiles), {}

    form_bench(p, argv, "decoder_stages", label, measure)

if __name__ == "__main__":
    main()
