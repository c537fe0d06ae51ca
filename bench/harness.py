"""The benchmarks' harness: closed-loop load, percentiles, hardware names, result files, common arguments.

Every benchmark is a module of this package run from the repository root as
``python -m bench.<name>``; they share this module and never import each other.

Result files (JSON with date, hardware and command, a PNG beside it) go to ``--out DIR``, by default
``default_out()`` outside the repository (``OUT/`` in recorded commands); ``--save`` writes them into
``bench/results/`` instead, for a run the docs cite as current (tests/test_results.py: what is there
is cited, within 5 MiB, with no path of the machine that ran it). Commands are recorded as anyone
can repeat them from the repository's root (``portable``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
#: The results the docs cite as current; a run goes there only with ``--save`` (tests/test_results.py).
RESULTS = ROOT / "bench" / "results"
#: Placeholders for user files outside the repository in a recorded command, by suffix.
PLACEHOLDERS = {".onnx": "VOICE.onnx", ".gguf": "MODEL.gguf"}
SENTENCES = ROOT / "bench" / "tts_sentences.json"

# ---------------------------------------------------------------- hardware names


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown-cpu"


def hardware_tag() -> str:
    """Short file-name-safe hardware name, e.g. ``intel-r-xeon-r-processor-2c``."""
    slug = re.sub(r"[^a-z0-9]+", "-", cpu_model().lower()).strip("-")
    return f"{slug[:40]}-{os.cpu_count()}c"


def hardware() -> dict[str, object]:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "machine": platform.machine()}


def cpu_name() -> str:
    """CPU model and core count, e.g. ``Intel(R) Xeon(R) Processor x2``."""
    return f"{cpu_model()} x{os.cpu_count()}"


def gpu_name() -> str:
    """The CUDA device's name, ``none`` without torch or a GPU."""
    try:
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    except ImportError:
        return "none"


# ---------------------------------------------------------------- statistics


def pct(values, q: float) -> float | None:
    """The q-th percentile of ``values`` (None when empty), rounded to 0.1."""
    if len(values) == 0:
        return None
    return round(float(np.percentile(np.asarray(values, dtype=float), q)), 1)


# ---------------------------------------------------------------- the closed loop


def load_sentences() -> list[dict]:
    """The fixed English set of ``bench/tts_sentences.json``: text, frozen espeak-ng ids, audio seconds."""
    return json.loads(SENTENCES.read_text())["sentences"]


def closed_loop(backend, sentences: list[dict], clients: int, duration_s: float, warmup_s: float) -> list[dict]:
    """Run ``clients`` threads for warm-up + ``duration_s``; records of requests started after warm-up.

    Each client calls ``backend.speak(ids) -> (first-audio s, samples, stall s)`` with the next
    sentence as soon as the previous one is done; ``backend.sample_rate`` turns samples into seconds.
    """
    records: list[dict] = []
    lock = threading.Lock()
    t_start = time.perf_counter()
    t_measure, t_end = t_start + warmup_s, t_start + warmup_s + duration_s
    errors: list[BaseException] = []

    def client(index: int) -> None:
        k = 0
        try:
            while time.perf_counter() < t_end:
                sentence = sentences[(index * 13 + k) % len(sentences)]
                k += 1
                t0 = time.perf_counter()
                first, samples, stall = backend.speak(sentence["ids"])
                t1 = time.perf_counter()
                if t0 >= t_measure:
                    with lock:
                        records.append({"start": t0, "end": t1, "first_s": first, "latency_s": t1 - t0,
                                        "audio_s": samples / backend.sample_rate, "stall_s": stall})  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed: {errors[0]!r}") from errors[0]
    return records


