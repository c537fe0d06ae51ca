"""The GPU step runner driven by hand: real utterances in every slot, CUDA-event timing, one slot decoded.

Shared by the GPU profile, experiment and INT8 benchmarks (needs torch).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import torch

from tts_engine.torch_vits.runner import EncodeItem, StepRunner


def graphed(fn, *args):
    """Warm up, capture ``fn(*args)`` as a CUDA graph; returns (graph, output)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(*args)
    return g, out


def timed(fn, reps: int) -> float:
    """Median ms of ``fn()`` over ``reps`` runs, CUDA events, after 3 warm-ups."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def dims(spec: str) -> tuple[int, ...]:
    """A bench argument's ``"AxBx..."`` (a shape, a window, a tile) as its integers."""
    return tuple(int(v) for v in spec.split("x"))


def time_forms(row: dict, forms: dict, reps: int = 20) -> None:
    """Each of ``forms`` (name -> a function of no arguments returning one tensor) captured as a CUDA
    graph: ``row["<name>_ms"]`` its replay's median ms over ``reps``, ``row["<name>_max_abs_diff"]`` its
    output's largest difference from the first form's, ``row["<name>_error"]`` where it could not run
    (a tile out of the GPU's resources)."""
    ref = None
    for name, form in forms.items():
        try:
            graph, out = graphed(form)
            row[f"{name}_ms"] = round(timed(graph.replay, reps), 4)
            ref = out.clone() if ref is None else ref
            row[f"{name}_max_abs_diff"] = float((out.float() - ref.float()).abs().max())
        except Exception as exc:
            row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"


