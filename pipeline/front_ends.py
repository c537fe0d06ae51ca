"""``server.front_ends`` > 1: N WebSocket front-end processes sharing one GPU engine process.

One Python process cannot carry what one GPU makes: its event loop, the text front end, the
resampler and the GPU scheduler all share one GIL (bench/results/tts_load-h200-2026-12-01-one-front-end.md).
So ``voxloop serve`` with ``server.front_ends = N``:

* this process becomes the **engine process**: it loads the batching TTS engine (the GPU, its
  memory pool, the scheduler thread) and serves it on a Unix socket (``pipeline.engine_link``);
* it starts N **front-end processes** (spawned, so none inherits a CUDA context). Each binds the
  same port with SO_REUSEPORT (the kernel spreads new connections over them) and runs a full
  ``Hub``: HTTP routes, sessions, VAD/ASR/LLM if configured, the text front end, resampling and
  serialization. TTS requests go to the engine process; each GPU step comes back as one message
  per front end.
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

from voxloop.config import Config
from voxloop.errors import ConfigError

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
    procs = [ctx.Process(target=run_front_end, args=(cfg, engine_socket, shared, i), name=f"voxloop-front-end-{i}")
             for i in range(n)]
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    engine = host = None
    try:
        for p in procs:
            p.start()
        log.info("voxloop: %d front ends on port %d, loading the engine", n, cfg.server.port)
        engine, host = _load_engine(cfg, engine_socket)
        reserved.close()
        while not stop.wait(0.5):
            for p in procs:
                if p.exitcode is not None and not getattr(p, "_reported", False):
                    log.error("front end %s exited with code %s", p.name, p.exitcode)
                    p._reported = True  # type: ignore[attr-defined]
            if all(p.exitcode is not None for p in procs):
                return 1
        log.info("signal received: draining %d front ends", n)
        return _stop_front_ends(procs, cfg.server.shutdown_grace_s)
    finally:
        reserved.close()
        for p in procs:
            if p.is_alive():
                p.kill()
        if host is not None:
            host.close()
        if engine is not None:
            engine.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _load_engine(cfg: Config, engine_socket: str):  # noqa: ANN202 - (engine, EngineHost)
    from pipeline.engine_link import EngineHost
    from tts_engine.factory import create_engines

    t0 = time.monotonic()
    (engine,) = create_engines(cfg)  # the cuda backend: one engine object serves everything
    for _ in engine.synthesize("Warm up."):
        pass
    host = EngineHost(engine, engine_socket)
    log.info("engine loaded in %.1f s, serving front ends at %s", time.monotonic() - t0, engine_socket)
    return engine, host


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


def run_front_end(cfg: Config, engine_socket: str, shared, index: int) -> None:  # noqa: ANN001
    """Entry point of one front-end process."""
    import asyncio

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s front-end-{index} %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from pipeline import heap

    heap.limit_arenas()  # a spawned process starts with glibc's defaults; its Hub trims when idle
    asyncio.run(_front_end(cfg, engine_socket, shared))


async def _front_end(cfg: Config, engine_socket: str, shared) -> None:  # noqa: ANN001
    import asyncio

    from pipeline.engines import Engines
    from pipeline.hub import Hub

    engines = Engines(cfg)
    hub = Hub(cfg, engines, shared_sessions=shared)
    await hub.start()
    loader = asyncio.create_task(engines.load_front_end(engine_socket))
    serving = asyncio.create_task(hub.serve_until_signal())
    await asyncio.wait({loader, serving}, return_when=asyncio.FIRST_COMPLETED)
    if loader.done() and loader.exception() is not None:
        serving.cancel()
        await hub.stop(grace_s=0)
        raise loader.exception()
    await serving
