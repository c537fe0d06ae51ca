"""GPU: the text encoder's fused attention kernel (``fused_attention._attention``) per tile and band form.

At the shapes of the engine's encoder graphs (``--windows BATCHxPHONEMES``: sentences x phoneme
bucket, each sentence's length drawn between half and all of the bucket), a Piper "medium"-shaped
layer (192 channels in 2 heads of 96, window 4; random fp32 inputs and embeddings: the kernel's time
does not depend on their values), ``tl.dot`` in ``--precision`` (configs/gpu.toml: tf32x3). Per form
``<queries>x<keys>w<warps>-unrolled|loop`` (``RunnerOptions.fused_attention_tile``: queries and keys per block,
the program's warps, the band's ``2 window + 1`` keys unrolled or as a loop): the CUDA graph's replay
ms (median of 50) and the largest difference from the first form's output.

    python -m bench.encoder_attention --hardware h100 --out OUT/ \\
        [--windows 64x192 16x128 4x96 1x64] [--forms 32x32w4-loop 64x64w4-unrolled 16x32w4-loop]
"""

from __future__ import annotations

import argparse

import torch

from bench.gpu_steps import dims, form_bench, time_forms
from tts_engine.torch_vits.kernels.fused_attention import parse_tile

CHANNELS, HEADS, WINDOW = 192, 2, 4


def form_name(form: str) -> str:
    """``--forms``' type: the tile's name, checked (``fused_attention.parse_tile``)."""
    try:
        parse_tile(form)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return form


def label(row: dict) -> str:
    """A row's place on the plot: sentences x phoneme bucket."""
    return f"{row['batch']} x {row['phonemes']}"


def attention_rows(windows: list[tuple[int, int]], forms: list[str], precision: str) -> list[dict]:
    from tts_engine.torch_vits.kernels import fused_attention as fa

    torch.manual_seed(0)
    d = CHANNELS // HEADS
    emb_k, emb_v = (torch.randn(2 * WINDOW + 1, d, device="cuda") * 0.3 for _ in range(2))
    rows = []
    for batch, phonemes in windows:
        lengths = torch.randint(phonemes // 2, phonemes + 1, (batch,), device="cuda")
        masked = (torch.arange(phonemes, device="cuda")[None, :] >= lengths[:, None]).view(batch, 1, 1, phonemes)
        q, k, v = torch.randn(batch, 3 * CHANNELS, phonemes, device="cuda").chunk(3, dim=1)
        bias = torch.randn(3 * CHANNELS, device="cuda") * 0.1
        row = {"batch": batch, "phonemes": phonemes, "mean_length": round(float(lengths.float().mean()), 1)}
        time_forms(row, {form: (lambda form=form: fa.attention(q, k, v, masked, emb_k, emb_v, HEADS, WINDOW, precision,
                                                               bias, form))
                         for form in forms}, reps=50)  # fmt: skip
        rows.append(row)
        print(row, flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", nargs="+", default=["64x192", "16x128", "4x96", "1x64"], metavar="BATCHxPHONEMES",
                   help="sentences x phoneme bucket (default: %(default)s)")
    p.add_argument("--forms", nargs="+", type=form_name, metavar="FORM",
                   default=["32x32w4-loop", "64x64w4-unrolled", "64x64w4-loop", "16x32w4-loop", "16x64w4-loop"],
                   help="<queries>x<keys>w<warps>-unrolled|loop (RunnerOptions.fused_attention_tile); the first is the reference (default: %(default)s)")
    p.add_argument("--precision", default="tf32x3", choices=["tf32x3", "tf32", "ieee"])

    def measure(args: argparse.Namespace) -> tuple[list[dict], dict]:
        windows = [dims(w) for w in args.windows]
        return attention_rows(windows, args.forms, args.precision), {"precision": args.precision}

    form_bench(p, argv, "encoder_attention", label, measure)

if __name__ == "__main__":
    main()
