"""numpy's BLAS threads and the log-mel features on a busy machine.

The ASR (whisper) and the end-of-turn model (smart-turn) compute log-mel features with
faster-whisper's ``FeatureExtractor`` in numpy; its one matrix product (80 mel filters x
spectrogram) goes to numpy's OpenBLAS, which by default runs a pool of one thread per core. On
a server the cores belong to the engines, so that pool mostly waits. This bench measures, per
call, the features of a 3 s utterance (whisper) and of the 8 s window of the end-of-turn model,
in ``--workers`` processes at once while ``--burners`` processes keep cores busy, with
``OPENBLAS_NUM_THREADS`` unset (numpy's default) and = 1 (what ``voxloop serve`` sets), in the
same run, alternating. Writes ``OUT/blas_threads-<hardware>-<date>.json`` and a PNG::

    python -m bench.blas_threads --workers 2 --burners 2 --duration-s 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench.harness import add_common_arguments, pct, pyplot, report, save_png

SAMPLE_RATE = 16000
CASES = {"whisper 3 s utterance": (80, None, 3.0), "end-of-turn 8 s window": (80, 8, 8.0)}
SETTINGS = {"numpy default": None, "OPENBLAS_NUM_THREADS=1": "1"}


def _worker(duration_s: float) -> None:
    """Time the feature extraction of each case for ``duration_s`` s each; print ms per call as JSON."""
    import numpy as np
    from faster_whisper.feature_extractor import FeatureExtractor

    rng = np.random.default_rng(0)
    out = {}
    for name, (mels, chunk, seconds) in CASES.items():
        fe = FeatureExtractor(feature_size=mels, **({"chunk_length": chunk} if chunk else {}))
        audio = (rng.standard_normal(int(seconds * SAMPLE_RATE)) * 0.1).astype(np.float32)
        for _ in range(3):
            fe(audio)
        times = []
        end = time.perf_counter() + duration_s
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            fe(audio)
            times.append((time.perf_counter() - t0) * 1000)
        out[name] = times
    print(json.dumps(out))


def _run(setting: str | None, workers: int, burners: int, duration_s: float) -> dict[str, list[float]]:
    env = dict(os.environ)
    env.pop("OPENBLAS_NUM_THREADS", None)
    if setting is not None:
        env["OPENBLAS_NUM_THREADS"] = setting
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burners)]
    try:
        procs = [subprocess.Popen([sys.executable, "-m", "bench.blas_threads", "--worker", "--duration-s", str(duration_s)],
                                  env=env, stdout=subprocess.PIPE, text=True) for _ in range(workers)]
        results = [json.loads(p.communicate()[0]) for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit(f"a worker failed: exit codes {[p.returncode for p in procs]}")
    finally:
        for s in spin:
            s.kill()
            s.wait()
    return {name: [t for r in results for t in r[name]] for name in CASES}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="processes computing features at once")
    ap.add_argument("--burners", type=int, default=os.cpu_count() or 1, help="processes spinning on a core each")
    ap.add_argument("--duration-s", type=float, default=10.0, help="seconds per case per run")
    ap.add_argument("--rounds", type=int, default=2, help="alternating runs per setting")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    add_common_arguments(ap)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args.duration_s)
        return 0
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for label, setting in SETTINGS.items():
            for case, values in _run(setting, args.workers, args.burners, args.duration_s).items():
                times.setdefault((label, case), []).extend(values)
    rows = []
    for (label, case), values in times.items():
        rows.append({"setting": label, "case": case, "calls": len(values), "ms_p50": round(pct(values, 50), 3),
                     "ms_p90": round(pct(values, 90), 3), "ms_p99": round(pct(values, 99), 3)})
    for case in CASES:
        base, one = (next(r for r in rows if r["setting"] == s and r["case"] == case) for s in SETTINGS)
        one["p50_vs_default"] = round(one["ms_p50"] / base["ms_p50"], 3)
        one["p99_vs_default"] = round(one["ms_p99"] / base["ms_p99"], 3)
    report("blas_threads", rows, {"workers": args.workers, "burners": args.burners, "duration_s": args.duration_s,
                                  "rounds": args.rounds, "load_average_before": os.getloadavg()[0]}, args, _plot)
    return 0


def _plot(rows: list[dict], path) -> None:  # noqa: ANN001
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.5))
    labels = [f"{r['case']}\n{r['setting']}" for r in rows]
    ax.barh(labels, [r["ms_p99"] for r in rows], color="tab:orange", label="p99")
    ax.barh(labels, [r["ms_p50"] for r in rows], color="tab:blue", label="p50")
    ax.set_xlabel("ms per feature extraction")
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend()
    fig.suptitle(f"log-mel features, numpy BLAS threads, {path.stem}")
    save_png(fig, path)


if __name__ == "__main__":
    raise SystemExit(main())
