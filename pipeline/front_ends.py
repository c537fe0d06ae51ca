"""``server.front_ends`` > 1: N WebSocket front-end processes sharing one GPU engine process.

One Python process cannot carry what one GPU makes: its event loop, the text front end, the
resampler and the GPU scheduler all share one GIL (f80876f:bench/results/tts_load-h200-2026-12-01-one-front-end.md).
So ``voxloop serve`` with ``server.front_ends = N``:

* this process becomes the **engine process**: it loads the batching TTS engine (the GPU, its
  memory pool, the scheduler thread) and, when they run on the GPU (``server.engine_stages``), the
  ASR (utterances of every front end batched together) and the LLM (every front end's
  conversations in one continuous batch); it serves them on a Unix socket (``pipeline.engine_link``);
* it starts N **front-end processes** (spawned, so none inherits a CUDA context). Each binds the
  same port with SO_REUSEPORT (the kernel spreads new connections over them) and runs a full
  ``Hub``: HTTP routes, sessions, VAD, the text front end, resampling and serialization (and
  ASR/LLM when they run on the CPU). TTS, ASR and LLM requests go to the engine process; each GPU
  step (TTS) and each ``llama_decode`` step comes back as one message per front end.
* ``limits.max_sessions`` counts the sessions of all front ends (a shared counter); ``/metrics`` of
  any front end sums every front end (prometheus_client's multiprocess mode) and shows the engine
  process's GPU figures; ``/health`` answers from the start, ``/ready`` once the engine is loaded.
* SIGINT/SIGTERM: the front ends drain (``server.shutdown_grace_s``) and exit, then the engine
  process stops. A front end that dies is logged; the others keep serving.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time

from pipeline import gc_pauses
from base.config import Config
from base.errors import ConfigError

log = logging.getLogger(__name__)


def _reserve_port(host: str, port: int) -> socket.socket:
    """A bound (not listening) SO_REUSEPORT socket: the port the front ends will share, port 0 resolved."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def serve_front_ends(cfg: Config) -> int:
    """Run the engine process and its front ends until a signal; returns the exit code."""
    n = cfg.server.front_ends
    if cfg.tts.backend != "cuda":
        raise ConfigError(f"server.front_ends = {n} needs tts.backend = 'cuda' (the batching engine); "
                          "the CPU engine scales with server replicas instead")
    if not hasattr(socket, "SO_REUSEPORT") or not sys.platform.startswith("linux"):
        raise ConfigError("server.front_ends > 1 needs Linux (SO_REUSEPORT)")
    workdir = tempfile.mkdtemp(prefix="voxloop-")  # mode 0700: only this user reaches the engine socket
    engine_socket = os.path.join(workdir, "engine.sock")
    os.mkdir(os.path.join(workdir, "metrics"))
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.path.join(workdir, "metrics")  # inherited by the front ends
    reserved = _reserve_port(cfg.server.host, cfg.server.port)
    cfg = cfg.replace("server", port=reserved.getsockname()[1])
    ctx = mp.get_context("spawn")
    shared = ctx.Value("i", 0)
    loaded = ctx.Value("i", 0)
    from pipeline.engine_link import engine_stages

    # The LLM of engine_stages runs in a process of its own: a CUDA build of llama.cpp and PyTorch
    # in one process crashed on a CUDA 13 host (free(): invalid pointer), whichever loaded first.
    llm_socket = os.path.join(workdir, "llm.sock") if "llm" in engine_stages(cfg) else None
    procs = [ctx.Process(target=run_front_end, args=(cfg, engine_socket, llm_socket, shared, loaded, i),
                         name=f"voxloop-front-end-{i}")
             for i in range(n)]
    helpers = [] if llm_socket is None else [ctx.Process(target=run_llm_process, args=(cfg, llm_socket),
                                                         name="voxloop-llm")]
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    engine = host = None
    try:
        for p in procs + helpers:
            p.start()
        log.info("voxloop: %d front ends on port %d%s, loading the engine", n, cfg.server.port,
                 ", an LLM process" if llm_socket else "")
        engine, host = _load_engine(cfg, engine_socket)
        reserved.close()
        while not stop.wait(0.5):
            for p in procs + helpers:
                if p.exitcode is not None and not getattr(p, "_reported", False):
                    log.error("%s exited with code %s", p.name, p.exitcode)
                    p._reported = True  # type: ignore[attr-defined]
            if all(p.exitcode is not None for p in procs):
                return 1
            if any(p.exitcode is not None for p in helpers):
                # Every reply needs the LLM process: without it the server would accept sessions
                # it cannot answer. Stop, so that a supervisor (systemd, Docker) starts it again.
                log.error("the LLM process is gone: stopping the server (exit code 1)")
                _stop_front_ends(procs, cfg.server.shutdown_grace_s)
                return 1
        log.info("signal received: draining %d front ends", n)
        code = _stop_front_ends(procs, cfg.server.shutdown_grace_s)
        return max(code, _stop_front_ends(helpers, 0))  # the LLM process after the front ends drained
    finally:
        reserved.close()
        for p in procs + helpers:
            if p.is_alive():
                p.kill()
        if host is not None:
            host.close()
        if engine is not None:
            for stage in (engine.asr, engine.llm, engine.tts):
                if stage is not None:
                    stage.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _load_engine(cfg: Config, engine_socket: str):  # noqa: ANN202 - (Engines, EngineHost)
    """The engine process's stages: the batching TTS engine and, per ``engine_stages``, ASR and LLM."""
    from pipeline.engine_link import EngineHost, engine_stages
    from pipeline.engines import Engines
    from tts_engine.factory import create_engines

    t0 = time.monotonic()
    (tts,) = create_engines(cfg)  # the cuda backend: one engine object serves everything
    for _ in tts.synthesize("Warm up."):
        pass
    engines = Engines(cfg)
    stages = tuple(s for s in engine_stages(cfg) if s != "llm")  # the LLM has its own process
    engines._set_asr_llm(engines.load_asr_model() if "asr" in stages else None, None)
    engines.tts = tts
    # Before the front ends can reach the engine: gc_freeze's own full collection of what loading
    # left (0.7 s with the TTS decoder compiled, 52aa769:bench/results/tts_load-h200-2026-12-03-compile-gcfreeze.json)
    # must not hold their first requests.
    gc_pauses.manage(cfg, "engine process", lambda: tts.scheduler.in_flight > 0
                     or (engines.asr is not None and engines.asr.pending() > 0))
    host = EngineHost(tts, engine_socket, asr=engines.asr, llm=engines.llm)
    log.info("engine process (%s) loaded in %.1f s, serving front ends at %s", ", ".join(("tts", *stages)),
             time.monotonic() - t0, engine_socket)
    return engines, host