class Listening:
    """One clause's chunks as a listener gets them, from ``t0`` (``time.perf_counter()``): first-audio
    delay, samples so far, and stall: how long a listener playing from the first chunk's arrival
    would wait for later chunks (audio gaps), summed, s."""

    def __init__(self, sample_rate: int, t0: float) -> None:
        self.sample_rate, self.t0 = sample_rate, t0
        self.first: float | None = None
        self.samples, self.stall = 0, 0.0

    def chunk(self, now: float, samples: int) -> None:
        """A chunk of ``samples`` arrived at ``now``."""
        if self.first is None:
            self.first = now - self.t0
        else:
            self.stall += max(0.0, now - (self.t0 + self.first + self.stall + self.samples / self.sample_rate))
        self.samples += samples


def closed_loop_sinks(submit, sample_rate: int, sentences: list[dict], clients: int, duration_s: float,
                      warmup_s: float) -> list[dict]:
    """``closed_loop`` with clients that are sinks, not threads: the served path's way of receiving
    (``pipeline/engine_link.py``). ``submit(ids, sink)`` queues one sentence whose outcomes go to
    ``sink(outcomes)`` in bulk per finished launch, on the engine's own thread; a client's sink
    records its finished sentence and queues the client's next one there. No client thread shares
    the engine's interpreter lock; times are hand-outs (when the engine gives a chunk away). The
    clients fall into step (their next sentences are queued at the same instant, so every launch
    carries all of them): the most batched arrival pattern, not spread-out clients'. Records as
    ``closed_loop``'s; raises like it when a request fails.
    """
    from tts_engine.engine import AudioChunk

    records: list[dict] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    finished = threading.Semaphore(0)
    t_start = time.perf_counter()
    t_measure, t_end = t_start + warmup_s, t_start + warmup_s + duration_s

    class Client:
        def __init__(self, index: int) -> None:
            self.index, self.k = index, 0

        def start(self) -> None:
            now = time.perf_counter()
            if now >= t_end:
                finished.release()
                return
            sentence = sentences[(self.index * 13 + self.k) % len(sentences)]
            self.k += 1
            self.heard = Listening(sample_rate, now)
            try:
                submit(sentence["ids"], self.sink)
            except BaseException as exc:  # noqa: BLE001 - reported after the run
                self.fail(exc)

        def fail(self, exc: BaseException) -> None:
            errors.append(exc)
            finished.release()

        def sink(self, outcomes: list) -> None:
            now = time.perf_counter()
            for _, outcome in outcomes:
                if not isinstance(outcome, AudioChunk):
                    self.fail(outcome if isinstance(outcome, BaseException) else RuntimeError("the engine closed"))
                    return
                heard = self.heard
                heard.chunk(now, outcome.num_samples)
                if outcome.final:
                    if heard.t0 >= t_measure:
                        with lock:
                            records.append({"start": heard.t0, "end": now, "first_s": heard.first,
                                            "latency_s": now - heard.t0, "audio_s": heard.samples / sample_rate,
                                            "stall_s": heard.stall})  # fmt: skip
                    self.start()

    for index in range(clients):
        Client(index).start()
    deadline = t_end + 60.0
    for _ in range(clients):
        if not finished.acquire(timeout=max(0.0, deadline - time.perf_counter())):
            raise RuntimeError("closed_loop_sinks: clients still waiting 60 s after the end (a lost outcome?)")
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed: {errors[0]!r}") from errors[0]
    return records


def summarize(records: list[dict], backend, clients: int, hardware: str) -> dict:
    """One result row of a closed-loop level: QPS, audio s/s, first-audio / latency p50/p99 (ms), RTF, stalls."""
    t0 = min(r["start"] for r in records)
    elapsed = max(r["end"] for r in records) - t0
    first = np.array([r["first_s"] for r in records]) * 1000
    lat = np.array([r["latency_s"] for r in records]) * 1000
    audio = np.array([r["audio_s"] for r in records])
    rtf = lat / 1000 / audio
    stall = np.array([r["stall_s"] for r in records if r.get("stall_s") is not None]) * 1000
    peak = backend.peak_vram_mb()
    return {
        "backend": backend.name, "hardware": hardware, "concurrency": clients, "requests": len(records),
        "qps": round(len(records) / elapsed, 2), "audio_seconds_per_second": round(audio.sum() / elapsed, 1),
        "audio_s_per_request": round(float(audio.mean()), 3),
        "first_audio_p50_ms": round(float(np.percentile(first, 50)), 2),
        "first_audio_p99_ms": round(float(np.percentile(first, 99)), 2),
        "latency_p50_ms": round(float(np.percentile(lat, 50)), 2),
        "latency_p99_ms": round(float(np.percentile(lat, 99)), 2),
        "rtf": float(f"{np.percentile(rtf, 50):.3g}"), "rtf_aggregate": float(f"{elapsed / audio.sum():.3g}"),
        # audio gaps a listener would hear between a clause's chunks (engine mode only)
        "stall_p99_ms": round(float(np.percentile(stall, 99)), 1) if len(stall) else None,
        "stalled_pct": round(100 * float(np.mean(stall > 0)), 1) if len(stall) else None,
        "peak_vram_mb": None if peak is None else round(peak, 1), "elapsed_s": round(elapsed, 2), **backend.info,
    }  # fmt: skip


