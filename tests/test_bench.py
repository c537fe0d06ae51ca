"""bench/ is a package of benchmarks run as ``python -m bench.<name>`` on one harness.

Checks its shape (no ``sys.path`` edits, benchmarks never import each other, every module
imports) and the harness's closed loop and result files with a fake backend.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import scaled

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
#: Library modules of the package; every other module is a benchmark (it has a ``main``).
LIBRARIES = {"bench.harness", "bench.tts_backends", "bench.gpu_steps", "bench.gpu_timeline", "bench.zh_evaluation", "bench.scaleout.topology",
             "bench.scaleout.replicas", "bench.scaleout.voice", "bench.voice_talkers",
             "bench.turn_set", "bench.llm_engine", "bench.instant_runner", "bench.piper_speech"}
#: A benchmark may use another's code only when it is that benchmark's own mode (WebSocket mode:
#: the server process, and the client processes, which also run alone; the served host path's
#: load and the scale-out run's TTS load are the same client processes).
MODES = {("bench.tts_load", "bench.tts_load_ws"), ("bench.tts_load", "bench.ws_clients"),
         ("bench.served_host", "bench.ws_clients"), ("bench.scaleout.gpus", "bench.ws_clients")}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


MODULES = sorted(module_name(p) for p in BENCH.rglob("*.py"))


def bench_imports(path: Path) -> set[str]:
    """The ``bench.*`` modules ``path`` imports, at any depth (lazy imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bench"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("bench")}
    return found


def test_no_module_edits_sys_path():
    for path in BENCH.rglob("*.py"):
        assert "sys.path" not in path.read_text(), f"{path.relative_to(ROOT)} edits sys.path"


def test_benchmarks_use_the_harness_not_each_other():
    for path in BENCH.rglob("*.py"):
        name = module_name(path)
        for target in bench_imports(path) - LIBRARIES - {"bench", "bench.scaleout"}:
            assert (name, target) in MODES, f"{name} imports the benchmark {target}; move shared code to a library"


def test_no_import_cycle_between_bench_modules():
    graph = {module_name(p): bench_imports(p) for p in BENCH.rglob("*.py")}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    for name in graph:
        assert not reaches(name, name, set()), f"{name} is in an import cycle"


@pytest.mark.parametrize("name", MODULES)
def test_every_module_imports(name):
    if name in ("bench.gpu_steps", "bench.tts_gpu_profile", "bench.tts_gpu_experiments"):
        pytest.importorskip("torch")
    importlib.import_module(name)


def test_benchmarks_run_as_modules():
    out = subprocess.run([sys.executable, "-m", "bench.tts_load", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=scaled(60))  # fmt: skip
    assert out.returncode == 0, out.stderr
    for option in ("--voice", "--hardware", "--date", "--out"):
        assert option in out.stdout


class FakeBackend:
    """Speaks every clause in 20 ms: first audio after 5 ms, 0.5 s of 1 kHz audio."""

    name, sample_rate, info = "fake", 1000, {"kind": "fake"}

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def speak(self, ids: list[int]) -> tuple[float, int, float]:
        with self.lock:
            self.calls += 1
        time.sleep(0.02)
        return 0.005, 500, 0.0

    def peak_vram_mb(self) -> None:
        return None


def test_closed_loop_keeps_clients_busy_and_summarizes():
    from bench.harness import closed_loop, load_sentences, summarize

    backend = FakeBackend()
    records = closed_loop(backend, load_sentences(), clients=3, duration_s=0.3, warmup_s=0.1)
    assert backend.calls > len(records) >= 3  # warm-up requests are run but not recorded
    row = summarize(records, backend, 3, "test-box")
    assert row["backend"] == "fake" and row["concurrency"] == 3 and row["kind"] == "fake"
    assert row["first_audio_p50_ms"] == 5.0 and row["audio_s_per_request"] == 0.5
    assert row["latency_p50_ms"] >= 20 and row["peak_vram_mb"] is None


def test_listening_counts_the_gaps_a_listener_hears():
    """First chunk at 100 ms starts playback; 100 ms of audio each; a chunk late by 200 ms is a 200 ms
    stall, one ahead of playback none."""
    from bench.harness import Listening

    heard = Listening(1000, t0=0.0)
    for now, samples in [(0.1, 100), (0.15, 100), (0.5, 100), (0.55, 200)]:
        heard.chunk(now, samples)
    assert (heard.first, heard.samples) == (0.1, 500) and abs(heard.stall - 0.2) < 1e-9


def test_closed_loop_sinks_drives_the_real_scheduler_from_its_own_thread():
    """Clients as sinks: the real BatchScheduler (a runner whose launches take no time) calls each
    client's sink on its own thread; every finished sentence is recorded with all its audio and
    the client's next one queued there, no client thread; a failing engine fails the run."""
    from bench.harness import closed_loop_sinks, load_sentences, summarize
    from bench.instant_runner import HOP, InstantRunner
    from tts_engine.torch_vits.runner import batch_buckets
    from tts_engine.torch_vits.runner import RunnerOptions
    from tts_engine.torch_vits.scheduler import BatchScheduler

    options = RunnerOptions(chunk_frames=32, tail_chunk_frames=256, decode_batches=batch_buckets(16),
                            encode_batches=batch_buckets(16, "coarse"), fast_lanes=2, chunks_per_step=0)
    scheduler = BatchScheduler(InstantRunner(options, 349), 22050, queue_size=64)
    threads = threading.active_count()
    try:
        records = closed_loop_sinks(lambda ids, sink: scheduler.submit(ids, sink=sink), 22050, load_sentences(),
                                    clients=5, duration_s=0.3, warmup_s=0.1)
    finally:
        scheduler.close()
    assert len(records) >= 10 and threading.active_count() <= threads + 1  # no client threads (the scheduler's)
    assert {round(r["audio_s"] * 22050) for r in records} == {349 * HOP}  # every chunk of every sentence counted
    assert all(0 <= r["first_s"] <= r["latency_s"] and r["start"] >= records[0]["start"] for r in records)
    backend = FakeBackend()
    backend.sample_rate = 22050
    row = summarize(records, backend, 5, "test-box")
    assert row["concurrency"] == 5 and row["qps"] > 0 and row["audio_s_per_request"] == round(349 * HOP / 22050, 3)

    def refuse(ids, sink):
        raise ValueError("bad ids")

    with pytest.raises(RuntimeError, match="5 client"):
        closed_loop_sinks(refuse, 22050, load_sentences(), clients=5, duration_s=0.1, warmup_s=0.0)


def test_instant_runner_lanes_take_their_launch_time_and_rows_come_resampled():
    """The stand-in runner: with ``launch_s`` each launch keeps its own lane busy that long after the
    lane's previous one (lanes side by side); its rows are the real runner's shape at the output
    rate, so the real scheduler hands out every sentence's whole audio at 24 kHz."""
    from bench.harness import closed_loop_sinks, load_sentences
    from bench.instant_runner import HOP, InstantRunner
    from tts_engine.torch_vits.runner import batch_buckets
    from tts_engine.torch_vits.runner import RunnerOptions
    from tts_engine.torch_vits.scheduler import BatchScheduler

    options = RunnerOptions(chunk_frames=32, tail_chunk_frames=256, decode_batches=batch_buckets(16),
                            encode_batches=batch_buckets(16, "coarse"), fast_lanes=2, chunks_per_step=0,
                            voice_rate=22050, output_rate=24000)  # fmt: skip
    runner = InstantRunner(options, 349, launch_s=0.05)
    t0 = time.perf_counter()
    assert runner.decode([0, 1], [0, 0], 256).shape == (2, runner.resampler.row_samples(256))
    runner.decode([2], [0], 64)  # queued behind the first on the main lane
    event = runner.mark("main")
    assert event - t0 >= 0.1 and runner.busy("main") and not runner.done(event)
    assert not runner.busy("fast") and runner.done(runner.mark("fast"))  # another lane: free
    runner.wait("main")
    assert time.perf_counter() - t0 >= 0.1 and runner.done(event) and not runner.busy("main")
    scheduler = BatchScheduler(InstantRunner(options, 349, launch_s=0.002), 24000, queue_size=64)
    try:
        records = closed_loop_sinks(lambda ids, sink: scheduler.submit(ids, sink=sink), 24000, load_sentences(),
                                    clients=5, duration_s=0.3, warmup_s=0.05)
    finally:
        scheduler.close()
    assert records and {round(r["audio_s"] * 24000) for r in records} == {runner.resampler.out_samples(349 * HOP)}


def test_bucket_levels_of_the_load_bench_and_of_older_namespaces():
    """``bench.tts_load``'s ``--batch-buckets`` / ``--encode-batch-buckets`` (``--coarse`` and
    ``--encode-fine`` set them) and a namespace of another bench that says ``coarse`` reach the
    engine's levels and the backend's name."""
    import argparse

    from bench.tts_backends import bucket_levels, cuda_variant

    def ns(**kw):
        return argparse.Namespace(compile=False, cudnn_benchmark=False, **kw)

    assert bucket_levels(ns()) == ("fine", "coarse") and cuda_variant(ns(), False) == ""
    finer = ns(batch_buckets="finer", encode_batch_buckets="fine")
    assert bucket_levels(finer) == ("finer", "fine") and cuda_variant(finer, False) == "-finer-encfine"
    assert bucket_levels(ns(coarse=True, encode_fine=True)) == ("coarse", "fine")
    assert cuda_variant(ns(coarse=True), False) == "-coarse"


def test_gpu_times_interpolate_in_rows_and_between_measured_sizes():
    """A launch's modeled time: linear in padded rows between the rows measured (and beyond the
    last), a size not measured between two measured takes the line between their times (below the
    smallest: the smallest's; beyond the largest: extended along the sizes), a fast lane's first chunk larger than every ``first`` key the main lane's; scales
    per kind; bad keys are refused."""
    from bench.instant_runner import GpuTimes

    times = GpuTimes({"encode 1 x 256": 1.0, "encode 16 x 256": 4.0, "first 1 x 32": 0.6, "decode 1 x 32": 0.5,
                      "decode 16 x 32": 2.0, "decode 16 x 256": 8.0})  # fmt: skip
    assert times.seconds("encode", 8, 256) == pytest.approx((1.0 + 7 * 3.0 / 15) / 1000)
    assert times.seconds("encode", 32, 256) == pytest.approx((4.0 + 16 * 3.0 / 15) / 1000)  # extended
    assert times.seconds("encode", 1, 128) == pytest.approx(1.0 / 1000)  # bucket 128 not measured: 256's
    assert times.seconds("first", 1, 32) == pytest.approx(0.6 / 1000)  # one point: its time at any rows
    # no first x 64: decode's sizes, 64 between 32 (2.0 ms at 16 rows) and 256 (8.0 ms)
    assert times.seconds("first", 16, 64) == pytest.approx((2.0 + 32 * 6.0 / 224) / 1000)
    assert times.seconds("decode", 16, 144) == pytest.approx(5.0 / 1000)  # half-way: half-way between the times
    assert times.seconds("decode", 8, 144) == pytest.approx((times.seconds("decode", 8, 32) + times.seconds("decode", 8, 256)) / 2)
    # larger than measured: the line through the two largest sizes (32: 2.0, 256: 8.0 ms at 16 rows) extended
    assert times.seconds("decode", 16, 512) == pytest.approx((8.0 + 256 * 6.0 / 224) / 1000)
    assert times.seconds("encode", 16, 512) == pytest.approx(2 * 4.0 / 1000)  # one size (256) measured: in proportion
    half = GpuTimes(times.graph_ms, {"encode": 0.5})
    assert half.seconds("encode", 16, 256) == pytest.approx(2.0 / 1000)
    assert half.seconds("decode", 16, 32) == times.seconds("decode", 16, 32)
    with pytest.raises(ValueError, match="not '<encode"):
        GpuTimes({"encode 16 256": 1.0, "decode 1 x 32": 1.0})
    with pytest.raises(ValueError, match="need 'encode' keys"):
        GpuTimes({"decode 1 x 32": 1.0})
    with pytest.raises(ValueError, match="'decode' or 'flowed'"):
        GpuTimes({"encode 1 x 256": 1.0, "first 1 x 32": 0.6})
    # a flow_once run's times: no windowed main-lane chunks measured, so none is made up
    once = GpuTimes({"encode 1 x 256": 1.0, "first 1 x 64": 0.7, "flowed 1 x 256": 0.3, "flow 1 x 512": 0.5})
    assert once.seconds("flowed", 1, 128) == pytest.approx(0.3 / 1000) and once.kinds == {"encode", "first", "flowed", "flow"}
    with pytest.raises(ValueError, match="no 'decode' graph times"):
        once.seconds("decode", 1, 256)


def test_shared_gpu_runs_lanes_in_order_and_shares_its_capacity():
    """Launches on one modeled GPU: with capacity 1 two lanes' launches take turns (each ends
    when both works are done); with capacity 2 they run as if alone; a launch that waits for
    another lane's mark starts when it ends; ``done`` follows the clock."""
    from bench.instant_runner import SharedGpu

    def ends(capacity, second_after=()):
        gpu = SharedGpu(("fast", "main"), capacity)
        t0 = time.perf_counter()
        gpu.launch("fast", 0.2)
        gpu.launch("main", 0.2, second_after)
        gpu.launch("main", 0.1)  # behind the first on its lane
        return gpu, t0, [gpu.end(("fast", 1)) - t0, gpu.end(("main", 1)) - t0, gpu.end(("main", 2)) - t0]

    _, _, (fast, main1, main2) = ends(1.0)
    assert fast == pytest.approx(0.4, abs=0.01) and main1 == pytest.approx(0.4, abs=0.01)
    assert main2 == pytest.approx(0.5, abs=0.01)
    _, _, (fast, main1, main2) = ends(2.0)
    assert fast == pytest.approx(0.2, abs=0.01) and main1 == pytest.approx(0.2, abs=0.01)
    assert main2 == pytest.approx(0.3, abs=0.01)
    gpu, t0, (fast, main1, main2) = ends(2.0, second_after=[("fast", 1)])
    assert fast == pytest.approx(0.2, abs=0.01) and main1 == pytest.approx(0.4, abs=0.01)
    assert not gpu.done(("fast", 1)) and not gpu.done(gpu.mark("main"))
    time.sleep(max(0.0, t0 + 0.25 - time.perf_counter()))
    assert gpu.done(("fast", 1)) and not gpu.done(("main", 1))
    assert gpu.busy_until_now() == pytest.approx(time.perf_counter() - t0, abs=0.01)  # never idle so far
    time.sleep(max(0.0, t0 + 0.7 - time.perf_counter()))  # all done at 0.5 s: idle since
    assert gpu.busy_until_now() == pytest.approx(0.5, abs=0.01)
    with pytest.raises(ValueError, match="capacity"):
        SharedGpu(("main",), 0)


@pytest.mark.slow
def test_gpu_model_bench_binds_the_real_scheduler_to_graph_times(tmp_path):
    """``bench.tts_gpu_model``: the real engine and scheduler (configs/gpu.toml) against graph
    times; GPU time that doubles halves the sentences a GPU that takes turns serves (it stays
    about fully busy); measured rows of the same clients and settings check an unscaled row, a
    row of other settings does not, and a scaled row has no check."""
    from bench.tts_gpu_model import main

    # a flow_once run's graph times (configs/gpu.toml; H100 2026-12-05, rounded): the main lane's chunks
    # the decoder alone ("flowed"), packed flow launches ("flow"), chunks decoded ahead windowed ("decode")
    graph_ms = {"encode 1 x 256": 1.3, "encode 16 x 256": 3.1, "encode 64 x 256": 9.3, "first 1 x 64": 0.74,
                "first 16 x 64": 1.41, "flowed 1 x 64": 0.24, "flowed 16 x 64": 0.89, "flowed 1 x 256": 0.34,
                "flowed 16 x 256": 2.3, "flowed 64 x 256": 7.95, "flow 1 x 512": 0.49, "flow 1 x 4096": 0.73,
                "decode 1 x 256": 0.94, "decode 16 x 256": 3.56}  # fmt: skip
    times = tmp_path / "times.json"
    times.write_text(json.dumps([{"backend": "gpu", "mode": "engine", "concurrency": 1, "qps": 1.0},
                                 {"backend": "gpu", "graph_ms": graph_ms}]))  # fmt: skip
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps([{"mode": "engine", "concurrency": 8, "qps": 100.0},
                                    {"mode": "engine", "concurrency": 8, "qps": 900.0, "fast_lanes": 99}]))  # fmt: skip
    assert main(["--gpu-times", str(times), "--measured", str(measured), "--clients", "8", "--duration", "1.5",
                 "--warmup", "0.3", "--gpu-capacity", "1", "--scale", "1", "1", "--scale", "2", "2",
                 "--out", str(tmp_path), "--hardware", "test", "--date", "d"]) == 0  # fmt: skip
    doc = json.loads((tmp_path / "tts_gpu_model-test-d.json").read_text())
    assert doc["gpu_times"]["row"] == 1 and doc["graph_ms"] == graph_ms
    plain, slow = doc["rows"]
    assert plain["variant"] == "shipped" and plain["measured_qps"] == {"mean": 100.0, "min": 100.0, "max": 100.0, "n": 1}
    assert plain["model_of_measured_pct"] == pytest.approx(plain["qps"], rel=0.01)
    assert slow["variant"] == "shipped encode x2 decode x2" and slow["measured_qps"] is None
    assert 85 <= plain["gpu_busy_pct"] <= 110 and 85 <= slow["gpu_busy_pct"] <= 110
    assert 0 <= plain["gpu_idle_pct"] <= 20 and 0 <= slow["gpu_idle_pct"] <= 20  # capacity 1: busy ~ not idle
    assert slow["qps"] == pytest.approx(plain["qps"] / 2, rel=0.25)
    assert plain["frames_per_audio_frame"]["flow"] < plain["frames_per_audio_frame"]["first_with_context"]["flow"]
    assert (tmp_path / "tts_gpu_model-test-d.png").exists()


def test_chunk_work_counts_the_windows_the_engine_computes():
    """A 100-frame utterance in 32-frame first chunks, later chunks up to 256, contexts 32 + 11 + 1:
    the first chunk's window 32 + 44 (no context before it) or 44 + 32 + 44, the decoder on 32 + 12
    or 12 + 32 + 12; the rest, 68 frames, in one 128-frame chunk: window 44 + 128 + 44, decoder 152."""
    from bench.tts_gpu_model import chunk_work
    from tts_engine.torch_vits.runner import RunnerOptions

    options = RunnerOptions(chunk_frames=32, tail_chunk_frames=256)
    work = chunk_work(options, 32, 11, 1, [100])
    assert work == {"flow": (76 + 216) / 100, "decoder": (44 + 152) / 100,
                    "first_with_context": {"flow": (120 + 216) / 100, "decoder": (56 + 152) / 100}}  # fmt: skip
    off = chunk_work(replace(options, fast_lane="off"), 32, 11, 1, [100, 20])  # first chunks on the main lane
    assert {k: off[k] for k in ("flow", "decoder")} == off["first_with_context"]
    # flow_once: the first chunk's window (76) and one packed segment from 32 - 12 - 32 (frame 0) to 100,
    # and a 2-frame gap; a 20-frame utterance has no later chunk: its first window alone
    once = chunk_work(replace(options, flow_once=True), 32, 11, 1, [100, 20], conv_radius=2)
    assert once["flow"] == round((76 + 102 + 76) / 120, 3) and once["decoder"] == work_of(options, [100, 20])["decoder"]
    assert once["flow_windowed"] == work_of(options, [100, 20])["flow"]


def work_of(options, frames):
    from bench.tts_gpu_model import chunk_work

    return chunk_work(options, 32, 11, 1, frames)


def test_flow_cost_splits_a_graph_and_prices_the_packed_flow():
    """``FlowCost``: a windowed 256-frame chunk (flow window 344, decoder 280 frames at contexts 32 + 11
    + 1) with the flow at 0.3 of the decoder's time per frame spends 0.3 x 344 / (0.3 x 344 + 280) of its
    graph in the flow. The stand-in runner with ``flow_once``: a main-lane chunk takes its graph's time
    less that share; a packed flow launch of P frames, P x that share of the largest chunk's graph at
    the largest batch / (its rows x window); without a flow cost it refuses measured graph times."""
    from bench.instant_runner import FlowCost, GpuTimes, InstantRunner
    from tts_engine.torch_vits.chunked import ChunkGeometry
    from tts_engine.torch_vits.runner import RunnerOptions

    cost = FlowCost(0.3, 32, 11, 2)
    g = ChunkGeometry(256, 32, 11, 256, 1)
    assert cost.flow_share(g) == pytest.approx(0.3 * 344 / (0.3 * 344 + 280))
    options = RunnerOptions(chunk_frames=32, tail_chunk_frames=256, decode_batches=(1, 64), flow_once=True,
                            voice_rate=22050, output_rate=24000)  # fmt: skip
    times = GpuTimes({"encode 1 x 64": 1.0, "decode 1 x 256": 2.0, "decode 64 x 256": 10.0})
    with pytest.raises(ValueError, match="flow_cost"):
        InstantRunner(options, 349, gpu_times=times)
    runner = InstantRunner(options, 349, gpu_times=times, flow_cost=cost)
    runner.decode([0], [32], 256)
    assert runner.gpu_s == pytest.approx(0.002 * (1 - cost.flow_share(g)))
    ahead = runner.gpu_s
    runner.decode([0], [32], 256, ahead=True)  # decoded ahead: with its flow window
    assert runner.gpu_s - ahead == pytest.approx(0.002)
    before = runner.gpu_s
    launches, frames, used = runner.flow([(0, 32, 349), (1, 32, 300)])
    assert launches == 1 and frames == 1024 and used == (349 - 0) + (300 - 0)  # from 32 - 12 - 32 (< 0): frame 0
    per_frame = 0.010 * cost.flow_share(g) / (64 * 344)
    assert runner.gpu_s - before == pytest.approx(per_frame * 1024)
    # graph times of a flow_once run: its flowed chunks and flow launches as measured, no ratio needed
    measured = GpuTimes({**times.graph_ms, "flowed 1 x 256": 1.5, "flowed 64 x 256": 7.0, "flow 1 x 512": 0.2,
                         "flow 1 x 1024": 0.3})  # fmt: skip
    runner = InstantRunner(options, 349, gpu_times=measured, flow_cost=FlowCost(None, 32, 11, 2))
    runner.decode([0], [32], 256)
    runner.flow([(0, 32, 349), (1, 32, 300)])
    assert runner.gpu_s == pytest.approx(0.0015 + 0.0003)
    with pytest.raises(ValueError, match="flow_cost"):  # windowed graph times and no ratio
        InstantRunner(options, 349, gpu_times=times, flow_cost=FlowCost(None, 32, 11, 2))


@pytest.mark.slow
def test_served_host_bench_measures_each_process_role(tmp_path):
    """``bench.served_host``: the stand-in engine alone in process (the reference), then ``voxloop
    serve`` (two front ends, one engine process) with the same stand-in runner and load clients in
    their own processes: every sentence answered with its 349 frames of audio at 24 kHz, served as
    a share of the engine's sentences/s, CPU time per sentence found for the engine process, the
    front ends and the clients; JSON and PNG written."""
    from bench import served_host

    served_host.main(["--clients", "2", "--duration", "1.5", "--warmup", "0.5", "--front-ends", "2",
                      "--launch-ms", "1", "--out", str(tmp_path), "--hardware", "box", "--date", "d"])  # fmt: skip
    doc = json.loads((tmp_path / "served_host-box-d.json").read_text())
    engine, row = doc["rows"]
    assert (engine["mode"], row["mode"]) == ("engine", "ws")  # the in-process reference first
    assert engine["requests"] > 0 and engine["audio_s_per_request"] == pytest.approx(349 * 256 / 22050, abs=0.01)
    assert row["served_of_engine_pct"] == round(100 * row["qps"] / engine["qps"], 1)
    assert row["errors"] == 0 and row["qps"] > 0 and row["launch_ms"] == 1.0, row
    assert row["audio_s_per_request"] == pytest.approx(349 * 256 / 22050, abs=0.01)
    assert all(row["cpu_ms_per_sentence"][role] > 0 for role in served_host.ROLES), row
    assert {"text", "to_engine", "engine", "from_engine"} <= set(row["server_first_audio_parts_mean_ms"]), row
    assert (tmp_path / "served_host-box-d.png").stat().st_size > 0


def test_result_files_say_date_hardware_and_command(tmp_path, monkeypatch):
    from bench import harness

    monkeypatch.setattr(sys, "argv", ["bench/x.py", "--clients", "2"])
    monkeypatch.setenv("CUDNN_CONV_WSCAP_DBG", "256")
    monkeypatch.setenv("HOME_UNRELATED_X", "1")
    path = harness.write_json("x", [{"a": 1}], {"note": "n"}, path=harness.result_path("x", "json", tmp_path, "box", "2026-01-02"))
    assert path.name == "x-box-2026-01-02.json"
    doc = json.loads(path.read_text())
    assert doc["rows"] == [{"a": 1}] and doc["note"] == "n" and doc["date"]
    assert doc["hardware"]["cores"] >= 1 and "--clients 2" in doc["command"]
    assert doc["command"].startswith("CUDNN_CONV_WSCAP_DBG=256 ") and "HOME_UNRELATED_X" not in doc["command"]
    assert harness.pct([1, 2, 3, 4], 50) == 2.5 and harness.pct([], 50) is None


@pytest.mark.parametrize(("reply_done", "received_ms", "started", "paused", "resumed", "cut", "outcome"), [
    (True, 1200, True, False, False, False, "reply_over"),  # a short reply had ended: nothing to pause
    (False, 1200, True, False, False, False, "cut"),  # still being made and not paused: a cut
    (True, 9000, True, False, False, False, "cut"),  # done but still playing, not paused: a cut
    (False, 9000, True, True, True, False, "resumed"),
    (False, 9000, True, True, False, True, "cut"),  # paused, then words cancelled it
    (False, 9000, True, True, False, False, "paused"),  # never resolved
    (False, 9000, False, False, False, False, "unaffected"),
])
def test_turn_taking_burst_outcomes(reply_done, received_ms, started, paused, resumed, cut, outcome):
    from bench.turn_taking import burst_outcome

    assert burst_outcome(reply_done, received_ms, 1800, started, paused, resumed, cut) == outcome


def test_audio_parts_are_means_between_two_scrapes():
    from bench.harness import audio_parts, server_audio_parts

    name = "voxloop_tts_first_audio_part_seconds"
    before = {f"{name}_count": {(("part", "engine"),): 2.0}, f"{name}_sum": {(("part", "engine"),): 0.010}}
    after = {f"{name}_count": {(("part", "engine"),): 6.0, (("part", "text"),): 4.0},
             f"{name}_sum": {(("part", "engine"),): 0.090, (("part", "text"),): 0.004}}
    assert audio_parts(before, after) == {"engine": 20.0, "text": 1.0}
    assert audio_parts({}, {}) is None  # a CPU engine exports no parts
    assert server_audio_parts(before, after) == {"server_first_audio_parts_mean_ms": {"engine": 20.0, "text": 1.0},
                                                 "server_last_audio_parts_mean_ms": None}  # only first parts scraped


def test_turn_taking_server_counts():
    from bench.turn_taking import server_counts

    before = {"voxloop_turns_total": {(("status", "discarded"),): 3.0, (("status", "completed"),): 9.0},
              "voxloop_asr_utterances_total": {(): 10.0}}
    after = {"voxloop_turns_total": {(("status", "discarded"),): 5.0, (("status", "completed"),): 19.0},
             "voxloop_asr_utterances_total": {(): 14.0}}
    after["voxloop_llm_end_of_turn_probes_total"] = {(("read", "shared"),): 4.0}
    assert server_counts(before, after) == {"server_discarded_turns": 2.0, "server_asr_runs": 4.0,
                                            "server_probes_shared": 4.0, "server_probes_alone": None}
    assert set(server_counts(None, after).values()) == {None}


def test_turn_taking_counts_add_up_over_conversations():
    """The modes take turns by conversation: a mode's counts are the sum over its conversations, a
    counter first seen later grew from 0 there, and one failed read leaves the sum unknown."""
    from bench.turn_taking import _add_counts

    empty = {"voxloop_asr_utterances_total": {(): 10.0}}
    later = {"voxloop_asr_utterances_total": {(): 14.0}}
    last = {"voxloop_turns_total": {(("status", "discarded"),): 1.0}, "voxloop_asr_utterances_total": {(): 20.0}}
    total: dict = {}
    _add_counts(total, empty, later)
    _add_counts(total, later, last)
    assert total == {"server_discarded_turns": 1.0, "server_asr_runs": 10.0, "server_probes_shared": 0,
                     "server_probes_alone": 0}
    _add_counts(total, None, last)
    _add_counts(total, later, last)
    assert set(total.values()) == {None}


def test_turn_taking_modes_get_the_same_conversations():
    """Every mode's talker gets the same turns in the same order, cut into conversations of N."""
    from bench.turn_set import conversations

    turns = [{"name": f"t{i}"} for i in range(14)]
    plan = conversations(turns, 0, 6)
    assert [len(c) for c in plan] == [6, 6, 2] and plan == conversations(turns, 0, 6)
    assert sorted(t["name"] for c in plan for t in c) == sorted(t["name"] for t in turns)
    assert conversations(turns, 0, None) == [[t for c in plan for t in c]]
    assert conversations(turns, 1, 6) != plan  # another talker: another order


def test_gpu_timeline_busy_overlap_and_top_kernels():
    """Two streams: A busy 0-10 and 20-30 µs (a kernel inside another counted once), B 5-25 µs."""
    from bench.gpu_timeline import summarize_kernels

    def k(name, ts, dur, stream):
        return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}

    events = [k("enc", 0, 10, 7), k("enc", 2, 3, 7), k("dec", 20, 10, 7), k("dec", 5, 20, 13),
              {"cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 100}]  # fmt: skip
    s = summarize_kernels(events)
    assert s["window_ms"] == 0.03 and s["kernels"] == 4 and s["kernel_ms"] == 0.04
    assert s["busy_pct"] == 100.0  # 0-30 covered by A or B
    assert s["overlap_pct"] == round(100 * 10 / 30, 1)  # 5-10 and 20-25
    assert s["streams"]["7"] == {"kernels": 3, "kernel_ms": 0.02, "busy_ms": 0.02, "busy_pct": round(100 * 20 / 30, 1)}
    assert s["streams"]["13"]["busy_pct"] == round(100 * 20 / 30, 1)
    assert [(t["kernel"], t["calls"], t["streams"]) for t in s["top_kernels"]] == [("dec", 2, [7, 13]), ("enc", 2, [7])]
    assert s["idle_gaps"]["count"] == 0  # no idle moment in 0-30 µs
    assert summarize_kernels([]) == {"kernels": 0}


def test_gpu_timeline_idle_gaps():
    """Idle moments between busy spans of any stream longer than the floor (20 µs) are counted, shorter ones not."""
    from bench.gpu_timeline import summarize_kernels

    def k(ts, dur, stream=7):
        return {"cat": "kernel", "name": "k", "ts": ts, "dur": dur, "args": {"stream": stream}}

    # busy 0-10, 15-40 (two streams), 100-110, 150-160: gaps 5 (not counted), 60, 40
    s = summarize_kernels([k(0, 10), k(15, 20), k(30, 10, stream=13), k(100, 10), k(150, 10)])
    assert s["idle_gaps"] == {"floor_us": 20.0, "count": 2, "ms": 0.1, "mean_us": 50.0, "max_us": 60.0}


@pytest.mark.parametrize("result", ["tts_gpu_experiments-h200-2026-12-04-products.json",
                                    "tts_gpu_experiments-h200-2026-12-04-convout.json"])  # fmt: skip
def test_gpu_experiment_plots_draw_the_rows_they_hold(tmp_path, result):
    """``bench.tts_gpu_experiments --plot``: one panel per kind of row (here the encoder-products rows with
    their durations moved, and the decoder / residual-step / resampling rows of an earlier run)."""
    pytest.importorskip("torch")
    from bench import tts_gpu_experiments

    path = tmp_path / result
    path.write_bytes((ROOT / "bench" / "results" / result).read_bytes())
    png = tts_gpu_experiments.plot(path)
    assert png == path.with_suffix(".png") and png.stat().st_size > 20_000


def test_load_clients_ceiling_runs_each_decoder_against_the_instant_server(tmp_path):
    """``bench.ws_clients --instant-server``: both ways of parsing deltas, alternating, each row with
    every sentence's 20 x 200 ms deltas decoded into 4 s of audio and no errors; the PNG is drawn."""
    from bench.ws_clients import DECODERS, client_ceiling, plot

    rows = client_ceiling(2, 1, list(DECODERS), 1, 1.0, 0.3)
    assert [r["client_decoder"] for r in rows] == list(DECODERS)
    for r in rows:
        assert r["errors"] == 0 and r["requests"] > 0, r
        assert r["audio_s_per_request"] == pytest.approx(4.0)
    assert plot(rows, tmp_path / "c.json").stat().st_size > 0


def test_precision_variants_name_the_decoder_kernels_and_their_products():
    """``bench.tts_int8 --precisions``: fp16/bf16 take the decoder's Triton kernels; int8 its
    activation-scale modes; nothing else."""
    from bench.tts_int8 import parse_variant

    assert parse_variant("fp16-fused") == ("fp16", "fused", False)
    assert parse_variant("bf16-fused+compile") == ("bf16", "fused", True)
    assert parse_variant("int8-static") == ("int8", "static", False)
    assert parse_variant("fp32") == ("fp32", None, False)
    for bad in ("fp32-fused", "int8-fused", "fp16-fp8", "fp16-static", "fp8"):
        with pytest.raises(SystemExit, match="unknown precision variant"):
            parse_variant(bad)


def test_graph_times_time_the_encoder_at_each_phoneme_bucket_the_sentences_fall_in(monkeypatch):
    """``bench.gpu_steps.graph_times``: an encoder graph per phoneme bucket that some sentence falls in,
    its rows those sentences (padded to the bucket, as the engine pads them), none for buckets no
    sentence needs; the decoder's graphs once per batch size. CUDA graphs stand in as replay counters."""
    torch = pytest.importorskip("torch")
    from bench import gpu_steps
    from tts_engine.torch_vits.runner import RunnerOptions

    options = RunnerOptions(chunk_frames=32, tail_chunk_frames=64, decode_batches=(1, 4), encode_batches=(1, 4),
                            phoneme_buckets=(16, 32, 64, 128))  # fmt: skip
    seen: dict[tuple, list] = {}

    def step(key, inputs):
        graph = type("Graph", (), {"replay": lambda self: seen.setdefault(key, []).append(
            [row[row > 0].tolist() for row in inputs[0]] if key[0] == "encode" else None)})()
        return type("Step", (), {"graph": graph, "inputs": inputs})()

    encode = {(b, t, "fast"): step(("encode", b, t), (torch.zeros(b, t, dtype=torch.long), torch.zeros(b, dtype=torch.long),
                                                       torch.zeros(b, 3), torch.zeros(b, dtype=torch.long), None))
              for b in (1, 4) for t in (16, 32, 64, 128)}  # fmt: skip
    decode = {(c, b, lane): step(("decode", c, b, lane), (torch.zeros(b, dtype=torch.long), torch.zeros(b, dtype=torch.long),
                                                           torch.zeros(b, dtype=torch.long)))
              for b in (1, 4) for c, lane in ((32, "fast"), (32, "main"), (64, "main"))}  # fmt: skip
    runner = type("Runner", (), {"options": options, "fast_lanes": ["fast"], "device": "cpu", "encode_steps": encode,
                                 "decode_steps": decode, "flow_steps": {}})()  # fmt: skip
    monkeypatch.setattr(gpu_steps, "fill_slots", lambda runner, sentences, noise: [])
    monkeypatch.setattr(gpu_steps, "timed", lambda fn, reps: fn() or 1.0)
    sentences = [[1] * 10, [2] * 30, [3] * 31, [4] * 100]  # buckets 16, 32, 32, 128: none in 64
    out = gpu_steps.graph_times(runner, sentences, batches=(1, 4), reps=1)
    assert sorted(k for k in out if k.startswith("encode")) == [f"encode {b} x {t}" for b in (1, 4) for t in (128, 16, 32)]
    assert seen[("encode", 4, 32)] == [[[2] * 30, [3] * 31, [2] * 30, [3] * 31]]  # that bucket's sentences, in turn
    assert seen[("encode", 1, 128)] == [[[4] * 100]] and ("encode", 1, 64) not in seen
    assert {k for k in out if not k.startswith("encode")} == {"first 1 x 32", "first 4 x 32", "decode 1 x 32",
                                                              "decode 4 x 32", "decode 1 x 64", "decode 4 x 64"}


def test_load_bench_runs_the_gpu_engine_of_a_config_file(tmp_path, monkeypatch):
    """``bench.tts_load --config FILE --set K=V``: the GPU engine is the one ``CudaTtsEngine.from_config``
    makes of that file with the overrides (as a server started with it), its rows named and tagged
    after them; the per-setting flags are refused beside ``--config``, ``--set`` without it. The GPU
    runner is a stand-in (no CUDA here): what is checked is which settings reach the engine."""
    pytest.importorskip("torch")
    from bench.instant_runner import InstantRunner
    from bench.tts_load import main
    from tts_engine.torch_vits.cuda_engine import CudaTtsEngine

    class Runner(InstantRunner):  # what the bench reports of a real runner's start-up: nothing captured
        capture_s, capture_peak_mb, stage_capture_s = 0.0, 0.0, {}
        encode_steps = decode_steps = flow_steps = {}

    built = []
    real = CudaTtsEngine.from_config.__func__

    def from_config(cls, cfg, runner=None):
        built.append(cfg)
        return real(cls, cfg, runner=lambda options: Runner(options, lambda ids: 120, 0.0005))

    monkeypatch.setattr(CudaTtsEngine, "from_config", classmethod(from_config))
    common = ["--backends", "cuda", "--concurrency", "2", "--duration", "0.4", "--warmup", "0.1", "--device", "cpu",
              "--out", str(tmp_path), "--hardware", "test", "--date", "d"]  # fmt: skip
    assert main(["--config", str(ROOT / "configs" / "gpu.toml"), "--set", "tts.fast_lanes=1", *common]) == 0
    (cfg,) = built
    assert cfg.tts.fast_lanes == 1 and cfg.tts.triton_kernels and cfg.tts.device == "cpu"  # the set's, the file's
    (row,) = json.loads((tmp_path / "tts_load-test-d.json").read_text())
    assert row["backend"] == "cuda-fp16-gpu-fast_lanes=1" and row["qps"] > 0
    assert row["sets"] == ["tts.fast_lanes=1"] and row["config"].endswith("gpu.toml")
    assert row["fast_lanes"] == 1 and row["precision"] == cfg.tts.precision
    assert row["allocator"] == cfg.gpu.allocator and row["max_batch"] == cfg.tts.max_batch
    for argv, message in ([["--config", "configs/gpu.toml", "--fused-attention"], "--fused-attention would not apply"],
                          [["--set", "tts.fast_lanes=1"], "--set needs --config"]):  # fmt: skip
        with pytest.raises(SystemExit):
            main([*argv, *common])
    assert len(built) == 1


def test_ws_load_bench_starts_the_server_with_the_config_file_and_its_sets(monkeypatch):
    """``--mode ws --config FILE --set K=V``: the server gets that file and each override as they are
    (not the per-setting flags' translation), and its rows the file's name and sets."""
    import argparse

    from bench import tts_load_ws

    started = []

    def start_server(port, server_args, timeout_s):
        started.append(server_args)
        raise KeyboardInterrupt  # stop before any process exists

    monkeypatch.setattr(tts_load_ws, "start_server", start_server)
    config = str(ROOT / "configs" / "gpu.toml")
    args = argparse.Namespace(config=config, sets=["tts.fast_lanes=1"], voice="/v.onnx",
                              server_arg=["--set=server.port_hint=1"])  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        tts_load_ws.WsBackend(args, "cuda", 50)
    (server_args,) = started
    assert server_args[:2] == ["--config", config]
    assert "--set=tts.fast_lanes=1" in server_args and "--set=tts.voice_path=/v.onnx" in server_args
    assert server_args[-1] == "--set=server.port_hint=1" and not any("fused_attention=" in a for a in server_args)


def test_the_set_as_text_follows_the_set():
    """``bench.turn_set.set_texts``: the turns ``bench.turn_taking.build_set`` makes, as text (``build_set`` asserts the
    same order): every paused turn's heads are the start of what it says, at its pauses."""
    from bench.turn_set import MIDPAUSE, SENTENCES, SHORT_ANSWERS
    from bench.turn_set import set_texts

    turns = set_texts()
    names = [t["name"] for t in turns]
    assert len(names) == len(set(names))
    kinds = {k: sum(t["kind"] == k for t in turns) for k in {t["kind"] for t in turns}}
    assert kinds["complete"] == kinds["paused"] == kinds["filler"] == len(SENTENCES)
    assert kinds["midpause"] == len(MIDPAUSE) and kinds["short"] == len(SHORT_ANSWERS)
    assert kinds["question"] + kinds["paused_question"] >= 10
    for t in turns:
        assert bool(t["heads"]) == (t["kind"] in ("paused", "filler", "midpause", "paused_question")), t
        for h in t["heads"]:
            assert t["text"].startswith(h.removesuffix(" um")) and len(h.removesuffix(" um")) < len(t["text"]), t
    assert {"name": "paused-6", "kind": "paused", "text": "How long does it take to boil an egg?",
            "heads": ["How long does it take"], "asked": None} in turns
    # a short answer comes after the assistant's question it answers; nothing else is asked
    assert [t["asked"] for t in turns if t["kind"] == "short"] == [q for _, q in SHORT_ANSWERS]
    assert all(t["asked"] is None for t in turns if t["kind"] != "short")


def test_words_threshold_counts_heads_held_and_turns_answered():
    """``bench.words_threshold.summarize``: a head is held under the threshold, a whole turn answered at
    or over it; a missing score (None) counts in neither."""
    from bench.words_threshold import summarize

    rows = [{"kind": "paused", "heads": [["How long does it take", 0.001]], "whole": 0.5},
            {"kind": "paused", "heads": [["Remind me to", 0.04]], "whole": 0.03},
            {"kind": "short", "heads": [], "whole": 0.02},
            {"kind": "short", "heads": [], "whole": None}]
    low, mid = summarize(rows, (0.01, 0.03))
    assert low == {"threshold": 0.01, "held_paused": "1/2", "answered_paused": "2/2", "answered_short": "1/1"}
    assert mid == {"threshold": 0.03, "held_paused": "1/2", "answered_paused": "2/2", "answered_short": "0/1"}
