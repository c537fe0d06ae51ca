"""``voxloop trace summarize FILE``: per-stage latency percentiles of a turn trace file (+ PNG)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from pipeline.trace import STAGES
from base.errors import InvalidInput

COLUMNS = ("p50", "p90", "p99")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="summarize per-turn latency traces")
    tsub = p.add_subparsers(dest="trace_command", required=True)
    s = tsub.add_parser("summarize", help="p50/p90/p99 per stage; writes a PNG breakdown")
    s.add_argument("file", type=Path, help="JSON-lines trace file (trace.path in the config)")
    s.add_argument("--png", type=Path, help="plot path (default: FILE with .png)")
    s.add_argument("--status", default="completed", help="turn status to include (default completed; 'all')")
    s.set_defaults(run=run)


def load_turns(path: Path, status: str = "completed") -> list[dict]:
    if not path.is_file():
        raise InvalidInput(f"trace file not found: {path}")
    turns = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            turn = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"{path}:{n}: not JSON ({exc})") from None
        if status == "all" or turn.get("status") == status:
            turns.append(turn)
    return turns


def summarize(turns: list[dict]) -> dict[str, dict[str, float]]:
    """{stage or metric: {p50, p90, p99, n}} in ms relative to the VAD end decision."""
    series: dict[str, list[float]] = {}
    for t in turns:
        for stage, ms in t.get("stages_ms", {}).items():
            series.setdefault(stage, []).append(ms)
        for key in ("processing_ms", "voice_to_voice_ms"):
            if key in t:
                series.setdefault(key, []).append(t[key])
    order = [s for s in STAGES if s in series] + [k for k in ("processing_ms", "voice_to_voice_ms") if k in series]
    return {k: {**{c: round(float(np.percentile(series[k], int(c[1:]))), 1) for c in COLUMNS},
                "n": len(series[k])} for k in order}


def plot(summary: dict[str, dict[str, float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = [s for s in summary if s in STAGES and s not in ("done",)]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(stages) + 1.5))
    y = np.arange(len(stages))
    for col, alpha in zip(COLUMNS, (0.9, 0.5, 0.25), strict=True):
        ax.barh(y, [summary[s][col] for s in stages], alpha=alpha, label=col)
    ax.set_yticks(y, stages)
    ax.invert_yaxis()
    ax.axvline(0, c="k", lw=0.8)
    ax.set_xlabel("ms after the VAD end decision (negative: speculative work before it)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(args: argparse.Namespace) -> int:
    turns = load_turns(args.file, args.status)
    if not turns:
        raise InvalidInput(f"{args.file}: no turns with status {args.status!r}")
    summary = summarize(turns)
    print(f"{len(turns)} turns from {args.file}  (ms after the VAD end decision)")
    print(f"{'stage':<20}" + "".join(f"{c:>10}" for c in COLUMNS) + f"{'n':>6}")
    for stage, row in summary.items():
        print(f"{stage:<20}" + "".join(f"{row[c]:>10.1f}" for c in COLUMNS) + f"{row['n']:>6}")
    png = args.png or args.file.with_suffix(".png")
    try:
        plot(summary, png, f"voxloop: {len(turns)} turns")
        print(f"plot: {png}")
    except ImportError:
        print("plot skipped: matplotlib is not installed (pip install matplotlib)")
    return 0