# ---------------------------------------------------------------- client processes


def run_client_processes(target, groups: list[list[int]], args: tuple, timeout_s: float,
                         start_timeout_s: float = 120.0) -> list[tuple[bool, object]]:
    """``target(group, *args, t0)`` in one spawned process per group, all started together.

    Each process loads ``target``'s module, says it is ready, and runs once all are: ``t0`` is
    that shared start on the process's own ``time.monotonic()`` clock. Returns per group
    ``(True, result)``, or ``(False, why)`` for an exception, a process that died or one still
    running after ``timeout_s``. Raises RuntimeError when a process cannot start.
    Spawned, not forked: no inherited threads or models; each client has its own GIL.
    """
    ctx = mp.get_context("spawn")
    out, go, start = ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    procs = [ctx.Process(target=_client_main, args=(target, n, g, args, start, go, out), daemon=True)
             for n, g in enumerate(groups)]
    for p in procs:
        p.start()
    try:
        ready = _collect(out, procs, start_timeout_s)
        failed = [why for ok, why in ready if not ok]
        if failed:
            raise RuntimeError(f"{len(failed)} client process(es) did not start: {failed[0]}")
        start.value = time.time() + 0.5
        go.set()
        return _collect(out, procs, timeout_s)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def _client_main(target, number: int, group: list[int], args: tuple, start, go, out) -> None:
    out.put((number, True, None))  # ready: the target's module is imported
    go.wait()
    t0 = time.monotonic() + start.value - time.time()
    try:
        out.put((number, True, target(group, *args, t0)))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        out.put((number, False, f"{type(exc).__name__}: {exc}"))


def _collect(out, procs: list, timeout_s: float) -> list[tuple[bool, object]]:
    """The next message of every process: (ok, payload); (False, why) for one dead or silent."""
    got: dict[int, tuple[bool, object]] = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < len(procs) and time.monotonic() < deadline:
        # A process dead before this wait had put all it ever would: if nothing came, it died silent.
        dead = [n for n, p in enumerate(procs) if p.exitcode is not None and n not in got]
        try:
            number, ok, payload = out.get(timeout=1.0)
            got[number] = (ok, payload)
        except queue.Empty:
            for n in dead:
                got[n] = (False, f"client process exited ({procs[n].exitcode}) without a result")
    return [got.get(n, (False, f"no result from client process {n} within {timeout_s:g} s"))
            for n in range(len(procs))]