def plot_forms(doc_path, label) -> Path:  # noqa: ANN001 - a result file's path, row -> its x label
    """The ``time_forms`` rows of the result file at ``doc_path`` as grouped bars (ms per form, one group
    per row, labelled ``label(row)``), written beside it as ``.png``."""
    import json

    from bench.harness import pyplot, save_png

    doc_path = Path(doc_path)
    doc = json.loads(doc_path.read_text())
    rows = doc["rows"]
    forms = list(dict.fromkeys(k[:-3] for r in rows for k in r if k.endswith("_ms")))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 2), 4.2))
    width = 0.8 / len(forms)
    for i, form in enumerate(forms):
        ax.bar([x + i * width for x in range(len(rows))], [r.get(f"{form}_ms", 0.0) for r in rows], width, label=form)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))], [label(r) for r in rows], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("CUDA graph replay, ms (median)")
    ax.set_title(f"{doc_path.stem} ({doc.get('gpu', doc.get('hardware', ''))})", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    return save_png(fig, doc_path)


def form_bench(parser, argv: list[str] | None, name: str, label, measure) -> None:  # noqa: ANN001
    """The ``main`` of a bench of kernel forms (``time_forms`` rows): adds ``--plot FILE`` (only draw that
    result), ``--hardware`` (required otherwise), ``--date`` and ``--out`` / ``--save`` to ``parser`` and parses
    ``argv``; on a CUDA device ``measure(args)`` -> (rows, extra), written as
    ``<out>/<name>-<hardware>-<date>.json`` with the GPU's name and drawn by ``plot_forms`` (``label``)."""
    from bench.harness import add_output_arguments, report

    parser.add_argument("--plot", type=Path, metavar="FILE", help="only draw FILE (a result of this bench) as its .png")
    parser.add_argument("--hardware", help="hardware name in the result file's name (required unless --plot)")
    parser.add_argument("--date", default=None, help="date in the result file's name (default: today)")
    add_output_arguments(parser)
    args = parser.parse_args(argv)
    if args.plot:
        print("wrote", plot_forms(args.plot, label))
        return
    if not args.hardware:
        parser.error("--hardware is required")
    if not torch.cuda.is_available():
        raise SystemExit(f"{name} times CUDA kernels: no CUDA device here")
    rows, extra = measure(args)
    report(name, rows, {"gpu": torch.cuda.get_device_name(), **extra}, args,
           lambda rows, path: print("wrote", plot_forms(path, label)))  # fmt: skip


def fill_slots(runner: StepRunner, sentences: list[list[int]], noise: bool) -> list[int]:
    """Encode real sentences into every slot; returns their frame counts."""
    n = runner.options.max_slots
    frames = []
    for start in range(0, n, 32):
        items = [
            EncodeItem(sentences[i % len(sentences)], i, 0.667 if noise else 0.0, 1.0, 0.8 if noise else 0.0)
            for i in range(start, min(n, start + 32))
        ]
        frames.extend(int(f) for f in runner.fetch(runner.encode(items))[0])
    return frames


def decode_one(runner: StepRunner, slot: int, frames: int) -> np.ndarray:
    """One slot's utterance through the engine's chunk plan (first chunk, then larger ones), int16."""
    resampler = runner.resampler
    out = np.zeros(resampler.out_samples(frames * runner.geometry.hop_length), np.int16)
    for start, size in runner.options.chunk_plan(frames):
        row = runner.fetch(runner.decode([slot], [start], size))[0][0]
        span = resampler.span(start, min(start + size, frames))
        out[span.start : span.stop] = span.of(row)
    return out


def graph_times(runner: StepRunner, sentences: list[list[int]], batches: tuple[int, ...] = (1, 16, 64),
                reps: int = 20) -> dict[str, float]:
    """Median ms of one replay of each captured graph the scheduler launches most, alone on the GPU:
    the encoder (first fast lane) at each phoneme bucket some of ``sentences`` fall in (its rows
    those sentences, in turn: padded as the engine pads them), the first
    chunk (fast lane) and every later chunk size (main lane), at each of ``batches`` that was captured;
    with ``flow_once`` the main lane's chunks (the decoder alone) as ``flowed b x frames``, each
    packed flow launch as ``flow 1 x frames`` and the chunks decoded ahead (windows with their flow,
    the largest chunk size) as ``decode b x frames``. Inputs are real: ``sentences`` encoded into the slots
    first. Keys ``encode b x ids``, ``first b x frames``, ``decode b x frames``."""
    fill_slots(runner, sentences, noise=True)
    opts, lane = runner.options, runner.fast_lanes[0]
    by_bucket: dict[int, list[list[int]]] = {}
    for s in sentences:
        by_bucket.setdefault(min(b for b in opts.phoneme_buckets if b >= len(s)), []).append(s)
    out: dict[str, float] = {}
    dev = runner.device
    for t, group in sorted(by_bucket.items()):
        for b in batches:
            step = runner.encode_steps.get((b, t, lane))
            if step is None or step.graph is None:
                continue
            ids, lengths, scales, slots, sids = step.inputs
            ids.zero_()
            for i in range(b):
                s = group[i % len(group)]
                ids[i, : len(s)] = torch.tensor(s, device=dev)
                lengths[i] = len(s)
            scales.copy_(torch.tensor([[0.667, 1.0, 0.8]] * b, device=dev))
            slots.copy_(torch.arange(b, device=dev) % opts.max_slots)
            out[f"encode {b} x {t}"] = round(timed(step.graph.replay, reps), 3)
    for b in batches:
        main = "flowed" if opts.flow_once else "decode"
        keys = [(opts.chunk_frames, b, lane, "first")] + [(c, b, "main", main) for c in opts.chunk_sizes]
        if opts.flow_once:  # chunks decoded ahead keep their flow windows: graphs of their own
            keys.append((opts.chunk_sizes[-1], b, "ahead", "decode"))
        for chunk, bb, key_lane, name in keys:
            step = runner.decode_steps.get((chunk, bb, key_lane))
            if step is None or step.graph is None:
                continue
            slots, starts, active = step.inputs
            slots.copy_(torch.arange(bb, device=dev) % opts.max_slots)
            starts.fill_(0 if name == "first" else opts.chunk_frames)
            active.fill_(1)
            out[f"{name} {bb} x {chunk}"] = round(timed(step.graph.replay, reps), 3)
    for frames, step in sorted(runner.flow_steps.items()):
        if step.graph is not None:  # the flow over all of a launch's positions (the inputs it was captured with)
            out[f"flow 1 x {frames}"] = round(timed(step.graph.replay, reps), 3)
    return out
