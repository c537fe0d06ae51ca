"""Where a GPU's time goes under load: a kernel timeline from PyTorch's profiler, summarized.

``profile_kernels(fn)`` runs ``fn`` under ``torch.profiler`` (CUDA activity, CUPTI) and returns
``summarize_kernels`` of the kernels it saw: the window from the first kernel's start to the last
one's end, ms; per CUDA stream its kernels, their summed time and the time the stream was busy
(union of its kernels' intervals), ms and % of the window; the time any stream was busy and the
time two or more were (overlap), % of the window; the kernels that took the most time (summed over
streams). Kernels of CUDA graphs are traced as kernels of the stream the graph was launched on.
The profiler itself slows the host side (each launch is traced): figures are for finding where the
GPU idles or what fills it, not throughput.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path


#: Idle gaps shorter than this (µs) are not counted in ``idle_gaps``: launch-to-launch spacing.
GAP_FLOOR_US = 20.0


def _merged(intervals: Iterable[tuple[float, float]]) -> list[list[float]]:
    """The (start, end) intervals merged into disjoint busy spans, in order (touching ones joined)."""
    merged: list[list[float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of (start, end) intervals."""
    return sum(e - s for s, e in _merged(intervals))


def _overlap_us(per_stream: Iterable[list[tuple[float, float]]]) -> float:
    """Time during which intervals of two or more streams run at once (each stream's own merged first)."""
    edges: list[tuple[float, int]] = []
    for intervals in per_stream:
        merged = _merged(intervals)
        edges += [(s, 1) for s, _ in merged] + [(e, -1) for _, e in merged]
    total, depth, last = 0.0, 0, 0.0
    for t, step in sorted(edges, key=lambda x: (x[0], x[1])):  # ends before starts at one instant
        if depth >= 2:
            total += t - last
        depth += step
        last = t
    return total


def _idle_gaps_us(intervals: list[tuple[float, float]], floor_us: float) -> list[float]:
    """Gaps between the merged busy spans of ``intervals`` (any stream) longer than ``floor_us``."""
    spans = _merged(intervals)
    return [b[0] - a[1] for a, b in zip(spans, spans[1:]) if b[0] - a[1] > floor_us]


def summarize_kernels(events: list[dict], top: int = 15) -> dict:
    """Summary of Chrome-trace events (``cat`` "kernel", ``ts``/``dur`` in µs, ``args.stream``)."""
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    if not kernels:
        return {"kernels": 0}
    t0 = min(e["ts"] for e in kernels)
    window = max(e["ts"] + e["dur"] for e in kernels) - t0
    streams: dict[int, list[tuple[float, float]]] = {}
    names: dict[str, list] = {}
    for e in kernels:
        stream = int(e.get("args", {}).get("stream", -1))
        streams.setdefault(stream, []).append((e["ts"], e["ts"] + e["dur"]))
        entry = names.setdefault(e["name"][:120], [0, 0.0, set()])
        entry[0] += 1
        entry[1] += e["dur"]
        entry[2].add(stream)
    total = sum(e["dur"] for e in kernels)
    gaps = _idle_gaps_us([iv for ivs in streams.values() for iv in ivs], GAP_FLOOR_US)

    def pct(us: float) -> float:
        return round(100 * us / window, 1) if window else 0.0

    return {
        "window_ms": round(window / 1000, 2),
        "kernels": len(kernels),
        "kernel_ms": round(total / 1000, 2),
        "busy_pct": pct(_union_us([iv for ivs in streams.values() for iv in ivs])),
        "overlap_pct": pct(_overlap_us(streams.values())),
        # The GPU idle (no stream running a kernel) for longer than GAP_FLOOR_US at a time: how often and how long.
        "idle_gaps": {"floor_us": GAP_FLOOR_US, "count": len(gaps), "ms": round(sum(gaps) / 1000, 2),
                      "mean_us": round(sum(gaps) / len(gaps), 1) if gaps else 0.0,
                      "max_us": round(max(gaps), 1) if gaps else 0.0},
        "streams": {
            str(s): {"kernels": len(ivs), "kernel_ms": round(sum(e - b for b, e in ivs) / 1000, 2),
                     "busy_ms": round(_union_us(ivs) / 1000, 2), "busy_pct": pct(_union_us(ivs))}
            for s, ivs in sorted(streams.items())
        },  # fmt: skip
        "top_kernels": [
            {"kernel": name, "calls": n, "ms": round(us / 1000, 2), "share": round(us / total, 3),
             "streams": sorted(ss)}
            for name, (n, us, ss) in sorted(names.items(), key=lambda kv: -kv[1][1])[:top]
        ],  # fmt: skip
    }


def profile_kernels(fn: Callable[[], object], top: int = 15, keep: Path | None = None) -> tuple[object, dict]:
    """(``fn()``, ``summarize_kernels`` of the CUDA kernels it ran). ``keep``: also write the kernels
    (name, stream, start and duration in µs) there, gzipped JSON, for a closer look."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        result = fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    if keep is not None:
        kernels = [[e["name"][:120], int(e.get("args", {}).get("stream", -1)), e["ts"], e["dur"]]
                   for e in events if e.get("cat") == "kernel" and "dur" in e]
        with gzip.open(keep, "wt") as f:
            json.dump({"columns": ["kernel", "stream", "ts_us", "dur_us"], "kernels": kernels}, f)
    return result, summarize_kernels(events, top)