# ---------------------------------------------------------------- arguments and result files


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """``--voice``, ``--hardware``, ``--date``, ``--out``: what every result file is named and made from.

    Read them back with ``common_arguments(args)`` (it resolves the default voice).
    """
    parser.add_argument("--voice", help="Piper .onnx (default: the configured voice, VOXLOOP_TTS__VOICE_PATH or bundled)")
    parser.add_argument("--hardware", default=hardware_tag(), help="hardware name in result file names (default: %(default)s)")
    parser.add_argument("--date", default=dt.date.today().isoformat(), help="date in result file names")
    add_output_arguments(parser)


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """``--out DIR`` (default ``default_out()``, outside the repository) or ``--save`` (``bench/results/``,
    for a run the docs cite): both set ``args.out``."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, default=default_out(),
                       help="folder for the result files (default: $VOXLOOP_BENCH_OUT or %(default)s)")
    where.add_argument("--save", dest="out", action="store_const", const=RESULTS,
                       help="write into bench/results/ instead, to cite the run in the docs")  # fmt: skip


def default_out() -> Path:
    """Where runs go unless saved: ``$VOXLOOP_BENCH_OUT``, else ``<user cache>/voxloop/bench`` (outside the tree)."""
    if os.environ.get("VOXLOOP_BENCH_OUT"):
        return Path(os.environ["VOXLOOP_BENCH_OUT"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "voxloop" / "bench"


def common_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """Fill ``args.voice`` with the configured voice when it was not given; returns ``args``."""
    if args.voice is None:
        args.voice = default_voice()
    return args


#: Environment variables that change what a GPU benchmark measures: named before its command.
RECORDED_ENV = ("CUDNN_", "TORCH_CUDNN", "TORCHINDUCTOR_", "TRITON_", "CUBLAS_", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_LAUNCH_BLOCKING",
                "VOXLOOP_")  # fmt: skip


def command_line() -> str:
    """How this benchmark was started, as anyone can repeat it from the repository's root, e.g.
    ``CUDNN_X=1 python -m bench.tts_load --voice VOICE.onnx --out OUT/`` (variables of ``RECORDED_ENV``
    first; paths made ``portable``)."""
    argv = list(sys.argv)
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        argv[0:1] = ["-m", spec.name]
    env = [f"{k}={portable(v)}" for k, v in sorted(os.environ.items())
           if k.startswith(RECORDED_ENV) and k != "VOXLOOP_BENCH_OUT"]
    return " ".join(shlex.quote(w) for w in [*env, "python", *portable_args(argv)])


def portable_args(argv: Sequence[str]) -> list[str]:
    """Command-line words with their paths made ``portable`` (also in ``--key=PATH`` and
    ``--set=section.key=PATH``); the value of ``--out`` is ``OUT/`` wherever it was."""
    args = []
    for before, word in zip(["", *argv], argv):
        key, eq, value = word.rpartition("=") if word.startswith("--set=") else word.partition("=")
        if before == "--out" or key == "--out" and eq:  # the output folder, wherever it was
            args.append(f"{key}=OUT/" if eq else "OUT/")
        else:
            args.append(f"{key}={portable(value)}" if key.startswith("--") and eq else portable(word))
    return args


def portable(word: str) -> str:
    """An absolute path as a reader can repeat it: relative inside the repository, ``OUT/…`` inside the
    default output folder, else a named placeholder (``VOICE.onnx``, ``MODEL.gguf``, ``SPEECH.wav``,
    ``MODELS/``); anything else unchanged."""
    if not word.startswith("/"):
        return word
    path = Path(word)
    for base, prefix in ((ROOT, ""), (default_out(), "OUT/")):
        if path.is_relative_to(base):
            return prefix + path.relative_to(base).as_posix() if path != base else prefix or "."
    if path.is_dir() or not path.suffix:
        return path.name.upper() + "/"
    return PLACEHOLDERS.get(path.suffix, path.stem.upper() + path.suffix)


def result_path(name: str, ext: str, out: Path | None = None, hardware: str | None = None, date: str | None = None) -> Path:
    """``<out>/<name>-<hardware>-<date>.<ext>`` (``default_out()``, this machine's tag and today by default)."""
    out = out or default_out()
    out.mkdir(parents=True, exist_ok=True)
    return out / f"{name}-{hardware or hardware_tag()}-{date or dt.date.today().isoformat()}.{ext}"


def pyplot():  # noqa: ANN201 - the matplotlib.pyplot module
    """matplotlib's pyplot on the Agg backend (result files, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: Path) -> Path:  # noqa: ANN001
    """``fig`` laid out and written next to ``path`` as ``.png``; returns the PNG's path."""
    png = path.with_suffix(".png")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return png


def write_json(name: str, rows: list[dict], extra: dict | None = None, *, path: Path | None = None,
               out: Path | None = None) -> Path:  # fmt: skip
    """``<out>/<name>-<hardware>-<date>.json`` (or ``path``) with rows plus date, hardware, command."""
    path = path or result_path(name, "json", out)
    doc = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "hardware": hardware(),
        "command": command_line(),
        **(extra or {}),
        "rows": rows,
    }
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def report(name: str, rows: list[dict], extra: dict, args: argparse.Namespace, plot) -> Path:  # noqa: ANN001
    """Write ``rows`` as ``<args.out>/<name>-<args.hardware>-<args.date>.json``, draw ``plot(rows, path)``,
    print the rows and where they went; returns the JSON's path (``add_common_arguments``'s options)."""
    path = write_json(name, rows, extra, path=result_path(name, "json", args.out, args.hardware, args.date))
    plot(rows, path)
    for r in rows:
        print(r)
    print(f"wrote {path}")
    return path