def _stop_front_ends(procs: list, grace_s: float) -> int:
    for p in procs:
        if p.is_alive():
            os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s + 10
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    codes = [p.exitcode for p in procs]
    log.info("front ends stopped: exit codes %s", codes)
    return 0 if all(c == 0 for c in codes) else 1


def run_llm_process(cfg: Config, llm_socket: str) -> None:
    """Entry point of the LLM process (``engine_stages`` has "llm"): one ``BatchedChat`` for every
    front end's conversations, served like the engine process's stages (``EngineHost``)."""
    try:  # before numpy: a CUDA build of llama.cpp loaded after numpy crashed loading the model
        import llama_cpp  # noqa: F401
    except ImportError:
        pass  # BatchedChat says what to install
    logging.basicConfig(level=logging.INFO, format="%(asctime)s llm %(levelname)s %(name)s: %(message)s")
    from pipeline.engine_link import EngineHost
    from pipeline.engines import Engines

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    engines = Engines(cfg)
    engines._set_asr_llm(None, engines.load_llm_model())
    host = EngineHost(None, llm_socket, llm=engines.llm)
    gc_pauses.manage(cfg, "LLM process", lambda: engines.llm.pending() > 0)
    parent = os.getppid()
    while not stop.wait(0.5) and os.getppid() == parent:  # ends with the engine process
        pass
    host.close()
    engines.llm.close()


def run_front_end(cfg: Config, engine_socket: str, llm_socket: str | None, shared, loaded,  # noqa: ANN001
                  index: int) -> None:
    """Entry point of one front-end process."""
    import asyncio

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s front-end-{index} %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from pipeline import heap

    heap.limit_arenas()  # a spawned process starts with glibc's defaults; its Hub trims when idle
    asyncio.run(_front_end(cfg, engine_socket, llm_socket, shared, loaded))


async def _front_end(cfg: Config, engine_socket: str, llm_socket: str | None, shared, loaded) -> None:  # noqa: ANN001
    import asyncio

    from pipeline.engines import Engines
    from pipeline.hub import Hub

    engines = Engines(cfg)
    hub = Hub(cfg, engines, shared_sessions=shared, shared_loaded=loaded)
    await hub.start()

    async def load() -> None:
        await engines.load_front_end(engine_socket, llm_socket)
        gc_pauses.manage(cfg, "front end", lambda: any(hub.stage_depths().values()))
        with loaded.get_lock():
            loaded.value += 1

    loader = asyncio.create_task(load())
    serving = asyncio.create_task(hub.serve_until_signal())
    orphaned = asyncio.create_task(_engine_process_gone())
    await asyncio.wait({loader, serving, orphaned}, return_when=asyncio.FIRST_COMPLETED)
    if loader.done() and loader.exception() is not None:
        orphaned.cancel()
        serving.cancel()
        await hub.stop(grace_s=0)
        raise loader.exception()
    await asyncio.wait({serving, orphaned}, return_when=asyncio.FIRST_COMPLETED)
    if orphaned.done():
        # The engine process died without stopping us (SIGKILL, a crash): its GPU stages are gone,
        # and a listener left on the shared port would take connections from the next server.
        serving.cancel()
        await hub.stop(grace_s=0)
        raise SystemExit(1)
    orphaned.cancel()
    await serving


async def _engine_process_gone() -> None:
    """Returns once this front end's parent (the engine process) has died: the process is re-parented."""
    import asyncio

    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(0.5)
    log.error("the engine process (pid %d) is gone: stopping this front end", parent)