# ---------------------------------------------------------------- a server process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, extra: list[str], timeout_s: float = 120.0, entry: Sequence[str] = ("-m", "voxloop"),
                 env: dict[str, str] | None = None) -> subprocess.Popen:  # fmt: skip
    """``python -m voxloop [extra] --set trace.path=none serve --port PORT``, returned once /ready is 200
    (``entry``: what follows ``python`` instead of ``-m voxloop``, an entry taking voxloop's arguments;
    ``env``: variables added to this process's environment for the server).

    The server's log goes to a temporary file (a pipe nobody reads would fill and stall it);
    its tail is in the error when the server exits or is not ready within ``timeout_s``.
    """
    cmd = [sys.executable, *entry, *extra, "--set", "trace.path=none", "serve", "--port", str(port)]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
                            env=None if env is None else {**os.environ, **env})  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {_tail(log)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"server not ready within {timeout_s:g} s: {_tail(log)}")


def stop_server(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGINT (the server drains and exits), then kill if it does not exit within ``timeout_s``."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def metrics_url(ws_url: str) -> str:
    """``http://host:port/metrics`` of the server behind ``ws://host:port/…`` (``wss`` -> ``https``)."""
    parts = urllib.parse.urlsplit(ws_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return f"{scheme}://{parts.netloc}/metrics"


#: ``{sample name: {sorted (label, value) pairs: value}}``, names as exposed (``…_total``, ``…_bucket``).
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def scrape_metrics(url: str, timeout_s: float = 10.0) -> Samples:
    """The samples of a Prometheus text page (a server's ``/metrics``). Raises OSError, ValueError."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        text = r.read().decode("utf-8")
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def gauge(samples: Samples, name: str, scale: float = 1.0) -> float | dict[str, float] | None:
    """A gauge divided by ``scale``: a number, ``{"label/values": number}`` when labelled, None if absent."""
    got = samples.get(name)
    if not got:
        return None
    if list(got) == [()]:
        return round(got[()] / scale, 1)
    return {"/".join(v for _, v in labels): round(v / scale, 1) for labels, v in sorted(got.items())}


def counter_delta(before: Samples, after: Samples, name: str, labels: tuple = ()) -> float | None:
    """How much one sample grew between two scrapes; None when absent or when it fell (a restart).

    A sample first seen in ``after`` grew from 0 (a labelled counter appears at its first increment).
    """
    a, b = before.get(name, {}).get(labels, 0.0), after.get(name, {}).get(labels)
    return None if b is None or b < a else b - a


def histogram_delta(before: Samples, after: Samples, name: str) -> dict[str, float | None]:
    """Observations of histogram ``name`` between two scrapes: count, mean and p99 upper bound (its units).

    The p99 is the bound (``le``) of the first bucket holding 99 % of the new observations.
    """
    n = counter_delta(before, after, f"{name}_count")
    total = counter_delta(before, after, f"{name}_sum")
    buckets = sorted((float(dict(k)["le"]), counter_delta(before, after, f"{name}_bucket", k))
                     for k in after.get(f"{name}_bucket", {}))
    p99 = next((le for le, c in buckets if c is not None and n and c >= 0.99 * n), None)
    return {"count": n, "mean": None if not n or total is None else total / n,
            "p99_le": None if p99 == float("inf") else p99}


def audio_parts(before: dict, after: dict, which: str = "first") -> dict[str, float] | None:
    """Mean ms of each part of the ``which`` ("first" or "last") audio of ``x.tts.speak``
    (``voxloop_tts_{which}_audio_part_seconds``) between two scrapes (warm-up included); None when
    the server exported none (CPU engines)."""
    name = f"voxloop_tts_{which}_audio_part_seconds"
    out = {}
    for labels, count in after.get(f"{name}_count", {}).items():
        n = count - before.get(f"{name}_count", {}).get(labels, 0.0)
        total = after[f"{name}_sum"][labels] - before.get(f"{name}_sum", {}).get(labels, 0.0)
        if n > 0:
            out[dict(labels)["part"]] = round(1000 * total / n, 2)
    return out or None


def server_audio_parts(before: dict, after: dict) -> dict[str, dict[str, float] | None]:
    """A load row's ``server_{first,last}_audio_parts_mean_ms``: where the server's share of each
    sentence went, by part (``audio_parts``)."""
    return {f"server_{which}_audio_parts_mean_ms": audio_parts(before, after, which) for which in ("first", "last")}


def _tail(log, chars: int = 2000) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-chars:]


def default_voice() -> str:
    """The bundled Piper voice's path (``base.models``), for scripts run without ``--voice``."""
    from base import models
    from base.config import load_config

    return str(models.resolve_voice(load_config()).path)


class Mic:
    """Streams silence continuously (like an open microphone) and speech on demand."""

    def __init__(self, client, rate: int, noise_dbfs: float | None = None, seed: int = 0) -> None:
        self.client = client
        self.rate = rate  # Hz of the speech given to ``say``
        #: White noise added to every frame, dBFS RMS (a real microphone's floor); None: digital silence.
        self.noise = None if noise_dbfs is None else 32768.0 * 10 ** (noise_dbfs / 20)
        self._rng = np.random.default_rng(seed)
        self.queue: list[np.ndarray] = []
        self.speech_end: asyncio.Future | None = None
        #: When the first speech frame of the last ``say`` was sent (monotonic s), None before.
        self.speech_start: float | None = None
        #: Worst lateness of a 20 ms frame since it was last read, s (a busy client process shows here).
        self.late_max = 0.0
        self.task = asyncio.create_task(self._run())

    def say(self, pcm: np.ndarray) -> asyncio.Future:
        self.speech_end = asyncio.get_running_loop().create_future()
        self.speech_start = None
        self.queue.append(pcm)
        return self.speech_end

    def take_late_max_ms(self) -> float:
        late, self.late_max = self.late_max, 0.0
        return round(late * 1000, 1)

    async def _run(self) -> None:
        step = self.rate * 20 // 1000
        silence = np.zeros(step, np.int16)
        t_next = time.monotonic()
        pending = np.zeros(0, np.int16)
        while True:
            if not len(pending) and self.queue:
                pending = self.queue.pop(0)
            piece, pending = (pending[:step], pending[step:]) if len(pending) else (silence, pending)
            t_next += step / self.rate
            await asyncio.sleep(max(0.0, t_next - time.monotonic()))
            self.late_max = max(self.late_max, time.monotonic() - t_next)
            await self.client.send_audio(self._noisy(piece), self.rate)
            if piece is not silence:
                self.speech_start = self.speech_start or time.monotonic()
                if not len(pending) and self.speech_end and not self.speech_end.done():
                    self.speech_end.set_result(time.monotonic())

    def _noisy(self, piece: np.ndarray) -> np.ndarray:
        if self.noise is None:
            return piece
        x = piece + self._rng.normal(0.0, self.noise, len(piece))
        return np.clip(x, -32768, 32767).astype(np.int16)

    async def stop(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass
